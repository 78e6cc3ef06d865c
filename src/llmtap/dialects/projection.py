"""Canonical projections of a call's request and response: what replay matches and diff compares.

The request projection keeps every part that can change what the model answers (endpoint,
model, every message or input item including tool results, instructions/system, tools and
tool_choice, response format, sampling values, the stream flag) and leaves out the fields that
differ between two runs of the same request without changing the answer. Those volatile fields
are listed here, per dialect, and versioned by `MATCH_KEY_VERSION`: changing the lists changes
every key, so the version goes up with them and replay can refuse a recording keyed otherwise.

Version 1 leaves out:

- everywhere: `user`, `metadata`, `stream_options`, `store`, `service_tier`,
  `safety_identifier`, `prompt_cache_key`, `prompt_cache_retention` (who asked, what to keep,
  routing and caching hints);
- `responses`: `previous_response_id` and `conversation` (ids the provider chose; a replay
  serves the recorded ids, so the chain stays consistent) and, on input items, `id`, `call_id`,
  `encrypted_content` (ids and opaque provider state echoed back);
- `chat`: `tool_call_id` on messages and `id` on a message's `tool_calls`;
- `messages`: `id` on `tool_use` blocks, `tool_use_id` on `tool_result` blocks, `signature` on
  thinking blocks, and `cache_control` on any block, system part or tool.

A missing `stream` is `false`. Only these named places are trimmed: a tool's arguments or a JSON
schema may well hold a key called `id`, and that stays.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import orjson

__all__ = [
    "MATCH_KEY_VERSION",
    "VOLATILE_FIELDS",
    "canonical_bytes",
    "conversation_items",
    "endpoint_for_path",
    "request_part",
    "request_projection",
    "response_text",
    "stable_hash",
]

MATCH_KEY_VERSION = 1

_COMMON_VOLATILE = frozenset(
    {
        "user",
        "metadata",
        "stream_options",
        "store",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
        "prompt_cache_retention",
    }
)

# The documented list, by dialect: top-level keys and keys trimmed at named nested places.
VOLATILE_FIELDS: dict[str, dict[str, frozenset[str]]] = {
    "chat": {
        "top_level": _COMMON_VOLATILE,
        "message": frozenset({"tool_call_id"}),
        "message_tool_call": frozenset({"id"}),
    },
    "responses": {
        "top_level": _COMMON_VOLATILE | {"previous_response_id", "conversation"},
        "input_item": frozenset({"id", "call_id", "encrypted_content"}),
    },
    "messages": {
        "top_level": _COMMON_VOLATILE,
        "block": frozenset({"cache_control"}),
        "tool_use_block": frozenset({"id"}),
        "tool_result_block": frozenset({"tool_use_id"}),
        "thinking_block": frozenset({"signature"}),
        "system_block": frozenset({"cache_control"}),
        "tool": frozenset({"cache_control"}),
    },
}

# Which request part a top-level key belongs to, for "what changed" reports.
_CONVERSATION_KEYS = {"chat": ("messages",), "responses": ("instructions", "input"), "messages": ("system", "messages")}
_TOOL_KEYS = frozenset({"tools", "tool_choice", "parallel_tool_calls", "functions", "function_call"})
_FORMAT_KEYS = frozenset({"response_format", "text", "output_format"})


def endpoint_for_path(path: str) -> str | None:
    """Return the dialect name that owns a request path (suffix match, as in-process capture sees it)."""
    from . import dialect_for_path

    dialect = dialect_for_path(path, exact=False)
    return dialect.name if dialect is not None else None


def _without(item: Mapping[str, Any], keys: frozenset[str]) -> Mapping[str, Any]:
    """The item without `keys`; the item itself (shared, not copied) when it has none of them."""
    if keys.isdisjoint(item):
        return item
    return {key: value for key, value in item.items() if key not in keys}


def _chat_messages(messages: Any) -> Any:
    if not isinstance(messages, list):
        return messages
    rules = VOLATILE_FIELDS["chat"]
    result: list[Any] = []
    for message in messages:
        if not isinstance(message, dict):
            result.append(message)
            continue
        trimmed = _without(message, rules["message"])
        calls = trimmed.get("tool_calls")
        if isinstance(calls, list):
            trimmed = {
                **trimmed,
                "tool_calls": [
                    _without(call, rules["message_tool_call"]) if isinstance(call, dict) else call for call in calls
                ],
            }
        result.append(trimmed)
    return result


def _responses_input(value: Any) -> Any:
    if not isinstance(value, list):
        return value
    keys = VOLATILE_FIELDS["responses"]["input_item"]
    return [_without(item, keys) if isinstance(item, dict) else item for item in value]


def _messages_block(block: Any) -> Any:
    if not isinstance(block, dict):
        return block
    rules = VOLATILE_FIELDS["messages"]
    kind = block.get("type")
    drop = rules["block"]
    if kind in ("tool_use", "server_tool_use"):
        drop = drop | rules["tool_use_block"]
    elif kind == "tool_result" or (isinstance(kind, str) and kind.endswith("_tool_result")):
        drop = drop | rules["tool_result_block"]
    elif kind in ("thinking", "redacted_thinking"):
        drop = drop | rules["thinking_block"]
    trimmed = _without(block, drop)
    if kind == "tool_result" and isinstance(trimmed.get("content"), list):
        trimmed = {**trimmed, "content": [_messages_block(part) for part in trimmed["content"]]}
    return trimmed


def _messages_messages(messages: Any) -> Any:
    if not isinstance(messages, list):
        return messages
    result: list[Any] = []
    for message in messages:
        if isinstance(message, dict) and isinstance(message.get("content"), list):
            message = {**message, "content": [_messages_block(block) for block in message["content"]]}
        result.append(message)
    return result


def _messages_system(system: Any) -> Any:
    if not isinstance(system, list):
        return system
    keys = VOLATILE_FIELDS["messages"]["system_block"]
    return [_without(part, keys) if isinstance(part, dict) else part for part in system]


def _messages_tools(tools: Any) -> Any:
    if not isinstance(tools, list):
        return tools
    keys = VOLATILE_FIELDS["messages"]["tool"]
    return [_without(tool, keys) if isinstance(tool, dict) else tool for tool in tools]


def request_projection(endpoint: str | None, body: Mapping[str, Any] | None, raw: str | None = None) -> dict[str, Any]:
    """Return `{"endpoint": ..., "request": ...}`: the request with the volatile fields left out.

    `endpoint` is the dialect name (None when no dialect owns the path); a body that was not a
    JSON object is projected as its raw text. The result shares nested values with `body`.
    """
    if body is None:
        return {"endpoint": endpoint, "request": None, "request_raw": raw}
    rules = VOLATILE_FIELDS.get(endpoint or "", {"top_level": _COMMON_VOLATILE})
    projected = dict(_without(body, rules["top_level"]))
    projected["stream"] = body.get("stream") is True
    if endpoint == "chat":
        if "messages" in projected:
            projected["messages"] = _chat_messages(projected["messages"])
    elif endpoint == "responses":
        if "input" in projected:
            projected["input"] = _responses_input(projected["input"])
    elif endpoint == "messages":
        if "messages" in projected:
            projected["messages"] = _messages_messages(projected["messages"])
        if "system" in projected:
            projected["system"] = _messages_system(projected["system"])
        if "tools" in projected:
            projected["tools"] = _messages_tools(projected["tools"])
    return {"endpoint": endpoint, "request": projected}


def canonical_bytes(value: Any) -> bytes:
    """Serialize JSON data with sorted keys and no spaces: the same value always gives the same bytes."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # integers beyond 64 bits, non-string keys: the standard library copes
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def stable_hash(value: Any) -> str:
    """Return the SHA-256 hex digest of a value's canonical bytes, prefixed with the key version."""
    digest = hashlib.sha256(b"llmtap-match-v%d\n" % MATCH_KEY_VERSION)
    digest.update(canonical_bytes(value))
    return digest.hexdigest()


