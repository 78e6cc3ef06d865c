"""A fault-injecting upstream: the ways a real model server fails, on loopback.

A fault is chosen by a path prefix, so it works with real SDK clients that append their own
path to a base URL::

    openai.OpenAI(base_url=faults.url("reset-after-3") + "/v1", max_retries=0)
    # the SDK then calls /fault/reset-after-3/v1/chat/completions

or, for a path without that prefix, by the header `x-fault: <fault>`. The faults:

| fault                 | answer                                                                        |
|-----------------------|-------------------------------------------------------------------------------|
| `ok`                  | the normal answer (below), whole                                              |
| `status-<code>`       | status `<code>` (500, 429, 401, ...) with a JSON error body shaped like the   |
|                       | API's own (Anthropic's for paths ending `/messages`, OpenAI's otherwise)      |
| `reset-after-<n>`     | the normal answer's first `n` pieces, then a TCP reset (RST, SO_LINGER 0)     |
| `close-after-<n>`     | the normal answer's first `n` pieces, then an abrupt close (FIN) with the     |
|                       | body unfinished                                                               |
| `stall-first-<s>`     | waits `s` seconds (a decimal) before the first byte, then the normal answer   |
| `stall-between-<s>`   | the normal answer with `s` seconds between pieces                             |
| `stall-last-<s>`      | the normal answer with `s` seconds before its last piece (a stream's `[DONE]`, |
|                       | `message_stop` or `response.completed`): the answer is in, its end is not      |
| `bomb-<coding>-<mib>` | 200 `application/json` with `content-encoding: <coding>` (gzip, deflate, br,  |
|                       | zstd) whose body decodes to `<mib>` MiB of zeros: a decompression bomb         |
| `no-terminal`         | 200 SSE: the stream recording without its last event (`[DONE]`,              |
|                       | `response.completed`, `message_stop`), ended cleanly                          |
| `not-json`            | 200 `application/json` whose body is not JSON                                 |
| `set-cookie`          | the normal answer with a `set-cookie` header, as load balancers send (a proxy |
|                       | must pass it to its client, never keep it for the next caller)               |
| `stale-keep-alive`    | the normal answer on a kept-alive connection; the next request on it is reset |
|                       | unanswered: what a client meets when it reuses a connection the server closed |
|                       | while it sat idle (uvicorn closes idle ones after 5 s)                        |

The normal answer is a recorded real exchange for the remaining path (`/v1/chat/completions`,
`/v1/responses`, `/v1/messages`): its stream recording when the request body has
`"stream": true`, else its JSON one (see `DEFAULT_FIXTURES`); the header
`x-fault-fixture: <dialect>/<name>` picks another. A stream's pieces are its SSE events, sent as
HTTP chunks; a JSON body's pieces are four byte ranges of it, sent under its full content-length.
`no-terminal` always answers with a stream.

Every response but `stale-keep-alive`'s says `connection: close`, and every request is kept in
`received`. The server is
a raw asyncio server (so it can reset a connection), run on its own loop in a daemon thread.
`refused_port()` gives a port nobody listens on, for refused connections.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import socket
import struct
import threading
import zlib
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from tests.fixtures import RecordedExchange, fixture
from tests.support.servers import LOOPBACK, StopsOnExit, bound_socket, free_port

__all__ = [
    "DEFAULT_FIXTURES",
    "FAULT_FIXTURE_HEADER",
    "FAULT_HEADER",
    "Fault",
    "FaultUpstream",
    "ReceivedFault",
    "bomb",
    "parse_fault",
    "refused_port",
    "send_head_slowly",
    "sse_events",
]

FAULT_HEADER = "x-fault"
FAULT_FIXTURE_HEADER = "x-fault-fixture"

# (path suffix, stream?) -> the recording that is the normal answer there.
DEFAULT_FIXTURES: dict[tuple[str, bool], str] = {
    ("/chat/completions", True): "chat/text-stream-no-usage-gpt4",
    ("/chat/completions", False): "chat/text-basic-gpt4o",
    ("/responses", True): "responses/text-basic-stream-gpt55",
    ("/responses", False): "responses/text-basic-gpt55",
    ("/messages", True): "messages/text-stream-sonnet45",
    ("/messages", False): "messages/text-basic-sonnet4",
}

NOT_JSON_BODY = b"<html><body>upstream hiccup: this body is not JSON</body></html>\n"

_FAULT_PATH = re.compile(r"^/fault/([^/]+)(/.*)?$")
_FAULT_SPEC = re.compile(
    r"^(?:(?P<plain>ok|no-terminal|not-json|set-cookie|stale-keep-alive)"
    r"|status-(?P<status>[1-5]\d\d)"
    r"|(?P<cut>reset|close)-after-(?P<count>\d+)"
    r"|stall-(?P<stall>first|between|last)-(?P<seconds>\d+(?:\.\d+)?)"
    r"|bomb-(?P<coding>gzip|deflate|br|zstd)-(?P<mib>\d+))$"
)
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_JSON_PIECES = 4

# status -> (OpenAI error type, Anthropic error type)
_ERROR_TYPES: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "invalid_request_error"),
    401: ("invalid_request_error", "authentication_error"),
    403: ("invalid_request_error", "permission_error"),
    404: ("invalid_request_error", "not_found_error"),
    429: ("requests", "rate_limit_error"),
    529: ("server_error", "overloaded_error"),
}


@dataclass(frozen=True)
class Fault:
    """One parsed fault: its kind and its number (status code, piece count or seconds)."""

    kind: str
    number: float = 0


@dataclass(frozen=True)
class ReceivedFault:
    """One request as the fault upstream received it; `path` is the request target, query included."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


