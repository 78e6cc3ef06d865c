"""One call as the diff sees it, and what changed between two paired calls.

`CallView` is computed once per call: its request projection and match key, its response outcome
(text, tool calls, finish reason), its alignment signature and a hash of everything the diff
compares. `compare_calls` details a changed pair: which request parts changed (JSON Pointers,
message index), a bounded text diff of the answer, tool calls, finish reason, tokens, latency,
TTFT and errors. Without payloads (rows attached without them) calls compare on their normalized
fields only.
"""

from __future__ import annotations

import difflib
from typing import Any

from ..dialects.projection import canonical_bytes, conversation_items, request_part, response_text, stable_hash
from ..replay.matching import json_differences, match_key, record_projection, short_value
from .alignment import CallSignature, signature

__all__ = ["MAX_TEXT_DIFF_LINES", "CallView", "call_view", "compare_calls", "describe_call"]

# Bounds on what a changed call's detail holds.
MAX_REQUEST_DIFFERENCES = 8
MAX_TEXT_DIFF_LINES = 40
MAX_TEXT_DIFF_INPUT = 20_000
MAX_DIFF_LINE_CHARS = 200
TOKEN_FIELDS = (
    ("in", "tokens_in"),
    ("out", "tokens_out"),
    ("reasoning", "tokens_reasoning"),
    ("cached", "cached_tokens"),
)


class CallView:
    """A call read for comparison: the record, its request projection, its answer, and what decides "unchanged".

    `exact` is a hash of everything compared; the alignment `signature` (per-item conversation
    hashes) is built only when asked for, since rollouts whose calls are all identical never need it.
    """

    __slots__ = ("_signature", "exact", "line", "outcome", "projection", "record", "request_key")

    def __init__(self, record: Any, line: int | None, *, payloads: bool) -> None:
        self.record = record
        self.line = line
        self._signature: CallSignature | None = None
        compared: dict[str, Any] = {
            "model": record.model,
            "status_code": record.status_code,
            "error_category": record.error_category,
            "finish_reason": record.finish_reason_normalized,
            "tool_calls": _tool_calls(record),
            "refusal": record.refusal,
            "tokens": [record.tokens_in, record.tokens_out, record.tokens_reasoning],
        }
        self.projection: dict[str, Any] | None = None
        self.outcome: dict[str, Any] | None = None
        self.request_key: str | None = None
        if payloads and (record.request is not None or record.request_raw is not None):
            self.projection = record_projection(record)
            self.request_key = match_key(self.projection)
            self.outcome = {"output_text": response_text(record.dialect, record.response)}
            compared["request"] = self.request_key
            compared["output_text"] = self.outcome["output_text"]
        self.exact = stable_hash(compared)

    @property
    def signature(self) -> CallSignature:
        if self._signature is None:
            self._signature = self._build_signature()
        return self._signature

    def _build_signature(self) -> CallSignature:
        record = self.record
        endpoint = record.dialect
        if self.projection is None:
            return signature(
                endpoint, record.model, None, prefix_length=0, settings=None, request_key=None, exact=self.exact
            )
        request = self.projection.get("request")
        requested = request.get("model") if isinstance(request, dict) else None
        model = requested if isinstance(requested, str) else record.model  # what the agent asked for
        items = conversation_items(endpoint, request)
        settings = None
        if isinstance(request, dict):
            settings = stable_hash(
                {
                    key: value
                    for key, value in request.items()
                    if request_part(endpoint, key) not in ("conversation", "model")
                }
            )
        return signature(
            endpoint,
            model,
            [_item_hash(item) for item in items],
            prefix_length=_prefix_length(items),
            settings=settings,
            request_key=self.request_key,
            exact=self.exact,
        )

    @property
    def tool_names(self) -> list[str]:
        return [str(call.get("name")) for call in self.record.tool_calls if isinstance(call, dict)]


def _item_hash(item: Any) -> str:
    # Compared within one process only, so the built-in hash of the canonical bytes is enough.
    return str(hash(canonical_bytes(item)))


def _prefix_length(items: list[Any]) -> int:
    """How many leading conversation items make the task: up to and including the first user message."""
    for index, item in enumerate(items):
        if isinstance(item, dict) and item.get("role") == "user":
            return index + 1
    return min(1, len(items))


def _tool_calls(record: Any) -> list[dict[str, Any]]:
    return [
        {"name": call.get("name"), "arguments": call.get("arguments")}
        for call in record.tool_calls
        if isinstance(call, dict)
    ]


def call_view(record: Any, *, payloads: bool, line: int | None = None) -> CallView:
    """Read one `ModelCallRecord` for comparison; `payloads=False` ignores request and response bodies."""
    return CallView(record, line, payloads=payloads)