def request_part(endpoint: str | None, key: str) -> str:
    """Name the part a top-level request key belongs to: conversation, tools, format, model, stream or sampling."""
    if key in _CONVERSATION_KEYS.get(endpoint or "", ("messages", "input", "system", "instructions")):
        return "conversation"
    if key in _TOOL_KEYS:
        return "tools"
    if key in _FORMAT_KEYS:
        return "format"
    if key in ("model", "stream"):
        return key
    return "sampling"


def conversation_items(endpoint: str | None, request: Mapping[str, Any] | None) -> list[Any]:
    """Return a projected request's conversation as one list: system/instructions first, then each message or item."""
    if request is None:
        return []
    items: list[Any] = []
    keys = _CONVERSATION_KEYS.get(endpoint or "", ("system", "instructions", "messages", "input"))
    for key in keys:
        value = request.get(key)
        if value is None:
            continue
        if key in ("system", "instructions"):
            items.append({"role": "system", "content": value})
        elif isinstance(value, list):
            items.extend(value)
        else:  # Responses `input` as one string
            items.append({"role": "user", "content": value})
    return items


def _parts_text(parts: Any, part_type: str | None) -> list[str]:
    if isinstance(parts, str):
        return [parts]
    if not isinstance(parts, list):
        return []
    return [
        part["text"]
        for part in parts
        if isinstance(part, dict)
        and isinstance(part.get("text"), str)
        and (part_type is None or part.get("type") == part_type)
    ]


def response_text(endpoint: str | None, response: Mapping[str, Any] | None) -> str | None:
    """Return a response's answer text (what `normalize` gives as `output_text`), read without a full normalization.

    Diff reads it for every call of two runs, where a full normalization would be most of its
    cost; a test pins it to `normalize` over every recorded exchange.
    """
    if not isinstance(response, Mapping):
        return None
    found: list[str] = []
    if endpoint == "chat":
        choices = response.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        message = first.get("message") if isinstance(first, dict) else None
        if isinstance(message, dict):
            found = _parts_text(message.get("content"), None)
    elif endpoint == "responses":
        output = response.get("output")
        for item in output if isinstance(output, list) else []:
            if isinstance(item, dict) and item.get("type") == "message":
                found.extend(_parts_text(item.get("content"), "output_text"))
    elif endpoint == "messages":
        found = [
            text
            for text in _parts_text(response.get("content"), "text")
            if not isinstance(response.get("content"), str)
        ]
    text = "".join(found)
    return text or None
