"""Anthropic Messages requests and responses as provider-neutral items (see `history`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import parse_arguments
from .items import HistoryItem, _item, _memoized, _message, _output_text, _str, _with_item_id

__all__ = ["fingerprint_outputs", "fingerprint_request_items", "request_items", "response_outputs"]


def request_items(
    request: Mapping[str, Any], memo: dict[bytes, list[HistoryItem]] | None = None
) -> list[HistoryItem] | None:
    """Return the model-visible input of a Messages request: `system`, then `messages`."""
    return _messages_request(request, memo)


def response_outputs(response: Mapping[str, Any]) -> list[list[HistoryItem]] | None:
    """Return the message's `content` blocks as one list of items, marked with the message id."""
    content = response.get("content")
    if not isinstance(content, (list, str)):
        return None
    return [_with_item_id(_messages_content("assistant", content), _str(response.get("id")))]


def fingerprint_request_items(request: Mapping[str, Any]) -> list[Any] | None:
    """Return the raw `messages` list (`system` is not model-authored), or None when it is not a list."""
    messages = request.get("messages")
    return list(messages) if isinstance(messages, list) else None


def fingerprint_outputs(response: Mapping[str, Any]) -> list[list[Any]] | None:
    """Return the response itself: an assistant message whose `content` holds its text and `tool_use` calls."""
    return [[dict(response)]] if isinstance(response.get("content"), (list, str)) else None


_MESSAGES_CALL_TYPES = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})
_MESSAGES_INLINE_TYPES = frozenset({"text", "image", "document", "search_result"})


def _messages_request(
    request: Mapping[str, Any], memo: dict[bytes, list[HistoryItem]] | None
) -> list[HistoryItem] | None:
    messages = request.get("messages")
    if not isinstance(messages, list):
        return None
    items: list[HistoryItem] = []
    system = request.get("system")
    if isinstance(system, (str, list)) and system:
        items.append(_message("system", system, provider_type="system"))
    for message in messages:
        if isinstance(message, dict) and isinstance(message.get("content"), (str, list)):
            items.extend(_memoized(memo, b"messages:", message, _messages_message))
    return items


def _messages_message(message: dict[str, Any]) -> list[HistoryItem]:
    return _messages_content(_str(message.get("role")), message["content"])


def _messages_content(role: str | None, content: str | list[Any]) -> list[HistoryItem]:
    """One message's blocks: adjacent text, image and document blocks form one message item."""
    if isinstance(content, str):
        return [_item(role, "message", text=content)]
    items: list[HistoryItem] = []
    inline: list[Any] = []

    def flush() -> None:
        if inline:
            items.append(_message(role, list(inline)))
            inline.clear()

    for block in content:
        if isinstance(block, str):
            inline.append(block)
            continue
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if isinstance(kind, str) and kind in _MESSAGES_INLINE_TYPES:  # an unhashable type is no type
            inline.append(block)
            continue
        flush()
        items.append(_messages_block(role, block, kind))
    flush()
    return items


def _messages_block(role: str | None, block: Mapping[str, Any], kind: Any) -> HistoryItem:
    provider_type = kind if isinstance(kind, str) else "unknown"
    if isinstance(kind, str) and kind in _MESSAGES_CALL_TYPES:
        return _item(
            role,
            "tool_call",
            call_id=_str(block.get("id")),
            name=_str(block.get("name")),
            arguments=parse_arguments(block.get("input")),
            provider_type=None if kind == "tool_use" else provider_type,
            hosted=kind != "tool_use",
        )
    if kind == "thinking":
        return _item(role, "reasoning", text=_str(block.get("thinking")))
    if kind == "redacted_thinking":
        return _item(role, "reasoning", encrypted=True, provider_type=provider_type)
    if isinstance(kind, str) and kind.endswith("tool_result"):
        return _item(
            "tool",
            "tool_result",
            text=_output_text(block.get("content")),
            call_id=_str(block.get("tool_use_id")),
            is_error=block.get("is_error") is True,
            provider_type=None if kind == "tool_result" else provider_type,
            hosted=kind != "tool_result",
        )
    return _item(role, "message", provider_type=provider_type)
