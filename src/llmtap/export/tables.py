"""The `calls` and `rollouts` tables: their Arrow schemas and the row of each record and rollout.

One row per call holds the normalized record's fields (ids, rollout, dialect, model, status,
category, finish reasons, every usage count, latency, TTFT, timestamps, sizes) plus the tools it
asked for and the tool results its request delivered, read from the dialects' items. Payloads are
JSON text columns, filled only when asked for. One row per rollout holds its metrics (the same
sums `aggregate_model_call_metrics` gives), its capture gaps, and the reward and terminal
attribution of its attached rollout row when one is given. Null means unknown, never zero.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa

from ..dialects.history import HistoryItem, request_items
from ..records import ModelCallRecord, aggregate_metrics
from ..rollouts.attach import capture_gaps
from ..store.readers import RolloutCalls

__all__ = [
    "CALLS_SCHEMA",
    "ROLLOUTS_SCHEMA",
    "UNKNOWN_DATE",
    "AttachedRollout",
    "attached_rollout",
    "call_row",
    "date_of",
    "delivered_tool_results",
    "rollout_row",
]

UNKNOWN_DATE = "unknown"  # the partition of a row without a start time

_TIME = pa.timestamp("us", tz="UTC")
_COUNTS = ("tokens_in", "tokens_out", "tokens_reasoning", "tokens_total", "cached_tokens", "cache_creation_tokens")

CALLS_SCHEMA = pa.schema(
    [
        ("model_call_id", pa.string()),
        ("rollout_id", pa.string()),
        ("call_index", pa.int32()),
        ("response_id", pa.string()),
        ("dialect", pa.string()),
        ("provider", pa.string()),
        ("model", pa.string()),
        ("request_model", pa.string()),
        ("model_ref_type", pa.string()),
        ("model_ref_name", pa.string()),
        ("status_code", pa.int32()),
        ("response_status", pa.string()),
        ("error_category", pa.string()),
        ("is_error", pa.bool_()),
        ("finish_reason", pa.string()),
        ("finish_reason_normalized", pa.string()),
        ("started_at", _TIME),
        ("completed_at", _TIME),
        ("latency_total_ms", pa.float64()),
        ("latency_ttft_ms", pa.float64()),
        *[(name, pa.int64()) for name in _COUNTS],
        ("cache_hit", pa.bool_()),
        ("stream", pa.bool_()),
        ("stream_truncated", pa.bool_()),
        ("tool_call_names", pa.list_(pa.string())),
        ("tool_result_names", pa.list_(pa.string())),
        ("tool_error_names", pa.list_(pa.string())),
        ("reasoning_redacted_blocks", pa.int32()),
        ("has_refusal", pa.bool_()),
        ("request_bytes", pa.int64()),
        ("response_bytes", pa.int64()),
        ("schema_version", pa.int32()),
        ("export_run", pa.int32()),
        ("request_json", pa.string()),
        ("response_json", pa.string()),
        ("request_raw", pa.string()),
        ("response_raw", pa.string()),
    ]
)

ROLLOUTS_SCHEMA = pa.schema(
    [
        ("rollout_id", pa.string()),
        ("export_run", pa.int32()),
        ("exported_at", _TIME),
        ("num_calls", pa.int64()),
        ("num_errors", pa.int64()),
        *[(name, pa.int64()) for name in _COUNTS],
        ("latency_total_ms", pa.float64()),
        ("wall_clock_ms", pa.float64()),
        ("latency_ttft_ms_p50", pa.float64()),
        ("latency_ttft_ms_p90", pa.float64()),
        ("latency_ttft_ms_p99", pa.float64()),
        ("errors_by_category", pa.string()),
        ("first_started_at", _TIME),
        ("last_completed_at", _TIME),
        ("unreadable_lines", pa.int32()),
        ("incomplete", pa.bool_()),
        ("torn_tail", pa.bool_()),
        ("late_writes", pa.int32()),
        ("gaps", pa.list_(pa.string())),
        ("task_index", pa.int64()),
        ("rollout_index", pa.int64()),
        ("reward", pa.float64()),
        ("terminal_model_call_id", pa.string()),
        ("attributed", pa.bool_()),
        ("attribution_method", pa.string()),
        ("attribution_reason", pa.string()),
    ]
)


@dataclass(frozen=True, slots=True)
class AttachedRollout:
    """What an attached rollout row adds to its rollout: the verifier's reward and the terminal call."""

    task_index: int | None
    rollout_index: int | None
    reward: float | None
    terminal_model_call_id: str | None
    attributed: bool | None
    attribution_method: str | None
    attribution_reason: str | None

    def fingerprint(self) -> str:
        """A short text equal for two equal attachments (kept in the export state)."""
        return orjson.dumps(
            [
                self.task_index,
                self.rollout_index,
                self.reward,
                self.terminal_model_call_id,
                self.attributed,
                self.attribution_method,
                self.attribution_reason,
            ]
        ).decode()


