"""Capture health: counts of what capture recorded, dropped or could not do, and log-once warnings.

Capture never raises into the workload (principle 1), so failures surface here instead: each kind
of failure is logged once per process as a warning naming the event, the capture point and the
exception type (never its message, which could quote a prompt or a secret), and counted.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Any

__all__ = ["CaptureHealth", "HEALTH"]

logger = logging.getLogger("llmtap.capture")


class CaptureHealth:
    """Thread-safe counters of capture outcomes, with one warning per kind of failure."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._warned: set[tuple[str, str, str]] = set()

    def count(self, event: str, amount: int = 1) -> None:
        """Add to the counter of an outcome such as `records_written`."""
        with self._lock:
            self._counts[event] += amount

    def failure(self, event: str, where: str, exc: BaseException | None = None) -> None:
        """Count a capture failure and warn once for this (event, where, exception type)."""
        kind = type(exc).__name__ if exc is not None else "-"
        with self._lock:
            self._counts[event] += 1
            key = (event, where, kind)
            first = key not in self._warned
            self._warned.add(key)
        if first:
            logger.warning("llmtap capture failure: event=%s where=%s exception=%s", event, where, kind)

    def snapshot(self) -> dict[str, Any]:
        """Return the counters as a plain dict."""
        with self._lock:
            return dict(sorted(self._counts.items()))

    def reset(self) -> None:
        """Forget all counts and warnings (for tests)."""
        with self._lock:
            self._counts.clear()
            self._warned.clear()


# The process-wide health counters that capture points share unless given their own.
HEALTH = CaptureHealth()
