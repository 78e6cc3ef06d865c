"""Live OTLP export from a running `llmtap serve`: a bounded queue and one worker thread.

`submit` is called once a call's record is durable. It only appends to a bounded queue under a
lock and never waits: when the queue is full the call's span is dropped and counted, so a down or
slow collector costs the serving path nothing but that count, and memory stays within
`max_queue` records. The worker thread takes batches off the queue, builds the spans (the record
is normalized there, not on the caller's thread) and sends them with the official exporter; a
batch the collector does not accept is dropped and counted too. Each kind of drop is logged once.
The store keeps every record whatever happens here; `llmtap export otlp` can send them again.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..records import ModelCallRecord
from .otlp import MAX_BATCH_BYTES
from .spans import content_capture_enabled, default_resource, span_for_record, span_weight

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = ["DROP_REASONS", "LiveExporter", "SpanCounter"]

logger = logging.getLogger("llmtap.export")

DROP_REASONS = ("queue_full", "export_failed", "unreadable", "no_rollout", "closed")


class SpanCounter(Protocol):
    """Where the exporter reports its counts (`export.prometheus.ServeMetrics` is one)."""

    def observe_spans_exported(self, count: int) -> None: ...

    def observe_spans_dropped(self, count: int, reason: str) -> None: ...


class LiveExporter:
    """Exports records as spans in the background, never delaying or growing past its bound.

    `max_queue` bounds the records waiting (memory: that many records, payloads included, which
    the caller already holds); `batch_size` the spans per export request; `flush_interval` how
    long a partial batch waits. `close()` sends what is queued within its
    timeout and drops (and counts) the rest.

    Usage::

        live = LiveExporter(span_exporter("http://127.0.0.1:4318"))
        live.start()
        live.submit(line)          # the persisted line, once it is durable
        live.close()
    """

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue: int = 2048,
        batch_size: int = 256,
        flush_interval: float = 1.0,
        content: bool | None = None,
        resource: Resource | None = None,
        counter: SpanCounter | None = None,
    ) -> None:
        if max_queue < 1 or batch_size < 1 or flush_interval <= 0:
            raise ValueError("max_queue and batch_size must be at least 1 and flush_interval positive")
        self._exporter = exporter
        self._max_queue = max_queue
        self._batch_size = min(batch_size, max_queue)
        self._flush_interval = flush_interval
        self._content = content_capture_enabled() if content is None else content
        self._resource = resource or default_resource()
        self._counter = counter
        self._queue: collections.deque[tuple[ModelCallRecord | Mapping[str, Any], str | None]] = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._drain_deadline = 0.0
        self._thread: threading.Thread | None = None
        self._counts: dict[str, int] = {"submitted": 0, "exported": 0, "batches": 0, "failed_batches": 0}
        self._exporting = 0  # records taken off the queue whose batch is not settled yet
        self._dropped: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        self._warned: set[str] = set()

    def start(self) -> LiveExporter:
        """Start the worker thread (a daemon: a stuck collector never holds the process open)."""
        with self._lock:
            if self._thread is None and not self._stopping:
                self._thread = threading.Thread(target=self._run, name="llmtap-otlp-export", daemon=True)
                self._thread.start()
        return self

    def submit(self, record: ModelCallRecord | Mapping[str, Any], rollout_id: str | None = None) -> bool:
        """Queue one durable record (a `ModelCallRecord`, or the persisted line); False when dropped.

        Never blocks and never raises: a full queue or a closed exporter drops the span and counts it.
        """
        wake = False
        with self._lock:
            if self._stopping:
                reason: str | None = "closed"
            elif len(self._queue) >= self._max_queue:
                reason = "queue_full"
            else:
                reason = None
                self._queue.append((record, rollout_id))
                self._counts["submitted"] += 1
                wake = len(self._queue) >= self._batch_size
        if reason is not None:
            self._drop(1, reason)
            return False
        if wake:
            self._wake.set()
        return True

    def counts(self) -> dict[str, Any]:
        """Return the counters: submitted, exported, batches, failed batches, queued, exporting, dropped by reason.

        `submitted` counts the records the queue accepted; each is then in exactly one of exported,
        queued, exporting, or dropped as export_failed, unreadable, no_rollout or closed.
        `queue_full` (and `closed` after close) also counts records refused at submit.
        """
        with self._lock:
            return {
                **self._counts,
                "queued": len(self._queue),
                "exporting": self._exporting,
                "dropped": dict(self._dropped),
            }

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting records, send what is queued within `timeout` seconds, drop the rest."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            self._drain_deadline = time.monotonic() + timeout
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout + 1.0)
        with self._lock:
            left = len(self._queue)
            self._queue.clear()
        if left:
            self._drop(left, "closed")
        try:
            self._exporter.shutdown()
        except Exception as exc:  # shutting down must not raise into serve's shutdown
            self._warn_once("shutdown", f"the OTLP exporter failed to shut down ({type(exc).__name__})")

    def _run(self) -> None:
        while True:
            self._wake.wait(self._flush_interval)
            self._wake.clear()
            while True:
                with self._lock:
                    stopping = self._stopping
                    if stopping and time.monotonic() > self._drain_deadline:
                        return
                    batch = [self._queue.popleft() for _ in range(min(self._batch_size, len(self._queue)))]
                    self._exporting = len(batch)
                if not batch:
                    break
                try:
                    self._export(batch)
                except Exception:  # a bug here must not kill the worker: the batch counts as failed
                    with self._lock:
                        left = self._exporting
                    self._drop(left, "export_failed", settled=True)
                if len(batch) < self._batch_size and not stopping:
                    break
            if stopping:
                return

    def _export(self, batch: list[tuple[ModelCallRecord | Mapping[str, Any], str | None]]) -> None:
        spans: list[ReadableSpan] = []
        for item, rollout_id in batch:
            span = self._span(item, rollout_id)
            if span is not None:
                spans.append(span)
        # Message content can make a batch large: send it in requests of about MAX_BATCH_BYTES.
        chunk: list[ReadableSpan] = []
        weight = 0
        for span in spans:
            chunk.append(span)
            weight += span_weight(span)
            if weight >= MAX_BATCH_BYTES:
                self._send(chunk)
                chunk, weight = [], 0
        if chunk:
            self._send(chunk)

    def _send(self, spans: list[ReadableSpan]) -> None:
        from opentelemetry.sdk.trace.export import SpanExportResult

        try:
            result = self._exporter.export(spans)
        except Exception:  # the exporter catches its own errors; anything else is a failed batch too
            result = SpanExportResult.FAILURE
        with self._lock:
            self._counts["batches"] += 1
            if result is SpanExportResult.SUCCESS:
                self._counts["exported"] += len(spans)
                self._exporting -= len(spans)
            else:
                self._counts["failed_batches"] += 1
        if result is SpanExportResult.SUCCESS:
            if self._counter is not None:
                self._counter.observe_spans_exported(len(spans))
        else:
            self._drop(len(spans), "export_failed", settled=True)

    def _span(self, item: ModelCallRecord | Mapping[str, Any], rollout_id: str | None) -> ReadableSpan | None:
        try:
            if isinstance(item, ModelCallRecord):
                record = item
            else:
                record = ModelCallRecord.from_raw_line(item, -1)  # no reader numbered it yet
                if rollout_id is None and isinstance(item.get("rollout_id"), str):
                    rollout_id = item["rollout_id"]
            if rollout_id is None:
                self._drop(1, "no_rollout", settled=True)
                return None
            span = span_for_record(record, rollout_id, resource=self._resource, content=self._content)
        except Exception:  # one odd record must not stop the worker
            span = None
        if span is None:
            self._drop(1, "unreadable", settled=True)
        return span

    def _drop(self, count: int, reason: str, *, settled: bool = False) -> None:
        """Count a drop; `settled` when the records were taken off the queue for export."""
        with self._lock:
            self._dropped[reason] += count
            if settled:
                self._exporting -= count
        if self._counter is not None:
            self._counter.observe_spans_dropped(count, reason)
        self._warn_once(reason, f"llmtap dropped OTLP spans: reason={reason} (counted; the records stay in the store)")

    def _warn_once(self, key: str, message: str) -> None:
        with self._lock:
            first = key not in self._warned
            self._warned.add(key)
        if first:
            logger.warning(message)
