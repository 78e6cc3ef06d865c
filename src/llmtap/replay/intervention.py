"""Intervention replay: a mocked replay with one recorded call's response, or one tool result, replaced from a file.

The override file is JSON (read as JSON only, bounded in size; it is input from outside). What
if the model had answered otherwise:

    {"rollout_id": "0-0", "call_index": 3, "response": {...}}            # a JSON response body
    {"rollout_id": "0-0", "call_index": 3, "response_raw": "data: ..."}  # a raw body or event stream

optionally with "status_code": the replaced call answers with that body; every other call is
served from the recording as in mocked mode. What if a tool had returned something else:

    {"tool": "search", "occurrence": 0, "text": "no results"}            # what a tool returning a string gives
    {"tool": "search", "occurrence": 0, "result": {"content": [...], "isError": true}}

the `occurrence`-th (from 0; default 0) MCP `tools/call` of that tool the workload makes gets
this result (an MCP `CallToolResult`) instead of the server's answer, as the agent's MCP client
returns it (`hooks.mcp`; the server is not asked). Either way the agent's next requests then
usually differ from the recording: they are misses, or with `--on-miss passthrough` go to the
live model, which is the experiment.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import orjson

from ..errors import LlmtapError

__all__ = ["MAX_OVERRIDE_BYTES", "InterventionError", "ToolResultOverride", "load_override"]

MAX_OVERRIDE_BYTES = 16 * 1024 * 1024


class InterventionError(LlmtapError):
    """Raised when an intervention file cannot be used: missing, a link, too large, or not the expected JSON."""


@dataclass(frozen=True)
class ToolResultOverride:
    """The `occurrence`-th MCP call of tool `tool` answers with `result` (a `CallToolResult` as JSON)."""

    tool: str
    occurrence: int
    result: dict[str, Any]


# A response override: (rollout id, call index, the line fields that replace the recorded answer).
ResponseOverride = tuple[str, int, dict[str, Any]]
Override = Union[ResponseOverride, ToolResultOverride]


def _read_bounded(path: Path) -> bytes:
    from ..capsule.writer import FileTooLargeError, NotRegularFileError, read_regular_file

    try:
        return read_regular_file(path, limit=MAX_OVERRIDE_BYTES)
    except FileTooLargeError as exc:
        raise InterventionError(
            f"Could not read the intervention file '{path}': {exc.size} bytes is over {MAX_OVERRIDE_BYTES}."
        ) from exc
    except NotRegularFileError as exc:
        raise InterventionError(f"Could not read the intervention file '{path}': it is not a regular file.") from exc
    except OSError as exc:
        raise InterventionError(
            f"Could not open the intervention file '{path}' ({exc.strerror}); pass a regular JSON file, not a link."
        ) from exc


def _tool_override(path: Path, value: dict[str, Any]) -> ToolResultOverride:
    tool, occurrence = value.get("tool"), value.get("occurrence", 0)
    counted = isinstance(occurrence, int) and not isinstance(occurrence, bool) and occurrence >= 0
    if not isinstance(tool, str) or not tool or not counted:
        raise InterventionError(
            f"The intervention file '{path}' must name 'tool' (a tool name) "
            "and may give 'occurrence' (an integer from 0)."
        )
    if isinstance(value.get("text"), str):
        text = value["text"]
        # The SDK's own form for a tool that returns a string: a text block, and {"result": text}
        # as structured content (which a client checks against a tool's output schema).
        result: Any = {
            "content": [{"type": "text", "text": text}],
            "structuredContent": {"result": text},
            "isError": value.get("is_error") is True,
        }
    else:
        result = value.get("result")
    content = result.get("content") if isinstance(result, dict) else None
    typed = isinstance(content, list) and all(isinstance(b, dict) and isinstance(b.get("type"), str) for b in content)
    if not typed:
        raise InterventionError(
            f"The intervention file '{path}' must give the tool's result as 'text' (a string) or 'result' "
            "(an MCP CallToolResult: an object whose 'content' lists blocks with a 'type')."
        )
    return ToolResultOverride(tool, occurrence, result)


def load_override(path: Path) -> Override:
    """Read an intervention file: a `ToolResultOverride`, or (rollout id, call index, the line fields
    that replace the recorded answer)."""
    data = _read_bounded(path)
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InterventionError(f"Could not read the intervention file '{path}': it is not JSON ({exc}).") from exc
    if not isinstance(value, dict):
        raise InterventionError(f"The intervention file '{path}' must hold a JSON object.")
    if "tool" in value:
        return _tool_override(path, value)
    rollout_id, call_index = value.get("rollout_id", "default"), value.get("call_index")
    if not isinstance(rollout_id, str) or isinstance(call_index, bool) or not isinstance(call_index, int):
        raise InterventionError(
            f"The intervention file '{path}' must name 'rollout_id' (a string) and 'call_index' (an integer)."
        )
    fields: dict[str, Any] = {}
    if isinstance(value.get("response_raw"), str):
        fields.update({"response_raw": value["response_raw"], "response": None})
    elif isinstance(value.get("response"), dict):
        fields.update(
            {
                "response": value["response"],
                "response_raw": None,
                "response_raw_base64": None,
                "response_body_crc32": None,  # the recorded body's check: not this one's
                "stream": False,
            }
        )
    else:
        raise InterventionError(
            f"The intervention file '{path}' must hold 'response' (a JSON object) or 'response_raw' (a string)."
        )
    status = value.get("status_code")
    if isinstance(status, int) and not isinstance(status, bool) and 100 <= status <= 599:
        fields["status_code"] = status
    return rollout_id, call_index, fields
