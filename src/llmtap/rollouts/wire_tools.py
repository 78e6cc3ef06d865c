"""Fill a trajectory's tool attempts from the MCP tool calls recorded on the wire, where the agent reported none.

`ng_trajectory.tool_calls` lists each tool call the model asked for. When the agent observed its
own execution (`ng_agent_observations`), that status and timing stand. When it did not, the
rollout's MCP records (`<rollout_id>.tool-calls.jsonl`, written by `llmtap mcp-proxy` or the
zero-code hook: `store.tool_calls`) can say what happened: a `tools/call` record joins a tool
attempt when it names the same tool, carries equal arguments (when both are readable), and
started no earlier than the model call that asked for it completed. Each record joins at most
one attempt, earliest first. A joined attempt gets the record's `status`, `started_at`,
`completed_at`, `duration_ms`, `timing_source: "mcp_wire"`, and `tool_execution` with the record's
`call_id`, `is_error`, `result_bytes`, `content_items` and error category.

The rule is the merge's (`trajectory_merge`): what the agent reported wins; the wire fills only
what is unknown.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["TIMING_SOURCE", "fill_from_wire", "model_call_completions"]

TIMING_SOURCE = "mcp_wire"
_CLOCK_SLACK_S = 0.05  # the model call's completion and the tool call's start come from different clocks


def _arguments(value: Any) -> Any:
    """The arguments as JSON, or None when unreadable (a string that is not JSON, or history's `{"_raw": ...}`)."""
    if isinstance(value, dict) and set(value) == {"_raw"}:
        return None
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _compatible(entry: Mapping[str, Any], record: Any, asked_done: float | None) -> bool:
    if record.method != "tools/call" or record.name != entry.get("tool_name"):
        return False
    wanted = _arguments(entry.get("arguments"))
    if wanted is not None and record.arguments is not None and wanted != record.arguments:
        return False
    if asked_done is not None and record.started_at is not None and record.started_at + _CLOCK_SLACK_S < asked_done:
        return False
    return True


def fill_from_wire(entries: list[dict[str, Any]], records: Sequence[Any], asked_done: Mapping[str, float | None]) -> int:
    """Fill unobserved tool attempts in `entries` from MCP `records` (in place); return how many joined.

    `asked_done` maps a model call id to when that call completed (None: unknown).
    """
    pool = sorted(
        (record for record in records if getattr(record, "method", None) == "tools/call"),
        key=lambda record: record.started_at,
    )
    used: set[int] = set()
    joined = 0
    for entry in entries:
        if entry.get("hosted") or entry.get("timing_source") is not None or entry.get("started_at") is not None:
            continue  # the agent (or the provider) reported this one: it stands
        done = asked_done.get(str(entry.get("requested_by_model_call_id")))
        for position, record in enumerate(pool):
            if position in used or not _compatible(entry, record, done):
                continue
            used.add(position)
            _apply(entry, record)
            joined += 1
            break
    return joined


def _apply(entry: dict[str, Any], record: Any) -> None:
    result = record.result if isinstance(record.result, Mapping) else {}
    if entry.get("status") in (None, "unknown"):
        entry["status"] = "failed" if record.status == "failed" else "completed" if record.status == "completed" else record.status
    entry["started_at"] = record.started_at
    entry["completed_at"] = record.completed_at
    entry["duration_ms"] = record.duration_ms
    entry["timing_source"] = TIMING_SOURCE
    entry["tool_execution"] = {
        "mcp_call_id": record.call_id,
        "transport": record.transport,
        "is_error": record.is_error,
        "result_bytes": result.get("result_bytes"),
        "content_items": result.get("content_items"),
        "arguments_bytes": record.arguments_bytes,
        "error_category": (record.error or {}).get("category") if isinstance(record.error, Mapping) else None,
    }
    if entry.get("arguments") is None and record.arguments is not None:
        entry["arguments"] = json.dumps(record.arguments)


def model_call_completions(model_calls: Iterable[Mapping[str, Any]]) -> dict[str, float | None]:
    """When each model call of a trajectory completed, by model call id."""
    return {str(call.get("model_call_id")): call.get("completed_at") for call in model_calls}
