"""Where a capture's finished calls go: the `RecordSink` contract, and the sinks that write the store.

A `CaptureSession` holds one sink and hands it every call, never asking which kind it is:

- `SpoolSink` (`spool.writer`), under `llmtap run`: one frame per call in this process's spool
  file; the recorder process builds the records.
- `StoreSink`, under `llmtap.capture()` with `call` durability (forked children, which often end
  in `os._exit`): the record is built and durable in CaptureStore before the call returns.
- `BackgroundStoreSink`, under `llmtap.capture()` with `background` durability: the call goes to
  a writer thread (`RecordWriter`) and the hook returns at once; `flush` and the capture's close
  wait for every record to be durable.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping, Protocol

from ..spool.writer import SpoolSink
from .writer import WARM_UP_WAIT, RecordWriter, warm_up, writing_module, writing_ready

if TYPE_CHECKING:
    from ..spool.writer import SpoolWriter
    from .call import CapturedCall
    from .session import CaptureSession, Durability

__all__ = ["BackgroundStoreSink", "RecordSink", "StoreSink", "build_line", "make_sink", "process_health_name"]


class RecordSink(Protocol):
    """Where a capture's finished calls go: put a finished call, mark the capture incomplete, close.

    The contract every sink keeps:

    - Who closes: the `CaptureSession` that made the sink, once, from its own `close` (which runs
      at process exit for `llmtap run`'s process capture); the session hands it no call after
      that, it counts `stream_record_dropped` instead. A sink never closes the CaptureStore under
      it: the store's own exit handler does, after every capture's last flush.
    - `put` (and `put_async`, its twin for a call ending on an event loop): take one finished call.
      Its record is durable on return (`StoreSink`; `SpoolSink` leaves it in the page cache, which
      outlives the process) or once `flush` returns (`BackgroundStoreSink`). `enqueue` is `put` for
      a garbage collector's callback: it never blocks on the store.
    - On failure: a sink never raises into the workload. A call it cannot build or write is
      counted in the session's health (`CaptureSession.failure`: event, hook and exception type,
      never a message, which could quote a prompt) and becomes a gap in the record, not an error.
    - `mark_incomplete(counts)`: the capture is incomplete; persist `counts` (event: how many, with
      `calls_captured` for calls that will leave no record) where the capture's reader adds them
      up: the process health file, or a count frame in the spool file. Best effort, never raises.
    - `call_opened`/`call_ended`: the number of this capture's calls now in flight (the session
      holds its counts lock); `flush(timeout)`: wait for queued records, return how many are still
      pending; `close(open_calls)`: report the calls still open, which will leave no record;
      `after_fork()`: the sink a forked child uses from now on.
    """

    def call_opened(self, open_calls: int) -> None: ...

    def call_ended(self, open_calls: int) -> None: ...

    def put(self, call: CapturedCall) -> None: ...

    async def put_async(self, call: CapturedCall) -> None: ...

    def enqueue(self, call: CapturedCall) -> None: ...

    def mark_incomplete(self, counts: Mapping[str, int]) -> None: ...

    def flush(self, timeout: float) -> int: ...

    def close(self, open_calls: int) -> None: ...

    def after_fork(self) -> RecordSink: ...


def make_sink(session: CaptureSession, *, spool: SpoolWriter | None, durability: Durability, linger: float) -> RecordSink:
    """The sink for a new capture: its spool when it has one, else the store in its durability mode."""
    if spool is not None:
        return SpoolSink(session, spool)
    if durability == "call":
        return StoreSink(session, linger)
    return BackgroundStoreSink(session, linger)


def process_health_name() -> str:
    """A per-process file name for health counts (pid plus a random part: pids get reused)."""
    return f"{os.getpid()}-{os.urandom(3).hex()}.json"


def build_line(call: CapturedCall) -> Mapping[str, Any]:
    """The store line of a finished call (a session's default `line_builder`)."""
    call.prepare_record()
    dialect_name = call.match.dialect
    dialect = writing_module("llmtap.dialects").get_dialect(dialect_name) if dialect_name else None
    line: Mapping[str, Any] = writing_module("llmtap.records").raw_line_from_exchange(call.exchange, dialect=dialect)
    return line


class StoreSink:
    """The `RecordSink` that builds each record here and appends it to the session's CaptureStore.

    `put` makes the record durable before it returns (`call` durability); `enqueue` (from a
    garbage collector) still queues it for the writer thread, which never blocks the collector.
    """

    def __init__(self, session: CaptureSession, linger: float, writer: RecordWriter | None = None) -> None:
        self.session = session
        self.linger = linger
        self._writer = writer if writer is not None else RecordWriter(self.write_batch, linger)

    def call_opened(self, open_calls: int) -> None:
        self.session.health.count("calls_captured")
        warm_up()

    def call_ended(self, open_calls: int) -> None:
        pass  # nothing in flight is persisted: this process counts its calls at open

    def put(self, call: CapturedCall) -> None:
        writing_ready.wait(WARM_UP_WAIT)  # at most once per process: see writer.warm_up
        self._write(call)

    async def put_async(self, call: CapturedCall) -> None:
        writing_ready.wait(WARM_UP_WAIT)  # at most once per process, for a few milliseconds
        line = self._line_for(call)
        if line is None:
            return
        session = self.session
        try:
            await session.store.append_async(call.exchange.rollout_id or session.default_rollout_id, line)
        except Exception as exc:
            session.failure("record_write_failed", call.hook, exc)
            return
        self._written()

    def enqueue(self, call: CapturedCall) -> None:
        self._writer.put(call)

    def mark_incomplete(self, counts: Mapping[str, int]) -> None:
        """Persist the session's counts (which include `counts` already) to its health file."""
        self._persist_health()

    def _persist_health(self) -> None:
        session = self.session
        if session.health_path is None:
            return
        try:
            writing_module("llmtap.capsule.health").write_process_health(session.health_path, session.health.snapshot())
        except Exception:  # the counts stay in memory; nothing else to do without raising
            pass

    def flush(self, timeout: float) -> int:
        return self._writer.drain(timeout)

    def close(self, open_calls: int) -> None:
        if self.session.health.snapshot():  # a process that captured nothing leaves no file
            self._persist_health()

    def after_fork(self) -> RecordSink:
        """A forked child owns none of the parent's queued records, and writes each record durably."""
        self._writer.after_fork()
        session = self.session
        session.durability = "call"
        if session.health_path is not None:
            session.health_path = session.health_path.with_name(process_health_name())
        return StoreSink(session, self.linger, self._writer)

    def _line_for(self, call: CapturedCall) -> Mapping[str, Any] | None:
        try:
            return self.session.line_builder(call)
        except Exception as exc:
            self.session.failure("record_build_failed", call.hook, exc)
            return None

    def _write(self, call: CapturedCall) -> None:
        line = self._line_for(call)
        if line is not None:
            self._append(call, line)

    def _append(self, call: CapturedCall, line: Mapping[str, Any]) -> None:
        session = self.session
        try:
            session.store.append(call.exchange.rollout_id or session.default_rollout_id, line)
        except Exception as exc:
            session.failure("record_write_failed", call.hook, exc)
            return
        self._written()

    def write_batch(self, calls: list[CapturedCall]) -> None:
        """Build every record of a batch, then append them in the order the calls ended.

        One append (and fsync) per record keeps that order in the file, which `call_index`
        depends on; a store call that appends several lines at once would cut the fsyncs.
        """
        built = [(call, self._line_for(call)) for call in calls]
        for call, line in built:
            if line is not None:
                self._append(call, line)

    def _written(self) -> None:
        session = self.session
        session.health.count("records_written")
        if session.durability == "call":
            # Such a process may end without exit handlers: keep its counts on disk as it goes.
            self._persist_health()


class BackgroundStoreSink(StoreSink):
    """The `RecordSink` that hands each call to a writer thread and returns at once (`background`)."""

    def put(self, call: CapturedCall) -> None:
        writing_ready.wait(WARM_UP_WAIT)  # at most once per process: see writer.warm_up
        self._writer.put(call)

    async def put_async(self, call: CapturedCall) -> None:
        writing_ready.wait(WARM_UP_WAIT)  # at most once per process, for a few milliseconds
        self._writer.put(call)