def describe_call(view: CallView) -> dict[str, Any]:
    """Return the short description of an added or removed call."""
    record = view.record
    return {
        "call_index": record.call_index,
        "line": view.line,
        "endpoint": record.dialect,
        "model": record.model,
        "tool_calls": view.tool_names,
        "finish_reason": record.finish_reason_normalized,
        "error_category": record.error_category,
        "tokens_in": record.tokens_in,
        "tokens_out": record.tokens_out,
        "latency_ms": record.latency_total_ms,
    }


def _pointer_detail(endpoint: str | None, pointer: str) -> dict[str, Any]:
    """Name the request part a pointer falls in, and the message index for the conversation."""
    tokens = pointer.split("/")[1:]
    if not tokens or tokens[0] != "request" or len(tokens) < 2:
        return {"part": "request", "message_index": None}
    key = tokens[1].replace("~1", "/").replace("~0", "~")
    part = request_part(endpoint, key)
    index = int(tokens[2]) if part == "conversation" and len(tokens) > 2 and tokens[2].isdigit() else None
    return {"part": part, "field": key, "message_index": index}


def _request_changes(a: CallView, b: CallView) -> dict[str, Any]:
    if a.projection is None or b.projection is None or a.request_key == b.request_key:
        return {"parts": [], "differences": [], "more_differences": 0}
    differences, total = json_differences(a.projection, b.projection, limit=MAX_REQUEST_DIFFERENCES)
    endpoint = a.record.dialect
    details = [{**difference.to_dict(), **_pointer_detail(endpoint, difference.pointer)} for difference in differences]
    parts = sorted({detail["part"] for detail in details})
    return {"parts": parts, "differences": details, "more_differences": total - len(details)}


def _bounded_text(text: Any) -> list[str]:
    if not isinstance(text, str):
        return []
    return text[:MAX_TEXT_DIFF_INPUT].splitlines()


def text_diff(before: Any, after: Any) -> list[str]:
    """A unified diff of two answers, at most `MAX_TEXT_DIFF_LINES` lines of at most `MAX_DIFF_LINE_CHARS`."""
    lines = difflib.unified_diff(_bounded_text(before), _bounded_text(after), "before", "after", lineterm="", n=1)
    result: list[str] = []
    for line in lines:
        if len(result) == MAX_TEXT_DIFF_LINES:
            result.append("… (diff cut)")
            break
        result.append(line if len(line) <= MAX_DIFF_LINE_CHARS else line[: MAX_DIFF_LINE_CHARS - 1] + "…")
    return result


def _change(before: Any, after: Any) -> dict[str, Any]:
    delta = after - before if isinstance(before, (int, float)) and isinstance(after, (int, float)) else None
    return {"before": before, "after": after, "delta": None if delta is None else round(delta, 3)}


def _short_tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": call.get("name"), "arguments": short_value(call.get("arguments"))} for call in calls]


def compare_calls(a: CallView, b: CallView) -> dict[str, Any]:
    """Detail what changed between two paired calls (bounded: excerpts and a cut text diff, never whole prompts)."""
    ra, rb = a.record, b.record
    detail: dict[str, Any] = {
        "a_call_index": ra.call_index,
        "b_call_index": rb.call_index,
        "b_line": b.line,
        "endpoint": rb.dialect,
        "model": {"before": ra.model, "after": rb.model},
        "request": _request_changes(a, b),
    }
    text_a = a.outcome.get("output_text") if a.outcome else None
    text_b = b.outcome.get("output_text") if b.outcome else None
    detail["response_text_diff"] = text_diff(text_a, text_b) if text_a != text_b else []
    calls_a, calls_b = _tool_calls(ra), _tool_calls(rb)
    detail["tool_calls"] = (
        {"before": _short_tool_calls(calls_a), "after": _short_tool_calls(calls_b)} if calls_a != calls_b else None
    )
    finish_a, finish_b = ra.finish_reason_normalized, rb.finish_reason_normalized
    detail["finish_reason"] = {"before": finish_a, "after": finish_b} if finish_a != finish_b else None
    detail["tokens"] = {
        name: _change(getattr(ra, attribute), getattr(rb, attribute))
        for name, attribute in TOKEN_FIELDS
        if getattr(ra, attribute) != getattr(rb, attribute)
    }
    detail["latency_ms"] = _change(ra.latency_total_ms, rb.latency_total_ms)
    detail["ttft_ms"] = _change(ra.latency_ttft_ms, rb.latency_ttft_ms)
    errors_differ = ra.error_category != rb.error_category or ra.status_code != rb.status_code
    detail["error"] = (
        {
            "before": ra.error_category,
            "after": rb.error_category,
            "status_before": ra.status_code,
            "status_after": rb.status_code,
        }
        if errors_differ
        else None
    )
    detail["became_error"] = ra.error_category is None and rb.error_category is not None
    return detail
