"""The active capture: which capture a call belongs to, and where its record goes.

A call is bound, when it is *opened*, to the capture active at that moment: the one set for the
current context by `llmtap.capture()` (a context variable, so threads and asyncio tasks keep
their own), else the process-wide capture that `llmtap run` starts in every Python process. A
stream may end much later, in another task, after that capture has closed: its record is then
dropped and counted against the capture that lost it, never filed into whichever capture happens
to be running.

Where a finished call goes is the capture's record sink (`hooks.sinks.RecordSink`), chosen once
when the capture is made:

- Under `llmtap run` (a session with a `spool`): `spool.writer.SpoolSink` writes the call as one
  frame to this process's spool file before the call returns (one `writev`, no thread, no lock,
  no fsync), and the recorder process builds its record. Nothing is parsed here, and a process
  that ends by `os._exit`, SIGTERM or SIGKILL keeps every call that had finished (the page cache
  holds them). Counts of what went wrong here are reported in the same file.
- Under `llmtap.capture()`, records are built (JSON parsing, stream reassembly) off the caller's
  path, in one of two durability modes. `background` (`BackgroundStoreSink`): the hook hands the
  finished call to a writer thread and returns at once; the capture's close (and process exit)
  waits for every record to be durable. `call` (`StoreSink`; forked children, which often end in
  `os._exit`): the record is durable before the call returns.

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

from ..correlation.ids import MAX_ROLLOUT_ID_LENGTH, ROLLOUT_ID_PATTERN, ROLLOUT_PREFIX
from ..exchange import Exchange
from ..health import CaptureHealth
from ..spool.writer import SpoolWriter, build_frame
from .call import CapturedCall, _snapshot
from .registry import UrlRegistry
from .sinks import RecordSink, build_line, make_sink, process_health_name
from .writer import register_exit_flush, writing_module

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
    "process_health_name",
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
    process can sum them. `sink` is where each finished call goes (see `hooks.sinks`).
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
        self.line_builder: Callable[[CapturedCall], Mapping[str, Any]] = build_line
        self.frame_builder: Callable[[CapturedCall], list[bytes]] = build_frame
        self._open_calls = 0
        self._counts_lock = threading.Lock()
        self.sink: RecordSink = make_sink(self, spool=spool, durability=durability, linger=linger)
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
            self.sink.call_opened(self._open_calls)

    def _call_ended(self) -> None:
        with self._counts_lock:
            self._open_calls -= 1
            self.sink.call_ended(self._open_calls)

    def failure(self, event: str, where: str, exc: BaseException | None = None, *, call_lost: bool = False) -> None:
        """Count a capture failure, warn once, and persist this process's counts.

        `call_lost`: the failure ends a call that will leave no record, so a spooling process
        reports the call itself too (the recorder counts the others from their frames).
        """
        self.health.failure(event, where, exc)
        self.sink.mark_incomplete({event: 1, "calls_captured": 1} if call_lost else {event: 1})

    # --- records -----------------------------------------------------------------------------

    def submit(self, call: CapturedCall) -> None:
        """Hand a finished call to the sink: spooled or written now, or queued (`background`)."""
        if self.closed:
            self.failure("stream_record_dropped", call.hook)
            return
        self.sink.put(call)

    async def submit_async(self, call: CapturedCall) -> None:
        if self.closed:
            self.failure("stream_record_dropped", call.hook)
            return
        await self.sink.put_async(call)

    def enqueue(self, call: CapturedCall) -> None:
        """Hand a finished call over without blocking (from a garbage collector's callback)."""
        if self.closed:
            self.failure("stream_record_dropped", call.hook)
            return
        self.sink.enqueue(call)

    # --- lifecycle ---------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every finished call's record is durable; False if some are still pending.

        A spooling session has nothing pending: each call's frame is written before it returns.
        """
        return self.sink.flush(self.close_timeout if timeout is None else timeout) == 0

    def close(self) -> None:
        """Stop accepting records, write what is queued, and persist the final counts; idempotent."""
        if self.closed:
            return
        pending = self.sink.flush(self.close_timeout)
        self.closed = True
        if pending:
            self.health.count("records_pending_at_close", pending)
        with self._counts_lock:
            still_open = self._open_calls
        if still_open > 0:
            self.health.count("calls_open_at_close", still_open)
        self.sink.close(still_open)

    def after_fork(self) -> None:
        """In a forked child: own no queued records, count from zero, and write each record durably.

        A spooling child writes to a spool file of its own.
        """
        self._store_lock = threading.Lock()
        self.health = CaptureHealth()
        self._counts_lock = threading.Lock()
        self._open_calls = 0
        self.sink = self.sink.after_fork()


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
