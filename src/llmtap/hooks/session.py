"""The active capture: which capture a call belongs to, and how its record reaches the store.

A call is bound, when it is *opened*, to the capture active at that moment: the one set for the
current context by `llmtap.capture()` (a context variable, so threads and asyncio tasks keep
their own), else the process-wide capture that `llmtap run` starts in every Python process. A
stream may end much later, in another task, after that capture has closed: its record is then
dropped and counted against the capture that lost it, never filed into whichever capture happens
to be running.

Where a finished call goes:

- Under `llmtap run` (a session with a `spool`): the call is written as one frame to this
  process's spool file before the call returns (one `writev`, no thread, no lock, no fsync), and
  the recorder process builds its record. Nothing is parsed here, and a process that ends by
  `os._exit`, SIGTERM or SIGKILL keeps every call that had finished (the page cache holds them).
  Counts of what went wrong here are reported in the same file.
- Under `llmtap.capture()`, records are built (JSON parsing, stream reassembly) off the caller's
  path, in one of two durability modes. `background`: the hook hands the finished call to a
  writer thread and returns at once; the capture's close (and process exit) waits for every
  record to be durable. `call` (forked children, which often end in `os._exit`): the record is
  durable before the call returns.

Nothing here ever raises into the workload: failures are counted in the capture's health and
logged once (event, hook, exception type; never a message, which could quote a prompt).
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping

from ..capsule.spool import KIND_HEALTH, SpoolWriter, encode_frame, encode_meta
from ..correlation.ids import MAX_ROLLOUT_ID_LENGTH, ROLLOUT_ID_PATTERN, ROLLOUT_PREFIX
from ..exchange import Exchange, safe_headers
from ..health import CaptureHealth
from .registry import EndpointMatch, UrlRegistry
from .writer import WARM_UP_WAIT, RecordWriter, encode_call, register_exit_flush, warm_up, writing_module, writing_ready

if TYPE_CHECKING:
    from ..store import CaptureStore

__all__ = [
    "DEFAULT_ROLLOUT_ID",
    "CaptureSession",
    "CapturedCall",
    "Durability",
    "active_process_session",
    "active_session",
    "open_call",
    "set_process_session",
    "use_session",
]

DEFAULT_ROLLOUT_ID = "default"
Durability = Literal["background", "call"]

_CONTEXT_SESSION: ContextVar[CaptureSession | None] = ContextVar("llmtap_capture_session", default=None)
_PROCESS_SESSION: CaptureSession | None = None
_SESSIONS: weakref.WeakSet[CaptureSession] = weakref.WeakSet()


def active_session() -> CaptureSession | None:
    """The capture a call opened now belongs to, or None when nothing captures."""
    session = _CONTEXT_SESSION.get()
    if session is None:
        session = _PROCESS_SESSION
    if session is None or session.closed:
        return None
    return session


def active_process_session() -> CaptureSession | None:
    """The process-wide capture, if one is set and still open."""
    session = _PROCESS_SESSION
    return session if session is not None and not session.closed else None


def set_process_session(session: CaptureSession | None) -> None:
    """Make `session` the process-wide capture (what `llmtap run` does in each process)."""
    global _PROCESS_SESSION
    _PROCESS_SESSION = session


def use_session(session: CaptureSession | None) -> Any:
    """Make `session` the capture of the current context; returns the token to reset it with."""
    return _CONTEXT_SESSION.set(session)


def reset_session(token: Any) -> None:
    """Undo `use_session`."""
    _CONTEXT_SESSION.reset(token)


def _explicit_rollout_id() -> str | None:
    # `llmtap.rollout()` and `rollout_context()` live in llmtap.correlation.rollout; if nobody
    # imported it, nobody set a rollout, and the hot path never pays for importing it.
    correlation = sys.modules.get("llmtap.correlation.rollout")
    return correlation.current_rollout_id() if correlation is not None else None


def _rollout_from_path(path: str) -> str | None:
    if not path.startswith(ROLLOUT_PREFIX):
        return None
    candidate = path[len(ROLLOUT_PREFIX) :].split("/", 1)[0]
    if len(candidate) <= MAX_ROLLOUT_ID_LENGTH and ROLLOUT_ID_PATTERN.fullmatch(candidate):
        return candidate
    return None


class CapturedCall:
    """One model call in flight: its Exchange, the capture it belongs to, and how it ended."""

    # Headers are kept as the library gave them (a snapshot) and sanitized when the call is
    # handed over: by `prepare_record` on the writer's thread, or while building the spool frame
    # (which drops credential headers, cached per header name, before anything is written).
    __slots__ = (
        "session", "exchange", "match", "hook", "hook_state", "request_headers", "response_headers",
        "body_decoded", "_done", "__weakref__",
    )

    def __init__(
        self, session: CaptureSession, exchange: Exchange, match: EndpointMatch, hook: str, request_headers: Any
    ) -> None:
        self.session = session
        self.exchange = exchange
        self.match = match
        self.hook = hook
        self.hook_state: Any = None  # whatever the hook needs to know about its tee
        self.request_headers = request_headers
        self.response_headers: Any = None
        self.body_decoded = False
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def set_response(self, status: int, headers: Any, *, decoded: bool = False) -> None:
        """Note the status and a snapshot of the headers; `decoded`: the body is seen decompressed."""
        self.exchange.status_code = status
        self.response_headers = _snapshot(headers)
        self.body_decoded = self.body_decoded or decoded

    def mark_body_decoded(self) -> None:
        """The teed bytes are decompressed: `content-encoding` must not reach the record."""
        self.body_decoded = True

    def restart_response(self) -> None:
        """Forget a response seen so far (an intermediate redirect the library follows itself)."""
        exchange = self.exchange
        exchange.response_chunks.clear()
        exchange.first_byte_mono = None
        exchange.status_code = None
        self.response_headers = None
        self.body_decoded = False

    def prepare_record(self) -> None:
        """Put sanitized headers on the Exchange (on the writer's thread, before building the line)."""
        exchange = self.exchange
        exchange.request_headers = safe_headers(self.request_headers)
        exchange.response_headers = safe_headers(self.response_headers)
        if self.body_decoded:
            # The teed bytes were already decompressed: keep the header out so no reader tries
            # to decompress them again.
            encoding = exchange.response_headers.pop("content-encoding", None)
            if encoding is not None:
                exchange.extra["capture"]["content_encoding_removed"] = encoding

    def add_chunk(self, data: bytes) -> None:
        """Tee one chunk of the response body; never raises (a failure drops this call's record)."""
        if not data or self._done:
            return
        try:
            self.exchange.add_response_chunk(bytes(data))
        except Exception as exc:
            self._abandon(exc)

    def _abandon(self, exc: BaseException) -> None:
        """Stop recording this call after a failure inside the hook: counted, never raised."""
        lost = not self._done
        if lost:
            self._done = True
            self.session._call_ended()
        self.session.failure("hook_failed", self.hook, exc, call_lost=lost)

    def _end(self, how: str, exc: BaseException | None) -> bool:
        if self._done:
            return False
        self._done = True
        exchange = self.exchange
        exchange.finish()
        if exc is not None:
            if isinstance(exc, (KeyboardInterrupt, GeneratorExit)) or _is_cancellation(exc):
                exchange.cancelled = True
            else:
                exchange.exception = exc
        exchange.extra["capture"]["end"] = how
        self.session._call_ended()
        return True

    def finish(self, how: str, exc: BaseException | None = None) -> None:
        """End the call now (`eof`, `closed`, `error`, ...) and hand its record over; idempotent, never raises."""
        try:
            if self._end(how, exc):
                self.session.submit(self)
        except Exception as failure:
            self._abandon(failure)

    async def afinish(self, how: str, exc: BaseException | None = None) -> None:
        """Async twin of `finish`: in `call` durability it awaits the store without blocking the loop."""
        try:
            if self._end(how, exc):
                await self.session.submit_async(self)
        except Exception as failure:
            self._abandon(failure)

    def finish_unattended(self, how: str) -> None:
        """End the call from a garbage collector or an abandoned generator: queue it, never block."""
        try:
            if self._end(how, None):
                self.session.enqueue(self)
        except Exception as failure:
            self._abandon(failure)


def _snapshot(headers: Any) -> Any:
    """Copy headers cheaply (a list of pairs) so later changes by the library cannot leak in."""
    if headers is None:
        return None
    if isinstance(headers, list):
        return list(headers)
    items = getattr(headers, "items", None)
    return list(items()) if items is not None else list(headers)


def _is_cancellation(exc: BaseException) -> bool:
    asyncio = sys.modules.get("asyncio")  # not imported here: a sync workload never loads it
    return asyncio is not None and isinstance(exc, asyncio.CancelledError)


def open_call(
    hook: str,
    method: str,
    host: str | None,
    port: int | None,
    path: str,
    headers: Any,
    body: bytes | None,
) -> CapturedCall | None:
    """Start capturing a call if a capture is active and the registry says it is a model call.

    Returns None for everything else (the call then passes through untouched). Never raises.
    """
    session = active_session()
    if session is None or not host:
        return None
    try:
        match = session.registry.match(host, port, path)
        if match is None:
            return None
        rollout_id = _explicit_rollout_id() or _rollout_from_path(path) or session.default_rollout_id
        exchange = Exchange(
            method=method.upper(),
            path=path,
            request_body=body or b"",
            rollout_id=rollout_id,
            provider=match.provider,
        )
        exchange.extra["operation"] = match.operation
        exchange.extra["server"] = {"address": host, "port": port}
        exchange.extra["capture"] = {"point": "in-process", "hook": hook, "pid": _PID}
        if body is None:
            exchange.extra["capture"]["request_body"] = "unavailable"
        call = CapturedCall(session, exchange, match, hook, _snapshot(headers))
        session._call_opened()
        return call
    except Exception as exc:
        session.failure("hook_failed", hook, exc)
        return None


class CaptureSession:
    """One capture: where its records go, its registry, its health, and whether it is still open.

    `store_root` is the directory of `<rollout_id>.capture.jsonl` files (a capsule's `calls/`).
    With a `spool` (`llmtap run`), finished calls and health counts go to the spool file instead,
    and the recorder writes the store. Else `health_path`, when given, receives this process's
    health counts as JSON whenever a failure is counted and when the capture closes, so a parent
    process can sum them.
    """

    def __init__(
        self,
        store_root: str | os.PathLike[str],
        *,
        registry: UrlRegistry,
        default_rollout_id: str = DEFAULT_ROLLOUT_ID,
        durability: Durability = "background",
        health_path: str | os.PathLike[str] | None = None,
        linger: float = 0.02,
        close_timeout: float = 30.0,
        spool: SpoolWriter | None = None,
    ) -> None:
        self.store_root = Path(store_root)
        self._store: CaptureStore | None = None
        self._store_lock = threading.Lock()
        self.registry = registry
        self.default_rollout_id = default_rollout_id
        self.durability: Durability = durability
        self.health = CaptureHealth()
        self.health_path = Path(health_path) if health_path is not None else None
        self.close_timeout = close_timeout
        self.closed = False
        self.spool = spool
        self.line_builder: Callable[[CapturedCall], Mapping[str, Any]] = _build_line
        self.frame_builder: Callable[[CapturedCall], list[bytes]] = _build_frame
        self._open_calls = 0
        self._counts_lock = threading.Lock()
        self._writer = RecordWriter(self, linger)
        _SESSIONS.add(self)

    @property
    def store(self) -> CaptureStore:
        """The store under `store_root`, opened at the first record (so idle processes never load it)."""
        store = self._store
        if store is None:
            with self._store_lock:
                if self._store is None:
                    self._store = writing_module("llmtap.store").CaptureStore(self.store_root)
                store = self._store
        return store
    # --- counters ----------------------------------------------------------------------------

    def _call_opened(self) -> None:
        with self._counts_lock:
            self._open_calls += 1
            if self.spool is not None:
                self._note_in_flight()
        if self.spool is None:
            self.health.count("calls_captured")
            warm_up()
        # A spooling process builds no record and counts no call here: the recorder counts each
        # call from its frame, and `failure`/`close` report the calls that leave none.

    def _call_ended(self) -> None:
        with self._counts_lock:
            self._open_calls -= 1
            if self.spool is not None:
                self._note_in_flight()

    def _note_in_flight(self) -> None:
        """Keep the spool's in-flight count current (a store into shared memory, no system call),
        so a process killed mid-call leaves its open calls counted; the caller holds the counts lock."""
        assert self.spool is not None
        try:
            self.spool.set_in_flight(self._open_calls)
        except Exception:  # best effort, like every count
            pass

    def failure(self, event: str, where: str, exc: BaseException | None = None, *, call_lost: bool = False) -> None:
        """Count a capture failure, warn once, and persist this process's counts.

        `call_lost`: the failure ends a call that will leave no frame, so a spooling process
        reports the call itself too (the recorder counts the others from their frames).
        """
        self.health.failure(event, where, exc)
        if self.spool is not None:
            self._report({event: 1, "calls_captured": 1} if call_lost else {event: 1})
        else:
            self._persist_health()

    def _report(self, counts: Mapping[str, int]) -> None:
        """Append count deltas to the spool file, for the recorder to add up; best effort."""
        assert self.spool is not None
        try:
            self.spool.write(encode_frame(KIND_HEALTH, encode_meta({"counts": counts})))
        except Exception:  # the counts stay in memory; nothing else to do without raising
            pass

    def _persist_health(self) -> None:
        if self.health_path is None:
            return
        try:
            writing_module("llmtap.capsule.health").write_process_health(self.health_path, self.health.snapshot())
        except Exception:  # the counts stay in memory; nothing else to do without raising
            pass

    # --- records -----------------------------------------------------------------------------

    def submit(self, call: CapturedCall) -> None:
        """Hand a finished call over: spooled or written now, or queued (`background`)."""
        if self.closed:
            self.failure("stream_record_dropped", call.hook)
            return
        if self.spool is not None:
            self._spool_call(call)
            return
        writing_ready.wait(WARM_UP_WAIT)  # at most once per process: see _warm_up
        if self.durability == "call":
            self._write(call)
        else:
            self.enqueue(call)

    async def submit_async(self, call: CapturedCall) -> None:
        if self.closed:
            self.failure("stream_record_dropped", call.hook)
            return
        if self.spool is not None:
            self._spool_call(call)  # one write to the page cache: nothing to wait for
            return
        writing_ready.wait(WARM_UP_WAIT)  # at most once per process, for a few milliseconds
        if self.durability != "call":
            self.enqueue(call)
            return
        line = self._line_for(call)
        if line is None:
            return
        try:
            await self.store.append_async(call.exchange.rollout_id or self.default_rollout_id, line)
        except Exception as exc:
            self.failure("record_write_failed", call.hook, exc)
            return
        self._written()

    def enqueue(self, call: CapturedCall) -> None:
        if self.closed:
            self.failure("stream_record_dropped", call.hook)
            return
        if self.spool is not None:
            self._spool_call(call)  # no lock taken: safe from a garbage collector's callback
            return
        self._writer.put(call)

    def _spool_call(self, call: CapturedCall) -> None:
        assert self.spool is not None
        try:
            parts = self.frame_builder(call)
        except Exception as exc:
            self.failure("record_build_failed", call.hook, exc, call_lost=True)
            return
        try:
            self.spool.write(parts)
        except Exception as exc:
            self.failure("record_write_failed", call.hook, exc, call_lost=True)

    def _line_for(self, call: CapturedCall) -> Mapping[str, Any] | None:
        try:
            return self.line_builder(call)
        except Exception as exc:
            self.failure("record_build_failed", call.hook, exc)
            return None

    def _write(self, call: CapturedCall) -> None:
        line = self._line_for(call)
        if line is not None:
            self._append(call, line)

    def _append(self, call: CapturedCall, line: Mapping[str, Any]) -> None:
        try:
            self.store.append(call.exchange.rollout_id or self.default_rollout_id, line)
        except Exception as exc:
            self.failure("record_write_failed", call.hook, exc)
            return
        self._written()

    def _write_batch(self, calls: list[CapturedCall]) -> None:
        """Build every record of a batch, then append them in the order the calls ended.

        One append (and fsync) per record keeps that order in the file, which `call_index`
        depends on; a store call that appends several lines at once would cut the fsyncs.
        """
        built = [(call, self._line_for(call)) for call in calls]
        for call, line in built:
            if line is not None:
                self._append(call, line)

    def _written(self) -> None:
        self.health.count("records_written")
        if self.durability == "call":
            # Such a process may end without exit handlers: keep its counts on disk as it goes.
            self._persist_health()

    # --- lifecycle ---------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every finished call's record is durable; False if some are still pending.

        A spooling session has nothing pending: each call's frame is written before it returns.
        """
        if self.spool is not None:
            return True
        return self._writer.drain(self.close_timeout if timeout is None else timeout) == 0

    def close(self) -> None:
        """Stop accepting records, write what is queued, and persist the final counts; idempotent."""
        if self.closed:
            return
        pending = self._writer.drain(self.close_timeout) if self.spool is None else 0
        self.closed = True
        if pending:
            self.health.count("records_pending_at_close", pending)
        with self._counts_lock:
            still_open = self._open_calls
        if still_open > 0:
            self.health.count("calls_open_at_close", still_open)
        if self.spool is not None:
            if still_open > 0:  # calls that will leave no frame
                self._report({"calls_open_at_close": still_open, "calls_captured": still_open})
                try:
                    self.spool.set_in_flight(0)  # reported just now: not in flight at a kill later
                except Exception:
                    pass
        elif self.health.snapshot():  # a process that captured nothing leaves no file
            self._persist_health()

    def after_fork(self) -> None:
        """In a forked child: own no queued records, count from zero, and write each record durably.

        A spooling child writes to a spool file of its own.
        """
        self._writer.after_fork()
        self._store_lock = threading.Lock()
        self.health = CaptureHealth()
        self._counts_lock = threading.Lock()
        self._open_calls = 0
        if self.spool is not None:
            self.spool.after_fork()
            return
        self.durability = "call"
        if self.health_path is not None:
            self.health_path = self.health_path.with_name(process_health_name())


def process_health_name() -> str:
    """A per-process file name for health counts (pid plus a random part: pids get reused)."""
    return f"{os.getpid()}-{os.urandom(3).hex()}.json"


def _build_line(call: CapturedCall) -> Mapping[str, Any]:
    call.prepare_record()
    dialect_name = call.match.dialect
    dialect = writing_module("llmtap.dialects").get_dialect(dialect_name) if dialect_name else None
    line: Mapping[str, Any] = writing_module("llmtap.records").raw_line_from_exchange(call.exchange, dialect=dialect)
    return line


def _build_frame(call: CapturedCall) -> list[bytes]:
    return encode_call(
        call.exchange,
        dialect=call.match.dialect,
        request_headers=call.request_headers,
        response_headers=call.response_headers,
        body_decoded=call.body_decoded,
    )


_PID = os.getpid()  # a system call each time otherwise; a forked child sets its own


def _after_fork_in_child() -> None:
    global _PID
    _PID = os.getpid()
    for session in list(_SESSIONS):
        session.after_fork()


def _close_process_session() -> None:
    session = _PROCESS_SESSION
    if session is not None:
        session.close()


os.register_at_fork(after_in_child=_after_fork_in_child)
register_exit_flush(_close_process_session)
