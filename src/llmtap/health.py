"""Capture health: counts of what capture recorded, dropped or could not do, and log-once warnings.

Capture never raises into the workload (principle 1), so failures surface here instead: each kind
of failure is logged once per process as a warning naming the event, the capture point and the
exception type (never its message, which could quote a prompt or a secret), and counted.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter, deque
from typing import Any

__all__ = ["CaptureHealth", "HEALTH"]

logger = logging.getLogger("llmtap.capture")


# How many of the latest record syncs the latency percentiles are taken over.
SYNC_SAMPLES_KEPT = 4096


class CaptureHealth:
    """Thread-safe counters of capture outcomes, with one warning per kind of failure.

    Besides the counters it keeps which of them are failures (`failures()`), and the durations
    of the latest record syncs, for the percentiles `sync_latency_ms()` reports.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._failures: Counter[str] = Counter()
        self._warned: set[tuple[str, str, str]] = set()
        self._sync_seconds: deque[float] = deque(maxlen=SYNC_SAMPLES_KEPT)

    def count(self, event: str, amount: int = 1) -> None:
        """Add to the counter of an outcome such as `records_written`."""
        with self._lock:
            self._counts[event] += amount

    def failure(self, event: str, where: str, exc: BaseException | None = None) -> None:
        """Count a capture failure and warn once for this (event, where, exception type)."""
        kind = type(exc).__name__ if exc is not None else "-"
        with self._lock:
            self._counts[event] += 1
            self._failures[event] += 1
            key = (event, where, kind)
            first = key not in self._warned
            self._warned.add(key)
        if first:
            logger.warning("llmtap capture failure: event=%s where=%s exception=%s", event, where, kind)

    def observe_sync(self, seconds: float) -> None:
        """Note how long one record took from hand-over to the store until it was durable."""
        with self._lock:
            self._sync_seconds.append(seconds)

    def snapshot(self) -> dict[str, Any]:
        """Return the counters as a plain dict."""
        with self._lock:
            return dict(sorted(self._counts.items()))

    def failures(self) -> dict[str, int]:
        """Return the capture failures counted so far, by kind (the `event` given to `failure`)."""
        with self._lock:
            return dict(sorted(self._failures.items()))

    def sync_latency_ms(self) -> dict[str, Any]:
        """Return the p50 and p99 of the latest record syncs in milliseconds (None before the first)."""
        with self._lock:
            samples = sorted(self._sync_seconds)
        if not samples:
            return {"p50": None, "p99": None, "samples": 0}
        return {
            "p50": round(_nearest_rank(samples, 0.50) * 1000.0, 3),
            "p99": round(_nearest_rank(samples, 0.99) * 1000.0, 3),
            "samples": len(samples),
        }

    def reset(self) -> None:
        """Forget all counts, warnings and sync durations (for tests)."""
        with self._lock:
            self._counts.clear()
            self._failures.clear()
            self._warned.clear()
            self._sync_seconds.clear()


def _nearest_rank(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[max(1, math.ceil(fraction * len(sorted_values))) - 1]


# The process-wide health counters that capture points share unless given their own.
HEALTH = CaptureHealth()