def date_of(seconds: float | None) -> str:
    """The UTC date partition of a time, `unknown` when it is unknown."""
    if seconds is None:
        return UNKNOWN_DATE
    try:
        return time.strftime("%Y-%m-%d", time.gmtime(seconds))
    except (OverflowError, OSError, ValueError):
        return UNKNOWN_DATE


def _micros(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1_000_000)


def _json_size(value: Any, *, text: bool) -> tuple[str | None, int | None]:
    """(the payload as compact JSON text when `text`, its size in bytes), or (None, None) when unknown."""
    if value is None:
        return None, None
    data = orjson.dumps(value)
    return (data.decode("utf-8") if text else None), len(data)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def call_row(
    record: ModelCallRecord,
    rollout_id: str,
    export_run: int,
    *,
    payloads: bool,
    memo: dict[bytes, list[HistoryItem]] | None = None,
) -> dict[str, Any]:
    """Return one `calls` row; `memo` (one per rollout) lets replayed history be read once."""
    request_text, request_bytes = _json_size(record.request, text=payloads)
    response_text, response_bytes = _json_size(record.response, text=payloads)
    if request_bytes is None and record.request_raw is not None:
        request_bytes = len(record.request_raw.encode("utf-8"))
    if response_bytes is None and record.response_raw is not None:
        response_bytes = len(record.response_raw.encode("utf-8"))
    results, errors = delivered_tool_results(record, memo)
    model_ref = record.model_ref or {}
    request_model = record.request.get("model") if record.request is not None else None
    row: dict[str, Any] = {
        "model_call_id": record.model_call_id,
        "rollout_id": rollout_id,
        "call_index": record.call_index,
        "response_id": record.response_id,
        "dialect": record.dialect,
        "provider": record.provider,
        "model": record.model,
        "request_model": _str(request_model),
        "model_ref_type": _str(model_ref.get("type")),
        "model_ref_name": _str(model_ref.get("name")),
        "status_code": record.status_code,
        "response_status": record.response_status,
        "error_category": record.error_category,
        "is_error": record.error_category is not None,
        "finish_reason": record.finish_reason,
        "finish_reason_normalized": record.finish_reason_normalized,
        "started_at": _micros(record.started_at),
        "completed_at": _micros(record.completed_at),
        "latency_total_ms": record.latency_total_ms,
        "latency_ttft_ms": record.latency_ttft_ms,
        "cache_hit": record.cache_hit,
        "stream": record.stream,
        "stream_truncated": record.stream_truncated,
        "tool_call_names": [call.get("name") for call in record.tool_calls],
        "tool_result_names": results,
        "tool_error_names": errors,
        "reasoning_redacted_blocks": record.reasoning_redacted_blocks,
        "has_refusal": record.refusal is not None,
        "request_bytes": request_bytes,
        "response_bytes": response_bytes,
        "schema_version": record.schema_version,
        "export_run": export_run,
        "request_json": request_text,
        "response_json": response_text,
        "request_raw": record.request_raw if payloads else None,
        "response_raw": record.response_raw if payloads else None,
    }
    for name in _COUNTS:
        row[name] = getattr(record, name)
    return row


