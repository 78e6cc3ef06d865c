"""Chat Completions messages and choices as provider-neutral items (see `history`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import parse_arguments
from .items import HistoryItem, _item, _mappings, _memoized, _message, _output_text, _str

__all__ = ["fingerprint_outputs", "fingerprint_request_items", "request_items", "response_outputs"]


def request_items(
    request: Mapping[str, Any], memo: dict[bytes, list[HistoryItem]] | None = None
) -> list[HistoryItem] | None:
    """Return the model-visible input of a chat request (its `messages`), or None without a list."""
    return _chat_request(request, memo)


def response_outputs(response: Mapping[str, Any]) -> list[list[HistoryItem]] | None:
    """Return each choice's message as items, in index order, or None without `choices`."""
    return _chat_choices(response)


def fingerprint_request_items(request: Mapping[str, Any]) -> list[Any] | None:
    """Return the raw `messages` list, or None when it is not a list."""
    messages = request.get("messages")
    return list(messages) if isinstance(messages, list) else None


def fingerprint_outputs(response: Mapping[str, Any]) -> list[list[Any]] | None:
    """Return each choice's `message` alone, in index order (a choice without an object message serves nothing)."""
    choices = response.get("choices")
    if not isinstance(choices, list):
        return None
    if len(choices) == 1:  # the usual answer, read without sorting: the capture path fingerprints every call
        choice = choices[0]
        message = choice.get("message") if isinstance(choice, dict) else None
        return [[message]] if isinstance(message, dict) else []
    ordered = _choices_in_order(choices)
    return [[choice["message"]] for _, choice in ordered if isinstance(choice.get("message"), dict)]


def _chat_request(request: Mapping[str, Any], memo: dict[bytes, list[HistoryItem]] | None) -> list[HistoryItem] | None:
    messages = request.get("messages")
    if not isinstance(messages, list):
        return None
    items: list[HistoryItem] = []
    for message in messages:
        if isinstance(message, dict):
            items.extend(_memoized(memo, b"chat:", message, _chat_request_message))
    return items


def _chat_request_message(message: dict[str, Any]) -> list[HistoryItem]:
    return _chat_message(message, None)


def _choices_in_order(choices: list[Any]) -> list[tuple[int, Mapping[str, Any]]]:
    """The object choices with their position, ordered by `index` (position when it has none)."""
    return sorted(
        enumerate(_mappings(choices)),
        key=lambda pair: (pair[1].get("index") if isinstance(pair[1].get("index"), int) else pair[0], pair[0]),
    )


def _chat_choices(response: Mapping[str, Any]) -> list[list[HistoryItem]] | None:
    """Each choice's message, in index order; `choice_index` is set only when there are several."""
    choices = response.get("choices")
    if not isinstance(choices, list):
        return None
    ordered = _choices_in_order(choices)
    several = len(ordered) > 1
    outputs: list[list[HistoryItem]] = []
    for position, choice in ordered:
        message = choice.get("message")
        if not isinstance(message, dict):
            continue
        index = choice.get("index") if isinstance(choice.get("index"), int) else position
        outputs.append(_chat_message(message, index if several else None, default_role="assistant"))
    return outputs


def _chat_message(
    message: Mapping[str, Any], choice_index: int | None, *, default_role: str | None = None
) -> list[HistoryItem]:
    role = _str(message.get("role")) or default_role
    if role == "tool":
        return [
            _item(
                "tool",
                "tool_result",
                text=_output_text(message.get("content")),
                call_id=_str(message.get("tool_call_id")),
                choice_index=choice_index,
            )
        ]
    if role == "function":  # the legacy function-calling result
        return [
            _item(
                "tool",
                "tool_result",
                text=_output_text(message.get("content")),
                name=_str(message.get("name")),
                provider_type="function",
            )
        ]
    items: list[HistoryItem] = []
    reasoning = _str(message.get("reasoning_content")) or _str(message.get("reasoning"))
    if reasoning is not None:
        items.append(_item(role, "reasoning", text=reasoning, choice_index=choice_index))
    calls = [_chat_tool_call(call, choice_index) for call in _mappings(message.get("tool_calls"))]
    legacy = message.get("function_call")
    # Some servers (llama.cpp) mirror the first tool call into the legacy field: the same call again.
    if isinstance(legacy, dict) and not calls:
        calls.append(
            _item(
                role,
                "tool_call",
                name=_str(legacy.get("name")),
                arguments=parse_arguments(legacy.get("arguments")),
                provider_type="function_call",
                choice_index=choice_index,
            )
        )
    content = message.get("content")
    refusal = _str(message.get("refusal"))
    if refusal is not None:
        items.append(_item(role, "message", text=refusal, refusal=True, choice_index=choice_index))
    elif content not in (None, "", []) or not calls:
        items.append(_message(role, content, choice_index=choice_index))
    for call in calls:
        call["role"] = role
    items.extend(calls)
    return items


def _chat_tool_call(call: Mapping[str, Any], choice_index: int | None) -> HistoryItem:
    function = call.get("function")
    custom = call.get("custom")
    if isinstance(custom, dict):
        raw = custom.get("input")
        arguments = {"_raw": raw} if isinstance(raw, str) and not raw.strip() else parse_arguments(raw)
        return _item(
            "assistant",
            "tool_call",
            call_id=_str(call.get("id")),
            name=_str(custom.get("name")),
            arguments=arguments,
            provider_type="custom",
            choice_index=choice_index,
        )
    function = function if isinstance(function, dict) else {}
    return _item(
        "assistant",
        "tool_call",
        call_id=_str(call.get("id")),
        name=_str(function.get("name")),
        arguments=parse_arguments(function.get("arguments")),
        choice_index=choice_index,
    )
