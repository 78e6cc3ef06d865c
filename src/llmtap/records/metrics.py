"""Metrics: a rollout's calls summed into the attachment's totals, where null means unknown."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from .model_call import ModelCallRecord

__all__ = ["aggregate_metrics"]

_SUMMED = ("tokens_in", "tokens_out", "tokens_reasoning", "tokens_total", "cached_tokens", "cache_creation_tokens")


def _percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an already sorted, non-empty list."""
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


def aggregate_metrics(records: Iterable[ModelCallRecord]) -> dict[str, Any]:
    """Sum a rollout's calls into the attachment's metrics.

    Sums include only known values; a sum is None when every value is unknown (null means
    unknown, never zero). `num_calls` counts failed calls too. `latency_total_ms` is the plain
    sum the spec defines (concurrent calls inflate it); `wall_clock_ms` is the span from the first
    start to the last end, and TTFT percentiles use nearest rank over the calls that reported one.
    """
    totals: dict[str, int | None] = dict.fromkeys(_SUMMED)
    latency_total: float | None = None
    ttfts: list[float] = []
    errors: dict[str, int] = {}
    first_start: float | None = None
    last_end: float | None = None
    num_calls = 0
    for record in records:
        num_calls += 1
        for name in _SUMMED:
            value = getattr(record, name)
            if value is not None:
                totals[name] = (totals[name] or 0) + value
        if record.latency_total_ms is not None:
            latency_total = (latency_total or 0.0) + record.latency_total_ms
        if record.latency_ttft_ms is not None:
            ttfts.append(record.latency_ttft_ms)
        if record.error_category is not None:
            errors[record.error_category] = errors.get(record.error_category, 0) + 1
        if record.started_at is not None:
            first_start = record.started_at if first_start is None else min(first_start, record.started_at)
        if record.completed_at is not None:
            last_end = record.completed_at if last_end is None else max(last_end, record.completed_at)
    ttfts.sort()
    wall_clock = None
    if first_start is not None and last_end is not None and last_end >= first_start:
        wall_clock = round((last_end - first_start) * 1000.0, 3)
    return {
        **totals,
        "latency_total_ms": None if latency_total is None else round(latency_total, 3),
        "num_calls": num_calls,
        "num_errors": sum(errors.values()),
        "errors_by_category": dict(sorted(errors.items())),
        "wall_clock_ms": wall_clock,
        "latency_ttft_ms_p50": _percentile(ttfts, 0.50) if ttfts else None,
        "latency_ttft_ms_p90": _percentile(ttfts, 0.90) if ttfts else None,
        "latency_ttft_ms_p99": _percentile(ttfts, 0.99) if ttfts else None,
    }
