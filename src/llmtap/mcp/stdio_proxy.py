"""`llmtap mcp-proxy -- CMD ...`: run an MCP server on stdio and pass every byte both ways, recording calls.

One asyncio task per direction reads a chunk, lets the recorder look at a copy (and persist the
records that chunk finishes, so a call is on disk before its answer is released), then writes
the chunk on unchanged: bytes are never re-framed, re-encoded or held back for a newline. The
server's stderr is its own (inherited). Signals sent to llmtap are forwarded to the server, and
the server's exit status becomes llmtap's (a signal death as 128 + signal number, as shells do).

How a session ends, so no direction is ever left half-dead:
- the client closes its stdin: the server's stdin is closed, and its remaining output still flows
  until it exits (the MCP stdio shutdown);
- the server closes its stdout or exits: reading the client stops and llmtap exits with its code;
- a write fails on either side (a peer gone): both directions stop, the server's stdin is closed,
  and a server that does not exit within `grace_s` gets SIGTERM, then SIGKILL.
Requests still open at the end are recorded as failed when the server exited with an error or a
signal, as incomplete when it exited cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
import threading
from collections.abc import Awaitable, Callable, Sequence

from .framing import DEFAULT_MAX_MESSAGE_BYTES, LineFramer
from .pairing import CLIENT_TO_SERVER, SERVER_TO_CLIENT, Direction, Pairing, SessionIdentity
from .recorder import Recorder

__all__ = ["proxy_stdio", "run_stdio_proxy"]

CHUNK_BYTES = 256 * 1024
_FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)

Read = Callable[[], Awaitable[bytes]]
Write = Callable[[bytes], Awaitable[None]]


class _PeerWriteError(Exception):
    """A write to one side failed: that peer is gone, and the session ends."""


def _is_stream(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode)


async def _fd_reader(fd: int) -> tuple[Read, Callable[[], None]]:
    """Reads of `fd` as a coroutine: an asyncio pipe for pipes, sockets and ttys, a daemon thread otherwise."""
    loop = asyncio.get_running_loop()
    if _is_stream(fd):
        reader = asyncio.StreamReader(limit=CHUNK_BYTES, loop=loop)
        was_blocking = os.get_blocking(fd)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader, loop=loop), os.fdopen(fd, "rb", buffering=0, closefd=False)
        )

        def close() -> None:
            transport.close()
            with contextlib.suppress(OSError):
                os.set_blocking(fd, was_blocking)

        return (lambda: reader.read(CHUNK_BYTES)), close
    queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=4)

    def pump() -> None:  # a regular file: reads never wait on a peer, so a thread is enough
        while True:
            try:
                chunk = os.read(fd, CHUNK_BYTES)
            except OSError:
                chunk = b""
            asyncio.run_coroutine_threadsafe(queue.put(chunk), loop).result()
            if not chunk:
                return

    threading.Thread(target=pump, name="llmtap-mcp-stdin", daemon=True).start()
    return queue.get, lambda: None


async def _fd_writer(fd: int) -> tuple[Write, Callable[[], None]]:
    """Writes to `fd` as a coroutine that waits for the peer to take them (drain)."""
    loop = asyncio.get_running_loop()
    if _is_stream(fd):
        was_blocking = os.get_blocking(fd)
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(fd, "wb", buffering=0, closefd=False)
        )
        writer = asyncio.StreamWriter(transport, protocol, None, loop)

        async def write(chunk: bytes) -> None:
            if transport.is_closing():
                raise BrokenPipeError("the client's stdout is closed")
            writer.write(chunk)
            await writer.drain()

        def close() -> None:
            transport.close()
            with contextlib.suppress(OSError):
                os.set_blocking(fd, was_blocking)

        return write, close

    async def write_file(chunk: bytes) -> None:
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view) :]

    return write_file, lambda: None


class _StdioSession:
    """One proxied server process and the two pumps between it and the client."""

    def __init__(self, recorder: Recorder, identity: SessionIdentity, max_message_bytes: int, grace_s: float) -> None:
        self.recorder = recorder
        self.pairing = Pairing(identity)
        self.max_message_bytes = max_message_bytes
        self.grace_s = grace_s

    async def pump(self, direction: Direction, read: Read, write: Write) -> None:
        """Forward chunks until EOF; a failed write raises `_PeerWriteError`, a failed read ends like EOF."""
        framer = LineFramer(self.max_message_bytes)
        recorder = self.recorder
        while True:
            try:
                chunk = await read()
            except (OSError, ValueError):
                chunk = b""
            if not chunk:
                await recorder.persist(recorder.observe_end(framer, self.pairing, direction))
                return
            finished = recorder.observe_lines(framer, self.pairing, direction, chunk)
            if finished:
                await recorder.persist(finished)
            try:
                await write(chunk)
            except (OSError, RuntimeError, ValueError) as exc:
                raise _PeerWriteError(direction) from exc


async def proxy_stdio(
    command: Sequence[str],
    *,
    recorder: Recorder,
    identity: SessionIdentity | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    client_in: int = 0,
    client_out: int = 1,
    grace_s: float = 5.0,
) -> int:
    """Run `command` as an MCP stdio server between `client_in`/`client_out` and it; return its exit code.

    Raises OSError when the command cannot be started (nothing has been forwarded then).
    """
    session = _StdioSession(recorder, identity or SessionIdentity("stdio"), max_message_bytes, grace_s)
    process = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert process.stdin is not None and process.stdout is not None
    server_in, server_out = process.stdin, process.stdout
    loop = asyncio.get_running_loop()
    for signum in _FORWARDED_SIGNALS:
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.add_signal_handler(signum, _forward, process, signum)

    async def write_server(chunk: bytes) -> None:
        server_in.write(chunk)
        await server_in.drain()

    read_client, close_reader = await _fd_reader(client_in)
    write_client, close_writer = await _fd_writer(client_out)
    upstream = asyncio.create_task(session.pump(CLIENT_TO_SERVER, read_client, write_server))
    downstream = asyncio.create_task(session.pump(SERVER_TO_CLIENT, lambda: server_out.read(CHUNK_BYTES), write_client))
    exited = asyncio.create_task(process.wait())
    try:
        await _until_session_ends(session, process, upstream, downstream, exited)
        code = await exited
    finally:
        for task in (upstream, downstream):
            task.cancel()
        for signum in _FORWARDED_SIGNALS:
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
                loop.remove_signal_handler(signum)
        close_reader()
        close_writer()
    status = "incomplete" if code == 0 else "failed"  # a server that died with calls open failed them
    await recorder.persist(session.pairing.close_all("server_exited", {"exit_code": code}, status=status))
    return code if code >= 0 else 128 - code


async def _until_session_ends(
    session: _StdioSession,
    process: asyncio.subprocess.Process,
    upstream: asyncio.Task[None],
    downstream: asyncio.Task[None],
    exited: asyncio.Task[int],
) -> None:
    """Drive the shutdown rules in the module docstring."""
    assert process.stdin is not None
    peer_gone = False
    pending: set[asyncio.Task[object]] = {upstream, downstream, exited}
    while True:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if upstream in done:
            peer_gone = peer_gone or _failed(upstream)
            with contextlib.suppress(OSError, RuntimeError):
                process.stdin.close()  # the client is done (or the server's stdin is): let the server finish
        if downstream in done:
            if _failed(downstream):
                peer_gone = True
            upstream.cancel()
            break
        if exited in done:
            # The server exited: give its last output a moment to drain, then stop.
            with contextlib.suppress(TimeoutError, asyncio.CancelledError, _PeerWriteError):
                await asyncio.wait_for(asyncio.shield(downstream), session.grace_s)
            upstream.cancel()
            downstream.cancel()
            return
        if peer_gone:
            break
    upstream.cancel()
    with contextlib.suppress(OSError, RuntimeError):
        process.stdin.close()
    await _stop(process, exited, session.grace_s if peer_gone else None)


async def _stop(process: asyncio.subprocess.Process, exited: asyncio.Task[int], grace_s: float | None) -> None:
    """Wait for the server; after `grace_s` (if given) send SIGTERM, and SIGKILL after as long again."""
    if grace_s is None:
        await asyncio.shield(exited)
        return
    for signum in (signal.SIGTERM, signal.SIGKILL):
        try:
            await asyncio.wait_for(asyncio.shield(exited), grace_s)
            return
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)
    await asyncio.shield(exited)


def _failed(task: asyncio.Task[None]) -> bool:
    return not task.cancelled() and task.exception() is not None


def _forward(process: asyncio.subprocess.Process, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signum)


def run_stdio_proxy(
    command: Sequence[str],
    *,
    recorder: Recorder,
    identity: SessionIdentity | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> int:
    """Run `proxy_stdio` on this process's stdin and stdout in a new event loop; return the server's exit code.

    The recorder is closed (its writes waited for) before returning.

    >>> run_stdio_proxy(["python", "server.py"], recorder=Recorder(None))  # doctest: +SKIP
    """
    try:
        return asyncio.run(
            proxy_stdio(command, recorder=recorder, identity=identity, max_message_bytes=max_message_bytes)
        )
    finally:
        recorder.close()
