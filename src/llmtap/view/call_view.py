"""What the call page shows of one captured call, read provider-neutrally.

The conversation and the response come from `dialects.history` (the same reading trajectories
use), the stream events from the SSE decoder; this module only picks and bounds what to show.
Images are shown only when the capture holds them inline as `data:` URLs of a raster type:
the page never loads anything from elsewhere.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..dialects.history import request_items, response_items
from ..dialects.sse import SSEDecoder, SSEEvent, decode_sse
from ..records import ModelCallRecord, recorded_chunks

__all__ = ["CallView", "build_call_view", "pretty_json"]

MAX_JSON_CHARS = 1_000_000  # longer JSON is cut, with a note, so a huge payload cannot stall the page
MAX_EVENTS = 2000
MAX_IMAGES = 24
MAX_IMAGE_CHARS = 4_000_000
SAMPLING_KEYS = (
    "temperature", "top_p", "top_k", "min_p", "max_tokens", "max_output_tokens", "max_completion_tokens",
    "seed", "stop", "n", "frequency_penalty", "presence_penalty", "reasoning_effort", "reasoning", "thinking",
    "tool_choice", "parallel_tool_calls", "stream",
)  # fmt: skip
_IMAGE_URL = re.compile(r"data:image/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/=\s]+\Z")


def pretty_json(value: Any, limit: int = MAX_JSON_CHARS) -> str:
    """Indented JSON, cut at `limit` characters with a note saying how much was left out."""
    text = orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str).decode()
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n… {len(text) - limit:,} more characters not shown"


@dataclass
class Message:
    """One conversation item as the page draws it."""

    role: str
    kind: str
    text: str | None
    name: str | None = None
    call_id: str | None = None
    arguments: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class CallView:
    """Everything the call page shows beyond the record's own fields."""

    conversation: list[Message] | None
    output: list[Message] | None
    tools: str | None
    tool_count: int
    images: list[str]
    sampling: dict[str, str]
    events: list[tuple[str, str, float | None]]  # (event name, data, arrival in ms from the call's start)
    events_total: int
    record_json: str
    line_json: str


def build_call_view(line: dict[str, Any], record: ModelCallRecord) -> CallView:
    """Read one call's line into what the call page shows."""
    request = record.request
    tools = request.get("tools") if isinstance(request, dict) else None
    events, total = _events(line) if record.stream else ([], 0)
    return CallView(
        conversation=_messages(request_items(record.dialect, request)),
        output=_messages(response_items(record.dialect, record.response)),
        tools=pretty_json(tools) if isinstance(tools, list) and tools else None,
        tool_count=len(tools) if isinstance(tools, list) else 0,
        images=list(_images(request)),
        sampling=_sampling(line, request),
        events=events,
        events_total=total,
        record_json=pretty_json(record.to_dict(include_payloads=False)),
        line_json=pretty_json(line),
    )


def _messages(items: list[dict[str, Any]] | None) -> list[Message] | None:
    if items is None:
        return None
    messages = []
    for item in items:
        notes = []
        if item.get("non_text_parts"):
            notes.append("parts not shown as text: " + ", ".join(str(part) for part in item["non_text_parts"]))
        if item.get("hosted"):
            notes.append("hosted: run by the provider")
        if item.get("encrypted"):
            notes.append("encrypted reasoning (text withheld by the provider)")
        if item.get("is_error"):
            notes.append("tool reported an error")
        if item.get("refusal"):
            notes.append(f"refusal: {item['refusal']}")
        if item.get("provider_type"):
            notes.append(f"type {item['provider_type']}")
        arguments = item.get("arguments")
        messages.append(
            Message(
                role=str(item.get("role") or ("tool" if item.get("type") == "tool_result" else "-")),
                kind=str(item.get("type") or "message"),
                text=item.get("text") if isinstance(item.get("text"), str) else None,
                name=item.get("name") if isinstance(item.get("name"), str) else None,
                call_id=item.get("call_id") if isinstance(item.get("call_id"), str) else None,
                arguments=pretty_json(arguments, 100_000) if arguments is not None else None,
                notes=notes,
            )
        )
    return messages


def _images(value: Any, depth: int = 0) -> Iterator[str]:
    """Inline raster images anywhere in the request (as `data:` URLs), at most MAX_IMAGES."""
    found = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack and found < MAX_IMAGES:
        current, level = stack.pop()
        if isinstance(current, str):
            if current.startswith("data:image/") and len(current) <= MAX_IMAGE_CHARS and _IMAGE_URL.match(current):
                found += 1
                yield "".join(current.split())
        elif level < 32 and isinstance(current, dict):
            stack.extend((item, level + 1) for item in reversed(list(current.values())))
        elif level < 32 and isinstance(current, list):
            stack.extend((item, level + 1) for item in reversed(current))


def _sampling(line: dict[str, Any], request: Any) -> dict[str, str]:
    values: dict[str, str] = {}
    if isinstance(request, dict):
        for key in SAMPLING_KEYS:
            if key in request:
                values[key] = pretty_json(request[key], 2000)
    sampling = line.get("sampling")
    if isinstance(sampling, dict):
        for key, value in sampling.items():
            values[f"x-ng-sampling {key}"] = pretty_json(value, 2000)
    return values


def _raw_response(line: dict[str, Any]) -> bytes | None:
    """The stream's bytes as the line stored them: text, or base64 when they were not UTF-8."""
    if isinstance(line.get("response_raw"), str):
        return str(line["response_raw"]).encode("utf-8")
    if isinstance(line.get("response_raw_base64"), str):
        try:
            return base64.b64decode(line["response_raw_base64"], validate=True)
        except binascii.Error:
            return None
    return None


def _events(line: dict[str, Any]) -> tuple[list[tuple[str, str, float | None]], int]:
    raw = _raw_response(line)
    if not raw:
        return [], 0
    timed = _timed_events(raw, line)
    decoded = timed if timed is not None else [(event, None) for event in decode_sse(raw)]
    shown = [(event.event or "message", event.data[:20_000], at) for event, at in decoded[:MAX_EVENTS]]
    return shown, len(decoded)


def _timed_events(raw: bytes, line: dict[str, Any]) -> list[tuple[SSEEvent, float | None]] | None:
    """Each event with the arrival (ms) of the chunk that completed it; None without trustworthy chunk times."""
    chunks = recorded_chunks(line, raw)
    if chunks is None:
        return None
    decoder = SSEDecoder()
    timed: list[tuple[SSEEvent, float | None]] = []
    for arrival_s, piece in chunks:
        timed.extend((event, arrival_s * 1000.0) for event in decoder.feed(piece))
    timed.extend((event, None) for event in decoder.close())
    return timed
