"""Metrics aggregated over a rollout's calls: known values summed, unknown ones null."""

from __future__ import annotations

import pytest

from llmtap.records import (
    ModelCallRecord,
    aggregate_metrics,
)


def _record(**fields: object) -> ModelCallRecord:
    return ModelCallRecord(model_call_id="x", call_index=0, **fields)  # type: ignore[arg-type]


def test_metrics_sum_known_values_and_keep_unknown_as_null() -> None:
    metrics = aggregate_metrics(
        [
            _record(tokens_in=10, tokens_out=5, latency_total_ms=100.0, latency_ttft_ms=20.0, started_at=10.0, completed_at=10.1),
            _record(tokens_in=4, tokens_out=None, latency_total_ms=50.0, error_category="rate_limit", started_at=10.05, completed_at=10.3),
            _record(error_category="cancelled"),
        ]
    )
    assert metrics["tokens_in"] == 14 and metrics["tokens_out"] == 5
    assert metrics["tokens_reasoning"] is None and metrics["cached_tokens"] is None
    assert metrics["num_calls"] == 3 and metrics["num_errors"] == 2
    assert metrics["errors_by_category"] == {"cancelled": 1, "rate_limit": 1}
    assert metrics["latency_total_ms"] == 150.0
    assert metrics["wall_clock_ms"] == pytest.approx(300.0)
    assert metrics["latency_ttft_ms_p50"] == 20.0


def test_metrics_of_no_calls_are_all_null_with_zero_calls() -> None:
    metrics = aggregate_metrics([])
    assert metrics["num_calls"] == 0 and metrics["num_errors"] == 0
    assert all(metrics[k] is None for k in ("tokens_in", "tokens_out", "tokens_total", "latency_total_ms", "wall_clock_ms"))


def test_ttft_percentiles_use_nearest_rank() -> None:
    metrics = aggregate_metrics([_record(latency_ttft_ms=float(v)) for v in range(1, 101)])
    assert (metrics["latency_ttft_ms_p50"], metrics["latency_ttft_ms_p90"], metrics["latency_ttft_ms_p99"]) == (50.0, 90.0, 99.0)