def parse_fault(spec: str) -> Fault:
    """Parse a fault name such as `reset-after-3`; raises ValueError naming the bad name."""
    found = _FAULT_SPEC.match(spec)
    if found is None:
        raise ValueError(f"Fault {spec!r} is not known; use one listed in tests/support/faults.py.")
    if found["plain"]:
        return Fault(found["plain"])
    if found["status"]:
        return Fault("status", int(found["status"]))
    if found["cut"]:
        return Fault(f"{found['cut']}-after", int(found["count"]))
    if found["coding"]:
        return Fault(f"bomb-{found['coding']}", int(found["mib"]))
    return Fault(f"stall-{found['stall']}", float(found["seconds"]))


def sse_events(body: bytes) -> list[bytes]:
    """Split an event stream after each blank line; the parts join back to `body`."""
    events: list[bytes] = []
    start = 0
    for end in _EVENT_END.finditer(body):
        events.append(body[start : end.end()])
        start = end.end()
    if start < len(body):
        events.append(body[start:])
    return events


def refused_port() -> int:
    """A loopback port nobody listens on, so connecting to it is refused."""
    return free_port()


class _NotServed(Exception):
    """Raised when a request names no fault, an unknown fault or no recording."""


@dataclass(frozen=True)
class _Answer:
    status: int
    content_type: str
    pieces: list[bytes]
    is_stream: bool
    encoding: str | None = None


