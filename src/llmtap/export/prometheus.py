"""Prometheus metrics of a running `llmtap serve`, in a registry of its own.

Label values come only from small fixed sets (the registered dialects, HTTP status classes,
llmtap's error categories, the span drop reasons, capture event names the code defines), never
from what a client sent, so a hostile client cannot grow the number of series.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..dialects import DIALECTS
from ..records import ERROR_CATEGORIES
from .live import DROP_REASONS

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.metrics_core import Metric

    from ..health import CaptureHealth

__all__ = ["CONTENT_TYPE", "ServeMetrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
_OTHER = "other"
_NONE = "none"
# Buckets in seconds: model calls run from milliseconds to minutes, fsyncs from microseconds up.
_CALL_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_SYNC_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
_SIZE_BUCKETS = (1_000, 4_000, 16_000, 64_000, 256_000, 1_000_000, 4_000_000, 16_000_000)
_MAX_EVENT_NAME = 64


class ServeMetrics:
    """The metrics serve exposes at `GET /llmtap/metrics`, with one small `observe_*` method each.

    Usage::

        metrics = ServeMetrics(health=HEALTH)
        metrics.observe_call("chat", 200, None, latency_seconds=0.8, record_bytes=5123)
        body = metrics.render()   # Prometheus text format, CONTENT_TYPE
    """

    def __init__(self, *, health: CaptureHealth | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._dialects = frozenset(DIALECTS)
        self._categories = frozenset(ERROR_CATEGORIES)
        self._calls = Counter(
            "llmtap_calls",
            "Captured model calls, by dialect, HTTP status class and error category.",
            ("dialect", "status_class", "error_category"),
            registry=self.registry,
        )
        self._capture_failures = Counter(
            "llmtap_capture_failures", "Capture failures, by kind.", ("kind",), registry=self.registry
        )
        self._record_size = Histogram(
            "llmtap_record_size_bytes", "Size of each persisted record line.", buckets=_SIZE_BUCKETS, registry=self.registry
        )
        self._sync_latency = Histogram(
            "llmtap_sync_latency_seconds",
            "Time from a record's write to its durability (fsync).",
            buckets=_SYNC_BUCKETS,
            registry=self.registry,
        )
        self._call_latency = Histogram(
            "llmtap_call_latency_seconds",
            "Model call latency, request start to last byte, by dialect.",
            ("dialect",),
            buckets=_CALL_BUCKETS,
            registry=self.registry,
        )
        self._in_flight = Gauge("llmtap_calls_in_flight", "Model calls in progress.", registry=self.registry)
        self._spans_exported = Counter(
            "llmtap_otlp_spans_exported", "Spans the OTLP collector accepted.", registry=self.registry
        )
        self._spans_dropped = Counter(
            "llmtap_otlp_spans_dropped", "Spans not exported, by reason.", ("reason",), registry=self.registry
        )
        for reason in DROP_REASONS:
            self._spans_dropped.labels(reason)  # every reason shows, at 0, before the first drop
        if health is not None:
            self.registry.register(_HealthCollector(health))

    def observe_call(
        self,
        dialect: str | None,
        status_code: int | None,
        error_category: str | None,
        *,
        latency_seconds: float | None = None,
        record_bytes: int | None = None,
    ) -> None:
        """Count one finished call; latency and record size are observed when known."""
        dialect_label = dialect if dialect in self._dialects else _OTHER if dialect else _NONE
        if error_category is None:
            category = _NONE
        else:
            category = error_category if error_category in self._categories else _OTHER
        self._calls.labels(dialect_label, _status_class(status_code), category).inc()
        if latency_seconds is not None and latency_seconds >= 0:
            self._call_latency.labels(dialect_label).observe(latency_seconds)
        if record_bytes is not None and record_bytes >= 0:
            self._record_size.observe(record_bytes)

    def observe_capture_failure(self, kind: str) -> None:
        """Count one capture failure of a kind the code names (`record_write_failed`, ...)."""
        self._capture_failures.labels(_event_label(kind)).inc()

    def observe_sync_latency(self, seconds: float) -> None:
        """Observe how long one record took to become durable."""
        if seconds >= 0:
            self._sync_latency.observe(seconds)

    def call_started(self) -> None:
        """A call began: one more in flight."""
        self._in_flight.inc()

    def call_finished(self) -> None:
        """A call ended, however it ended: one fewer in flight."""
        self._in_flight.dec()

    def observe_spans_exported(self, count: int) -> None:
        """Count spans the collector accepted."""
        self._spans_exported.inc(count)

    def observe_spans_dropped(self, count: int, reason: str) -> None:
        """Count spans dropped for a reason of `live.DROP_REASONS`."""
        self._spans_dropped.labels(reason if reason in DROP_REASONS else _OTHER).inc(count)

    def render(self) -> bytes:
        """Return every metric in the Prometheus text format (`CONTENT_TYPE`)."""
        return generate_latest(self.registry)


def _status_class(status_code: int | None) -> str:
    if status_code is None or not 100 <= status_code <= 599:
        return _NONE
    return f"{status_code // 100}xx"


def _event_label(name: str) -> str:
    # Event names are identifiers in the code; anything else is folded, never exposed.
    if len(name) <= _MAX_EVENT_NAME and name.replace("_", "").isalnum() and name.isascii():
        return name
    return _OTHER


class _HealthCollector:
    """Exposes the capture health counters (records written, failures by kind) at scrape time."""

    def __init__(self, health: CaptureHealth) -> None:
        self._health = health

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(
            "llmtap_capture_events", "Capture health counters (records written, failures by kind).", labels=("event",)
        )
        totals: dict[str, int] = {}
        for event, count in self._health.snapshot().items():
            if isinstance(count, int):
                label = _event_label(event)
                totals[label] = totals.get(label, 0) + count
        for label, count in sorted(totals.items()):
            family.add_metric([label], count)
        yield family