def delivered_tool_results(
    record: ModelCallRecord, memo: dict[bytes, list[HistoryItem]] | None = None
) -> tuple[list[str | None], list[str | None]]:
    """Return (tool names, failed tool names) of the results this call's request delivers.

    A request replays the whole conversation; the results it delivers are those after the last
    assistant item, the answers to the previous call's tool calls. A result names its tool
    through the call id of the tool call it answers (null when that call is not in the request).
    Failed: flagged as an error by the dialect (Messages `is_error`); other dialects flag none.
    """
    items = request_items(record.dialect, record.request, memo=memo) or []
    last_assistant = max((i for i, item in enumerate(items) if item.get("role") == "assistant"), default=-1)
    names_by_call: dict[str, str | None] = {}
    for item in items[: last_assistant + 1]:
        if item.get("type") == "tool_call" and item.get("call_id") is not None:
            names_by_call[item["call_id"]] = item.get("name")
    results: list[str | None] = []
    errors: list[str | None] = []
    for item in items[last_assistant + 1 :]:
        if item.get("type") != "tool_result":
            continue
        name = item.get("name") or names_by_call.get(item.get("call_id") or "")
        results.append(name)
        if item.get("is_error") is True:
            errors.append(name)
    return results, errors


def rollout_row(
    calls: RolloutCalls, export_run: int, exported_at: float, attached: AttachedRollout | None
) -> dict[str, Any]:
    """Return one `rollouts` row: the rollout's metrics and gaps, with its attached reward if any."""
    metrics = aggregate_metrics(calls.records)
    starts = [record.started_at for record in calls.records if record.started_at is not None]
    ends = [record.completed_at for record in calls.records if record.completed_at is not None]
    row: dict[str, Any] = {
        "rollout_id": calls.rollout_id,
        "export_run": export_run,
        "exported_at": _micros(exported_at),
        "num_calls": metrics["num_calls"],
        "num_errors": metrics["num_errors"],
        "latency_total_ms": metrics["latency_total_ms"],
        "wall_clock_ms": metrics["wall_clock_ms"],
        "latency_ttft_ms_p50": metrics["latency_ttft_ms_p50"],
        "latency_ttft_ms_p90": metrics["latency_ttft_ms_p90"],
        "latency_ttft_ms_p99": metrics["latency_ttft_ms_p99"],
        "errors_by_category": orjson.dumps(metrics["errors_by_category"]).decode(),
        "first_started_at": _micros(min(starts)) if starts else None,
        "last_completed_at": _micros(max(ends)) if ends else None,
        "unreadable_lines": len(calls.unreadable_lines),
        "incomplete": calls.incomplete,
        "torn_tail": calls.torn_tail,
        "late_writes": calls.late_writes,
        "gaps": [gap["code"] for gap in capture_gaps(calls)],
    }
    for name in _COUNTS:
        row[name] = metrics[name]
    for name in AttachedRollout.__slots__:
        row[name] = getattr(attached, name) if attached is not None else None
    return row


def attached_rollout(row: Mapping[str, Any]) -> tuple[str, AttachedRollout] | None:
    """Read (rollout id, attachment) from an attached rollout row; None when it carries no capture."""
    capture = row.get("ng_model_call_capture")
    if not isinstance(capture, Mapping) or not isinstance(capture.get("rollout_id"), str):
        return None
    attribution = capture.get("attribution")
    attribution = attribution if isinstance(attribution, Mapping) else {}
    reward = row.get("reward")
    return capture["rollout_id"], AttachedRollout(
        task_index=_int(row.get("_ng_task_index")),
        rollout_index=_int(row.get("_ng_rollout_index")),
        reward=float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None,
        terminal_model_call_id=_str(attribution.get("model_call_id")),
        attributed=attribution.get("attributed") if isinstance(attribution.get("attributed"), bool) else None,
        attribution_method=_str(attribution.get("method")),
        attribution_reason=_str(attribution.get("reason")),
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
