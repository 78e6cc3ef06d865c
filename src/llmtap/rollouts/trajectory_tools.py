"""The tool calls of a trajectory: what the model asked for, the output it was shown, how each ran.

Each entry joins a tool call the model made to the agent's own observation of it (exactly, by
invocation and tool call id), then fills what the agent did not report from MCP calls recorded on
the wire; a client-run call with no timing at all is counted as a gap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from llmtap.dialects.history import HistoryItem

from .observations import AgentObservations, ToolCallObservation
from .trajectory_merge import untimed_tool_calls
from .wire_tools import fill_from_wire

if TYPE_CHECKING:
    from .trajectory import ProjectedCall

__all__ = ["tool_calls"]


def tool_calls(
    calls: list[ProjectedCall],
    observations: AgentObservations | None,
    gaps: list[dict[str, Any]],
    wire_records: Sequence[Any] = (),
) -> list[dict[str, Any]]:
    """Tool calls the model made, with the output it was shown and the execution the agent observed."""
    observed: dict[tuple[str, str], ToolCallObservation] = {}
    by_call_id: dict[str, list[ToolCallObservation]] = {}
    for observation in observations.tool_calls if observations is not None else []:
        observed.setdefault((observation.invocation_id, observation.tool_call_id), observation)
        by_call_id.setdefault(observation.tool_call_id, []).append(observation)
    results: dict[str, tuple[HistoryItem, str]] = {}
    for call in calls:
        new_items = (call.input_items or [])[call.new_start :] + call.output_items
        for item in new_items:
            if item["type"] == "tool_result" and item["call_id"]:
                results.setdefault(item["call_id"], (item, call.record.model_call_id))
    entries: list[dict[str, Any]] = []
    seen: set[tuple[str | None, str]] = set()
    used: set[int] = set()
    for call in calls:
        hosted_ids = {item["call_id"] for item in call.output_items if item["type"] == "tool_result"}
        for item in call.output_items:
            if item["type"] != "tool_call":
                continue
            tool_call_id = item["call_id"]
            if tool_call_id is not None and (call.invocation_id, tool_call_id) in seen:
                continue
            if tool_call_id is not None:
                seen.add((call.invocation_id, tool_call_id))
            matched: ToolCallObservation | None = None
            if tool_call_id is not None and call.invocation_id is not None:
                matched = observed.get((call.invocation_id, tool_call_id))
            elif tool_call_id is not None and len(by_call_id.get(tool_call_id, [])) == 1:
                # The call's invocation is unknown: only a tool call id observed exactly once joins.
                matched = by_call_id[tool_call_id][0]
            hosted = tool_call_id in hosted_ids
            result = results.get(tool_call_id) if tool_call_id else None
            entry = _tool_entry(item, call, matched, result, hosted)
            if matched is not None:
                used.add(id(matched))
            entries.append(entry)
    for observation in observations.tool_calls if observations is not None else []:
        if id(observation) not in used:
            entries.append(_tool_entry(None, None, observation, results.get(observation.tool_call_id), False))
    if wire_records:  # MCP calls recorded on the wire fill what the agent did not report
        fill_from_wire(entries, wire_records, {call.record.model_call_id: call.record.completed_at for call in calls})
    # A client-run tool call without any timing, observed or not: the same count a merge recomputes.
    untimed = untimed_tool_calls(entries)
    if untimed:
        gaps.append({"code": "tool_timing_unavailable", "source": "trajectory", "detail": f"count={untimed}"})
    return entries


def _tool_entry(
    item: HistoryItem | None,
    call: ProjectedCall | None,
    observation: ToolCallObservation | None,
    result: tuple[HistoryItem, str] | None,
    hosted: bool,
) -> dict[str, Any]:
    result_item, result_call = result if result is not None else (None, None)
    if observation is not None:
        status = observation.status
    else:
        status = "failed" if result_item is not None and result_item.get("is_error") else "unknown"
    output = observation.output if observation is not None and observation.output is not None else None
    if output is None and result_item is not None:
        output = result_item["text"]
    return {
        "invocation_id": observation.invocation_id if observation else call.invocation_id if call else None,
        "tool_call_id": item["call_id"] if item is not None else observation.tool_call_id if observation else None,
        "tool_name": (item["name"] if item is not None else None) or (observation.tool_name if observation else None),
        "arguments": item["arguments"] if item is not None else None,
        "requested_by_model_call_id": call.record.model_call_id if call is not None else None,
        "thread_id": call.thread_id if call is not None else None,
        "hosted": hosted,
        "status": status,
        "output": output,
        "output_model_call_id": result_call,
        "started_at": observation.started_at if observation else None,
        "completed_at": observation.completed_at if observation else None,
        "duration_ms": observation.duration_ms if observation else None,
        "timing_source": observation.timing_source if observation else None,
        "clock_id": observation.clock_id if observation else None,
        "sandbox_id": observation.sandbox_id if observation else None,
        "error_type": observation.error_type if observation else None,
    }