class FaultUpstream(StopsOnExit):
    """Serves the faults listed in the module docstring from a raw asyncio server.

    Usage::

        with FaultUpstream().start() as faults:
            httpx.post(faults.url("status-500") + "/v1/chat/completions", json={})
    """

    def __init__(self, *, reset_pause: float = 0.05) -> None:
        # reset_pause: how long the pieces before a reset get to reach the client, so the
        # client reliably reads them before it meets the reset.
        self.reset_pause = reset_pause
        self.received: list[ReceivedFault] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self.port = 0

    # --- hosting ---------------------------------------------------------------------------

    def start(self, port: int = 0, timeout: float = 10.0) -> FaultUpstream:
        """Serve on loopback from a daemon thread; returns self once connections are accepted."""
        if self._thread is not None:
            raise RuntimeError("This fault upstream is already running; stop it before starting it again.")
        sock = bound_socket(port)
        self.port = sock.getsockname()[1]
        loop = asyncio.new_event_loop()
        self._loop = loop
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            self._server = loop.run_until_complete(asyncio.start_server(self._handle, sock=sock))
            ready.set()
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=serve, name=f"fault-upstream-{self.port}", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise TimeoutError(f"The fault upstream on port {self.port} did not start within {timeout} s.")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Close the listener, cancel open responses and join the thread; safe to call twice."""
        if self._loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        self._loop = None
        self._thread = None

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    @property
    def base_url(self) -> str:
        if self._thread is None:
            raise RuntimeError("This fault upstream is not running; call start() first.")
        return f"http://{LOOPBACK}:{self.port}"

    def url(self, fault: str) -> str:
        """The base URL that selects `fault`; append the API path (SDKs append it themselves)."""
        parse_fault(fault)
        return f"{self.base_url}/fault/{fault}"

    @property
    def request_count(self) -> int:
        return len(self.received)

    def reset(self) -> None:
        """Forget the requests received so far."""
        self.received.clear()

    # --- one connection, one request -----------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            request = await _read_request(reader)
            if request is None:
                return
            self.received.append(request)
            if await self._respond(request, writer) == "stale-keep-alive":
                await self._reset_the_next_request(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the client left or sent garbage; nothing to answer
        except asyncio.CancelledError:
            writer.transport.abort()
        finally:
            self._handlers.discard(task)
            if not writer.transport.is_closing():
                writer.close()

    async def _reset_the_next_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await _read_request(reader)
        if request is not None:
            self.received.append(request)
            reset_connection(writer)

    async def _respond(self, request: ReceivedFault, writer: asyncio.StreamWriter) -> str | None:
        """Answer `request`; return the kind of fault answered (None for a request naming none)."""
        try:
            fault, api_path = _select_fault(request)
            answer = _answer_for(fault, api_path, request)
        except (_NotServed, ValueError) as problem:
            body = json.dumps({"error": {"type": "fault_not_served", "message": str(problem)}}).encode()
            writer.write(_head(404, "application/json", len(body)) + body)
            await writer.drain()
            return None
        if fault.kind == "stall-first":
            await asyncio.sleep(fault.number)
        length = None if answer.is_stream else sum(len(piece) for piece in answer.pieces)
        writer.write(
            _head(answer.status, answer.content_type, length, cookie=fault.kind == "set-cookie",
                  keep_alive=fault.kind == "stale-keep-alive", encoding=answer.encoding)
        )
        pieces = answer.pieces
        if fault.kind in ("reset-after", "close-after"):
            pieces = pieces[: int(fault.number)]
        for index, piece in enumerate(pieces):
            if (index and fault.kind == "stall-between") or (fault.kind == "stall-last" and index == len(pieces) - 1):
                await asyncio.sleep(fault.number)
            writer.write(_chunk(piece) if answer.is_stream else piece)
            await writer.drain()
        if fault.kind == "reset-after":
            await asyncio.sleep(self.reset_pause)
            reset_connection(writer)
            return fault.kind
        if fault.kind == "close-after":
            await asyncio.sleep(self.reset_pause)
            writer.close()
            return fault.kind
        if answer.is_stream:
            writer.write(b"0\r\n\r\n")
        await writer.drain()
        return fault.kind


def _select_fault(request: ReceivedFault) -> tuple[Fault, str]:
    path = request.path.partition("?")[0]  # `received` keeps the whole target, query and all
    found = _FAULT_PATH.match(path)
    if found is not None:
        return parse_fault(found[1]), found[2] or "/"
    named = request.headers.get(FAULT_HEADER)
    if named is not None:
        return parse_fault(named), path
    raise _NotServed(
        f"The request to {request.path!r} names no fault; prefix the path with /fault/<fault>/ "
        f"or send the {FAULT_HEADER} header."
    )


def _answer_for(fault: Fault, api_path: str, request: ReceivedFault) -> _Answer:
    if fault.kind == "status":
        status = int(fault.number)
        return _Answer(status, "application/json", [_error_body(status, api_path)], is_stream=False)
    if fault.kind == "not-json":
        return _Answer(200, "application/json", [NOT_JSON_BODY], is_stream=False)
    if fault.kind.startswith("bomb-"):
        coding = fault.kind.removeprefix("bomb-")
        return _Answer(200, "application/json", [bomb(coding, int(fault.number))], is_stream=False, encoding=coding)
    wants_stream = fault.kind == "no-terminal" or _asks_for_stream(request.body)
    recorded = _recording_for(api_path, wants_stream, request.headers.get(FAULT_FIXTURE_HEADER))
    body = recorded.body_bytes
    if recorded.is_stream:
        events = sse_events(body)
        if fault.kind == "no-terminal":
            events = events[:-1]
        return _Answer(recorded.status, recorded.content_type, events, is_stream=True)
    if fault.kind == "no-terminal":
        raise _NotServed(f"Fault 'no-terminal' needs a stream recording, but {recorded.id!r} is JSON.")
    size = -(-len(body) // _JSON_PIECES)
    pieces = [body[start : start + size] for start in range(0, len(body), size)]
    return _Answer(recorded.status, recorded.content_type, pieces, is_stream=False)


def _asks_for_stream(body: bytes) -> bool:
    try:
        parsed: Any = json.loads(body)
    except ValueError:
        return False
    return isinstance(parsed, dict) and parsed.get("stream") is True


def _recording_for(api_path: str, stream: bool, named: str | None) -> RecordedExchange:
    if named is not None:
        try:
            return fixture(named)
        except KeyError:
            raise _NotServed(f"Fixture {named!r} named by {FAULT_FIXTURE_HEADER} does not exist.") from None
    for (suffix, is_stream), fixture_id in DEFAULT_FIXTURES.items():
        if is_stream == stream and api_path.endswith(suffix):
            return fixture(fixture_id)
    raise _NotServed(
        f"No recording answers {api_path!r}; use a path ending in /chat/completions, /responses or "
        f"/messages, or name one with the {FAULT_FIXTURE_HEADER} header."
    )


def _error_body(status: int, api_path: str) -> bytes:
    openai_type, anthropic_type = _ERROR_TYPES.get(status, ("server_error", "api_error"))
    message = f"Injected fault: the upstream answered status {status}."
    error: dict[str, Any]
    if api_path.endswith("/messages"):
        error = {"type": "error", "error": {"type": anthropic_type, "message": message}}
    else:
        error = {"error": {"message": message, "type": openai_type, "param": None, "code": None}}
    return json.dumps(error).encode("utf-8")


SET_COOKIE = "lb_session=injected-by-upstream; Path=/; HttpOnly"


def reset_connection(writer: asyncio.StreamWriter) -> None:
    """Drop the connection with a TCP reset (RST, SO_LINGER 0), not a clean close."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _head(
    status: int, content_type: str, length: int | None, *, cookie: bool = False, keep_alive: bool = False,
    encoding: str | None = None,
) -> bytes:
    lines = [
        f"HTTP/1.1 {status} {_reason(status)}",
        f"content-type: {content_type}",
        *([f"content-encoding: {encoding}"] if encoding else []),
        *([] if keep_alive else ["connection: close"]),
        ("transfer-encoding: chunked" if length is None else f"content-length: {length}"),
        *([f"set-cookie: {SET_COOKIE}"] if cookie else []),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error" if status >= 400 else "OK"


def _chunk(piece: bytes) -> bytes:
    return f"{len(piece):x}\r\n".encode("ascii") + piece + b"\r\n"


async def _read_request(reader: asyncio.StreamReader) -> ReceivedFault | None:
    """Read one HTTP/1.1 request with a content-length body (all the SDKs send one)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    method, target, _version = request_line.split(" ", 2)
    headers: dict[str, str] = {}
    for line in header_lines:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = await reader.readexactly(length) if length else b""
    return ReceivedFault(method, target, headers, body)


_BOMB_PIECE = bytes(1024 * 1024)


@functools.cache
def bomb(coding: str, mib: int) -> bytes:
    """A body in `coding` (gzip, deflate, br or zstd) that decodes to `mib` MiB of zeros, built a MiB at a time."""
    if coding in ("gzip", "deflate"):
        compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS if coding == "gzip" else zlib.MAX_WBITS)
        return b"".join(compressor.compress(_BOMB_PIECE) for _ in range(mib)) + compressor.flush()
    if coding == "br":
        import brotli

        encoder = brotli.Compressor(quality=5)
        return b"".join(encoder.process(_BOMB_PIECE) for _ in range(mib)) + encoder.finish()
    if coding == "zstd":
        import zstandard

        zstd = zstandard.ZstdCompressor(level=3).compressobj()
        return b"".join(zstd.compress(_BOMB_PIECE) for _ in range(mib)) + zstd.flush()
    raise ValueError(f"Bomb coding {coding!r} is not one of gzip, deflate, br, zstd.")


def send_head_slowly(port: int, head: bytes, interval_s: float) -> tuple[int, bytes]:
    """Send a request head to 127.0.0.1:`port` one byte every `interval_s` seconds (slowloris), until
    it is all sent or the server answers or closes; return how many bytes went out and what came back."""
    with socket.create_connection((LOOPBACK, port), timeout=30) as sock:
        sent = 0
        for byte in head:
            try:
                sock.sendall(bytes([byte]))
            except OSError:  # the server closed the connection
                break
            sent += 1
            sock.settimeout(interval_s)
            try:
                answer = sock.recv(65536)
            except TimeoutError:
                continue  # nothing yet: send the next byte
            except OSError:
                return sent, b""
            sock.settimeout(30)
            return sent, answer + _read_to_close(sock)
        sock.settimeout(30)
        return sent, _read_to_close(sock)


def _read_to_close(sock: socket.socket) -> bytes:
    received = b""
    while True:
        try:
            piece = sock.recv(65536)
        except OSError:
            return received
        if not piece:
            return received
        received += piece
