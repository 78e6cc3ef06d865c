"""Where the three providers' item shapes hold model-authored content and tool calls, read raw.

The content fingerprint (`records.fingerprint`, specs/content-fingerprint.md) hashes a list of
items of any dialect, mixed freely: Responses items, chat messages, Anthropic messages. Which
part types are text, which blocks are tool calls and where each shape keeps a call's id, name
and arguments is provider knowledge, so it lives here; the fingerprint applies its canonical
forms (and its bytes) to what these functions return. Both raise `UnreadableContent` for input
the page calls unreadable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import LlmtapError

__all__ = ["UnreadableContent", "content_parts", "tool_calls"]

_TEXT_TYPES = frozenset({"", "text", "input_text", "output_text"})
_SKIPPED_BLOCK_TYPES = frozenset({"tool_use", "tool_result"})


class UnreadableContent(LlmtapError, ValueError):
    """Raised when items cannot be fingerprinted by the page's rules; the witness abstains with the reason."""


def content_parts(content: Any) -> list[tuple[str, Any]]:
    """Return an item's content parts in order: `("text", text)` for a text part, `(type, block)` for
    any other block (the caller takes its canonical JSON). Empty texts and tool blocks give nothing."""
    if content is None:
        return []
    if isinstance(content, str):
        return [("text", content)] if content else []
    if not isinstance(content, list):
        raise UnreadableContent(f"An item's content is a {type(content).__name__}, not a string or a list of parts.")
    parts: list[tuple[str, Any]] = []
    for block in content:
        if isinstance(block, str):
            if block:
                parts.append(("text", block))
            continue
        if not isinstance(block, dict):
            raise UnreadableContent(f"A content part is a {type(block).__name__}, not a string or an object.")
        block_type = str(block.get("type") or "")
        if block_type in _SKIPPED_BLOCK_TYPES:  # tool_use is read as a tool call; tool_result is not model output
            continue
        text = block.get("text")
        if block_type in _TEXT_TYPES and isinstance(text, str):
            if text:
                parts.append(("text", text))
            continue
        if not block_type:
            raise UnreadableContent("A content part has neither a type nor a string text.")
        parts.append((block_type, block))
    return parts


def _str_or_empty(value: Any) -> str:
    """The page's `str(x or "")` for ids: a falsy id is no id."""
    return str(value or "")


def tool_calls(item: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """Return an item's tool calls as `(id, name, raw arguments)`, in the page's order: a Responses
    `function_call` (namespaced name flattened), Anthropic `tool_use` blocks, then chat `tool_calls`."""
    calls: list[tuple[str, str, Any]] = []
    if item.get("type") == "function_call":
        name = str(item.get("name", ""))
        namespace = item.get("namespace")
        if namespace:  # a namespaced tool is flattened to `<namespace>__<name>` on its way to the backend
            name = f"{namespace}__{name}"
        call_id = _str_or_empty(item.get("call_id") or item.get("id"))
        calls.append((call_id, name, item.get("arguments")))
    content = item.get("content")
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                calls.append((_str_or_empty(block.get("id")), str(block.get("name", "")), block.get("input")))
    chat_calls = item.get("tool_calls")
    if not chat_calls:
        return calls
    if not isinstance(chat_calls, list):
        raise UnreadableContent(f"A message's tool_calls is a {type(chat_calls).__name__}, not a list.")
    for element in chat_calls:
        element = element or {}
        if not isinstance(element, dict):
            raise UnreadableContent(f"A tool_calls element is a {type(element).__name__}, not an object.")
        function = element.get("function") or {}
        if not isinstance(function, dict):
            raise UnreadableContent(f"A tool call's function is a {type(function).__name__}, not an object.")
        calls.append((_str_or_empty(element.get("id")), str(function.get("name", "")), function.get("arguments")))
    return calls
