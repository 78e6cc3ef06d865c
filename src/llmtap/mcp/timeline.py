"""One timeline of a rollout's model calls and the MCP tool calls between them, for `runs show` and `records show`.

A tool call is placed after the model call that asked for it (the last one that started before
it) and before the next, by start time. Each tool call's line says its name, status, duration,
and the sizes of its arguments and result; never their contents.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

__all__ = ["TimelineEntry", "interleave", "tool_call_line"]

TimelineEntry = tuple[str, Any]  # ("model", model call) or ("tool", ToolCallRecord)


def _iso_seconds(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def interleave(model_calls: Sequence[Any], started: Sequence[Any], tool_calls: Sequence[Any]) -> list[TimelineEntry]:
    """Model calls (in their order, each with its start time in `started`: seconds or ISO) and tool calls, by start time."""
    entries: list[tuple[float, int, int, TimelineEntry]] = []
    last = float("-inf")
    for position, (call, start) in enumerate(zip(model_calls, started)):
        at = _iso_seconds(start)
        last = at if at is not None else last  # an unknown start keeps the call where it was
        entries.append((last, 0, position, ("model", call)))
    for position, record in enumerate(tool_calls):
        at = _iso_seconds(getattr(record, "started_at", None))
        entries.append((at if at is not None else float("inf"), 1, position, ("tool", record)))
    entries.sort(key=lambda entry: (entry[0], entry[1], entry[2]))
    return [entry[3] for entry in entries]


def _size(value: Any) -> str:
    return "?" if value is None else f"{value:,} B"


def tool_call_line(record: Any) -> str:
    """`  ↳ tool add  completed  12.3 ms  args 14 B  result 40 B` (method for requests other than tools/call)."""
    what = f"tool {record.name}" if record.method == "tools/call" else f"{record.method} {record.name or ''}".rstrip()
    duration = "?" if record.duration_ms is None else f"{record.duration_ms:.1f} ms"
    result = record.result if isinstance(record.result, dict) else {}
    status = record.status + (" (isError)" if record.is_error else "")
    return (
        f"  -> {what}  {status}  {duration}  args {_size(record.arguments_bytes)}  "
        f"result {_size(result.get('result_bytes'))}  [{record.transport}]"
    )
