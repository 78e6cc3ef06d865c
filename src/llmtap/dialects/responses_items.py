"""The Responses API's request input and response output as provider-neutral items (see `history`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .base import parse_arguments
from .items import HistoryItem, _item, _mappings, _memoized, _message, _output_text, _str, _with_item_id

__all__ = [
    "CLIENT_CALL_TYPES",
    "continued_response_id",
    "fingerprint_outputs",
    "fingerprint_request_items",
    "request_items",
    "response_outputs",
]

_RESPONSES_TOOL_RESULT_SUFFIX = "_output"
# Built-in Responses tools the client runs itself: their results come back as `*_call_output` input.
CLIENT_CALL_TYPES = frozenset({"computer_call", "local_shell_call", "shell_call", "apply_patch_call"})


def request_items(request: Mapping[str, Any], memo: dict[bytes, list[HistoryItem]] | None = None) -> list[HistoryItem]:
    """Return the model-visible input of a Responses request: `instructions`, then `input`."""
    return _responses_request(request, memo)


def response_outputs(response: Mapping[str, Any]) -> list[list[HistoryItem]] | None:
    """Return the response's `output` as one list of items, or None when it has none."""
    output = response.get("output")
    return [_responses_items(output, default_role="assistant")] if isinstance(output, list) else None


def continued_response_id(request: Mapping[str, Any]) -> str | None:
    """Return the `previous_response_id` a request continues server-side, or None."""
    value = request.get("previous_response_id")
    return value if isinstance(value, str) and value else None


def fingerprint_request_items(request: Mapping[str, Any]) -> list[Any] | None:
    """Return the raw `input` items; `instructions` and a string `input` are not model-authored: []."""
    prompt_input = request.get("input")
    if prompt_input is None or isinstance(prompt_input, str):
        return []
    return list(prompt_input) if isinstance(prompt_input, list) else None


def fingerprint_outputs(response: Mapping[str, Any]) -> list[list[Any]] | None:
    """Return the raw `output` list as the one alternative served, or None."""
    output = response.get("output")
    return [list(output)] if isinstance(output, list) else None


def _responses_request(request: Mapping[str, Any], memo: dict[bytes, list[HistoryItem]] | None) -> list[HistoryItem]:
    items: list[HistoryItem] = []
    instructions = request.get("instructions")
    if isinstance(instructions, str) and instructions:
        items.append(_item("system", "message", text=instructions, provider_type="instructions"))
    elif isinstance(instructions, list):  # a prompt template's expanded instructions are input items
        items.extend(_responses_items(instructions, default_role="system"))
    prompt_input = request.get("input")
    if isinstance(prompt_input, str):
        items.append(_item("user", "message", text=prompt_input))
    elif isinstance(prompt_input, list):
        for entry in prompt_input:
            if isinstance(entry, dict):
                items.extend(_memoized(memo, b"responses:", entry, _responses_input_item))
    return items


def _responses_items(entries: Iterable[Any], *, default_role: str) -> list[HistoryItem]:
    items: list[HistoryItem] = []
    for entry in entries:
        if isinstance(entry, dict):
            items.extend(_responses_item(entry, default_role))
    return items


def _responses_item(entry: Mapping[str, Any], default_role: str) -> list[HistoryItem]:
    return _with_item_id(_responses_item_by_type(entry, default_role), _str(entry.get("id")))


def _responses_item_by_type(entry: Mapping[str, Any], default_role: str) -> list[HistoryItem]:
    kind = entry.get("type")
    role = _str(entry.get("role"))
    if kind in (None, "message"):
        return [_message(role or default_role, entry.get("content"))]
    if kind == "function_call":
        return [_responses_call(entry, parse_arguments(entry.get("arguments")))]
    if kind == "custom_tool_call":
        raw = entry.get("input")
        arguments = {"_raw": raw} if isinstance(raw, str) and not raw.strip() else parse_arguments(raw)
        return [_responses_call(entry, arguments, provider_type="custom_tool_call")]
    if kind == "reasoning":
        return [_responses_reasoning(entry)]
    if kind == "item_reference":
        return [_item(None, "message", provider_type="item_reference", item_id=_str(entry.get("id")))]
    if isinstance(kind, str) and kind.endswith(_RESPONSES_TOOL_RESULT_SUFFIX):
        provider_type = None if kind == "function_call_output" else kind
        return [
            _item(
                "tool",
                "tool_result",
                text=_output_text(entry.get("output")),
                call_id=_str(entry.get("call_id")) or _str(entry.get("id")),
                provider_type=provider_type,
            )
        ]
    if isinstance(kind, str) and kind.endswith("_call"):
        return _responses_builtin_call(entry, kind)
    return [_message(role, entry.get("content"), provider_type=kind if isinstance(kind, str) else "unknown")]


def _responses_input_item(entry: dict[str, Any]) -> list[HistoryItem]:
    return _responses_item(entry, "user")


def _responses_call(entry: Mapping[str, Any], arguments: dict[str, Any], **extra: Any) -> HistoryItem:
    return _item(
        "assistant",
        "tool_call",
        call_id=_str(entry.get("call_id")),
        name=_str(entry.get("name")),
        arguments=arguments,
        **extra,
    )


def _responses_reasoning(entry: Mapping[str, Any]) -> HistoryItem:
    texts = [text for part in _mappings(entry.get("summary")) if (text := _str(part.get("text")))]
    texts += [
        text
        for part in _mappings(entry.get("content"))
        if part.get("type") == "reasoning_text" and (text := _str(part.get("text")))
    ]
    return _item(
        "assistant",
        "reasoning",
        text="\n".join(texts) if texts else None,
        encrypted=isinstance(entry.get("encrypted_content"), str),
    )


def _responses_builtin_call(entry: Mapping[str, Any], kind: str) -> list[HistoryItem]:
    """A built-in tool call (web search, code interpreter, MCP, ...) and the result the model saw."""
    call_id = _str(entry.get("call_id")) or _str(entry.get("id"))
    if "arguments" in entry:
        arguments: dict[str, Any] | None = parse_arguments(entry.get("arguments"))
    elif isinstance(entry.get("action"), dict):
        arguments = dict(entry["action"])
    elif isinstance(entry.get("code"), str):
        arguments = {"code": entry["code"]}
    else:
        arguments = None
    call = _item(
        "assistant",
        "tool_call",
        call_id=call_id,
        name=_str(entry.get("name")) or kind[: -len("_call")],
        arguments=arguments,
        provider_type=kind,
        hosted=kind not in CLIENT_CALL_TYPES,
    )
    output = entry.get("output")
    if output is None:
        return [call]
    result = _item("tool", "tool_result", text=_output_text(output), call_id=call_id, provider_type=kind, hosted=True)
    return [call, result]
