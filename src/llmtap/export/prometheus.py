"""Prometheus metrics of a running `llmtap serve`, in a registry of its own.

Label values come only from small fixed sets (the registered dialects, HTTP status classes,
llmtap's error categories, the span drop reasons, capture event names the code defines), never
from what a client sent, so a hostile client cannot grow the number of series.
"""

from __future__ import annotations

import bisect
import math
from bisect import bisect_left
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.utils import floatToGoString

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
# Distinct raw (dialect, status, category) keys tallied apart; status codes and the fixed sets bound them.
_MAX_CACHED_KEYS = 4096


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
        # The per-call metrics are tallied in plain ints on the serving thread and turned into metric
        # families at scrape time (`_CallCollector`): a prometheus_client child takes a lock per
        # increment and `labels()` builds its key each time, which cost more than the rest of the commit.
        self._call_counts: dict[tuple[str | None, int | None, str | None], int] = {}
        self._call_latency_by_dialect: dict[str | None, _Tally] = {}
        self._sync_latency = _Tally(_SYNC_BUCKETS)
        self._record_size = _Tally(_SIZE_BUCKETS)
        self._latency_by_label: dict[str, _Tally] = {}
        self.registry.register(_CallCollector(self))
        self._capture_failures = Counter(
            "llmtap_capture_failures", "Capture failures, by kind.", ("kind",), registry=self.registry
        )
        self._in_flight = Gauge("llmtap_calls_in_flight", "Model calls in progress.", registry=self.registry)
        # Counted in a plain int on the serving thread and read at scrape time: no lock per call.
        self._in_flight_count = 0
        self._in_flight.set_function(lambda: self._in_flight_count)
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
        """Count one finished call; latency and record size are observed when known.

        Call from the serving thread (the event loop), as the middleware does: the tallies take no lock.
        """
        key = (dialect, status_code, error_category)
        counts = self._call_counts
        if key in counts or len(counts) < _MAX_CACHED_KEYS:
            counts[key] = counts.get(key, 0) + 1
        else:  # an unbounded key space (a hostile upstream's statuses): folded into the labels at once
            folded = (_OTHER, None, _OTHER)
            counts[folded] = counts.get(folded, 0) + 1
        if latency_seconds is not None and latency_seconds >= 0:
            tally = self._call_latency_by_dialect.get(dialect)
            if tally is None:
                tally = self._latency_by_label.setdefault(self._dialect_label(dialect), _Tally(_CALL_BUCKETS))
                if len(self._call_latency_by_dialect) < _MAX_CACHED_KEYS:
                    self._call_latency_by_dialect[dialect] = tally
            tally.observe(latency_seconds)
        if record_bytes is not None and record_bytes >= 0:
            self._record_size.observe(record_bytes)

    def observe_commit(
        self,
        dialect: str | None,
        status_code: int | None,
        error_category: str | None,
        latency_seconds: float | None,
        sync_seconds: float,
    ) -> None:
        """`observe_call` and `observe_sync_latency` of one durable record in one call: serve's commit path.

        One method call instead of two, and the tallies inlined: this runs once per captured call.
        """
        key = (dialect, status_code, error_category)
        counts = self._call_counts
        count = counts.get(key)
        if count is not None:
            counts[key] = count + 1
        else:
            self.observe_call(dialect, status_code, error_category, latency_seconds=latency_seconds)
            self.observe_sync_latency(sync_seconds)
            return
        if latency_seconds is not None and latency_seconds >= 0:
            tally = self._call_latency_by_dialect.get(dialect)
            if tally is None:
                tally = self._latency_by_label.setdefault(self._dialect_label(dialect), _Tally(_CALL_BUCKETS))
            tally.counts[bisect_left(tally.bounds, latency_seconds)] += 1
            tally.sum += latency_seconds
        if sync_seconds >= 0:
            sync = self._sync_latency
            sync.counts[bisect_left(sync.bounds, sync_seconds)] += 1
            sync.sum += sync_seconds

    def track_in_flight(self, source: Callable[[], int]) -> None:
        """Read the calls in flight from `source` at scrape time (the middleware's own count), at no cost per call."""
        self._in_flight.set_function(source)

    def _dialect_label(self, dialect: str | None) -> str:
        return dialect if dialect in self._dialects else _OTHER if dialect else _NONE

    def _category(self, error_category: str | None) -> str:
        if error_category is None:
            return _NONE
        return error_category if error_category in self._categories else _OTHER

    def observe_capture_failure(self, kind: str) -> None:
        """Count one capture failure of a kind the code names (`record_write_failed`, ...)."""
        self._capture_failures.labels(_event_label(kind)).inc()

    def observe_sync_latency(self, seconds: float) -> None:
        """Observe how long one record took to become durable."""
        if seconds >= 0:
            self._sync_latency.observe(seconds)  # a plain tally: call from the serving thread

    def call_started(self) -> None:
        """A call began: one more in flight (call from the serving thread, as the middleware does)."""
        self._in_flight_count += 1

    def call_finished(self) -> None:
        """A call ended, however it ended: one fewer in flight."""
        self._in_flight_count -= 1

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


class _Tally:
    """A histogram's bucket counts and sum, kept without a lock (one writer: the serving thread)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative buckets as the text format wants them, `+Inf` last."""
        found, running = [], 0
        for bound, count in zip((*self.bounds, math.inf), self.counts):
            running += count
            found.append(("+Inf" if bound == math.inf else floatToGoString(bound), float(running)))
        return found


class _CallCollector:
    """Turns `ServeMetrics`' per-call tallies into metric families at scrape time."""

    def __init__(self, metrics: ServeMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        metrics = self._metrics
        calls = CounterMetricFamily(
            "llmtap_calls",
            "Captured model calls, by dialect, HTTP status class and error category.",
            labels=("dialect", "status_class", "error_category"),
        )
        folded: dict[tuple[str, str, str], int] = {}
        for (dialect, status_code, category), count in list(metrics._call_counts.items()):
            labels = (metrics._dialect_label(dialect), _status_class(status_code), metrics._category(category))
            folded[labels] = folded.get(labels, 0) + count
        for labels, count in sorted(folded.items()):
            calls.add_metric(list(labels), count)
        yield calls
        latency = HistogramMetricFamily(
            "llmtap_call_latency_seconds",
            "Model call latency, request start to last byte, by dialect.",
            labels=("dialect",),
        )
        for label, tally in sorted(metrics._latency_by_label.items()):
            latency.add_metric([label], tally.buckets(), tally.sum)
        yield latency
        for name, help_text, tally in (
            ("llmtap_record_size_bytes", "Size of each persisted record line.", metrics._record_size),
            ("llmtap_sync_latency_seconds", "Time from a record's write to its durability (fsync).",
             metrics._sync_latency),
        ):
            family = HistogramMetricFamily(name, help_text)
            family.add_metric([], tally.buckets(), tally.sum)
            yield family
