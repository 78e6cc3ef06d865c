"""The provider-neutral item every dialect reads its request and response content into.

`dialects.history` documents the item's keys; each dialect's `*_items` module builds its items
with these helpers, so the six core keys and the optional ones mean the same in every dialect.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

__all__ = ["HISTORY_ITEM_KEYS", "HISTORY_ITEM_TYPES", "HistoryItem"]

HistoryItem = dict[str, Any]

HISTORY_ITEM_TYPES = ("message", "tool_call", "tool_result", "reasoning")
HISTORY_ITEM_KEYS = ("role", "type", "text", "call_id", "name", "arguments")

_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})


def _memoized(
    memo: dict[bytes, list[HistoryItem]] | None,
    tag: bytes,
    entry: dict[str, Any],
    read: Callable[[dict[str, Any]], list[HistoryItem]],
) -> list[HistoryItem]:
    """Read one message through the memo, keyed by its exact JSON (and how it is read)."""
    if memo is None:
        return read(entry)
    try:
        key = tag + orjson.dumps(entry)
    except TypeError:
        return read(entry)
    found = memo.get(key)
    if found is None:
        found = memo[key] = read(entry)
    return found


def _item(
    role: str | None,
    kind: str,
    *,
    text: str | None = None,
    call_id: str | None = None,
    name: str | None = None,
    arguments: dict[str, Any] | None = None,
    **extra: Any,
) -> HistoryItem:
    item: HistoryItem = {
        "role": role,
        "type": kind,
        "text": text,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }
    # Optional keys appear only when they say something: no None, False or empty list.
    item.update(
        (key, value) for key, value in extra.items() if value is not None and value is not False and value != []
    )
    return item


def _with_item_id(items: list[HistoryItem], item_id: str | None) -> list[HistoryItem]:
    """Mark items with the server id of what they were read from (kept when already set)."""
    if item_id is not None:
        for item in items:
            item.setdefault("item_id", item_id)
    return items


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _mappings(value: Any) -> list[Mapping[str, Any]]:
    return [entry for entry in value if isinstance(entry, dict)] if isinstance(value, list) else []


def _parts_text(content: Any) -> tuple[str | None, list[str], bool]:
    """Read message content (a string or a list of parts): text, non-text part types, refusal seen."""
    if isinstance(content, str):
        return content, [], False
    texts: list[str] = []
    others: list[str] = []
    refusal = False
    for part in content if isinstance(content, list) else []:
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            continue
        part_type = part.get("type")
        if part_type in _TEXT_PART_TYPES and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif part_type == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
            refusal = True
        else:
            others.append(part_type if isinstance(part_type, str) else "unknown")
    return ("\n".join(texts) if texts else None), others, refusal


def _message(role: str | None, content: Any, **extra: Any) -> HistoryItem:
    text, others, refusal = _parts_text(content)
    return _item(role, "message", text=text, non_text_parts=others, refusal=refusal, **extra)


def _output_text(value: Any) -> str | None:
    """A tool output: a string as is, text parts joined, anything else as compact JSON."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        text, _others, _refusal = _parts_text(value)
        if text is not None:
            return text
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode("utf-8")
    except TypeError:
        return None
