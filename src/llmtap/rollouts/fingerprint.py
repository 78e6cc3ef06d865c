"""The content fingerprint, version 2: the byte-exact hash terminal attribution compares.

The reference system's lineage-aware writers and token-free custody rows store fingerprints
computed by one algorithm (specs/content-fingerprint.md); llmtap computes exactly the same bytes,
so a stored `output_fingerprint` or `continuation_fingerprint` of version 2 is comparable with
what is computed here, and any fingerprint llmtap stores is this one.

The input is a list of items: Responses items, chat messages or Anthropic messages, mixed freely.
An item is model-authored when `role == "assistant"` or `type == "function_call"`; only those
feed the hash (user, system, developer and tool turns, tool outputs, reasoning and a roleless
message contribute nothing). SHA-256 starts with the domain `nemo-gym-lineage`; each
model-authored item feeds its content parts (field 0x00 part type, 0x01 payload) and then its
tool calls (0x02 id, 0x03 name, 0x04 canonical arguments), each field a tag byte, the UTF-8
length as 8 big-endian bytes, then the bytes. No model-authored item gives `""`; input the page
calls unreadable raises `UnreadableContent`, which every caller turns into an abstention.

The same turn in chat, Responses and Anthropic shape feeds the same fields, so it fingerprints
identically. Which list of raw items a request or response holds is provider knowledge and lives
in `dialects.history` (`fingerprint_request_items`, `fingerprint_outputs`); this module applies
the page's rules to whatever items it is given.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from ..dialects.history import fingerprint_outputs, fingerprint_request_items
from ..errors import LlmtapError

__all__ = [
    "FINGERPRINT_VERSION",
    "ItemContent",
    "UnreadableContent",
    "canonical_arguments",
    "canonical_json",
    "continuation_fingerprint",
    "fingerprint",
    "is_model_authored",
    "output_fingerprint",
    "read_item",
    "version_counts",
]

FINGERPRINT_VERSION = 2

_DOMAIN = b"nemo-gym-lineage"
_PART_TYPE, _PART_PAYLOAD, _CALL_ID, _CALL_NAME, _CALL_ARGUMENTS = b"\x00", b"\x01", b"\x02", b"\x03", b"\x04"
_TEXT_TYPES = frozenset({"", "text", "input_text", "output_text"})
_SKIPPED_BLOCK_TYPES = frozenset({"tool_use", "tool_result"})


class UnreadableContent(LlmtapError, ValueError):
    """Raised when items cannot be fingerprinted by the page's rules; the witness abstains with the reason."""


@dataclass(frozen=True, slots=True)
class ItemContent:
    """What one model-authored item feeds the hash: typed content parts, then tool calls."""

    parts: tuple[tuple[str, str], ...]
    calls: tuple[tuple[str, str, str], ...]


def is_model_authored(item: Mapping[str, Any]) -> bool:
    """True for an assistant turn or a Responses `function_call`; a roleless message is not model output."""
    return item.get("role") == "assistant" or item.get("type") == "function_call"


def canonical_json(value: Any) -> str:
    """Serialize a JSON value with sorted keys, no whitespace, raw UTF-8 and shortest round-trip floats.

    NaN and Infinity become `null` (orjson's rule); an integer outside [-2^63, 2^64-1], a lone
    surrogate or a value that is not JSON is unreadable.
    """
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode("utf-8")
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise UnreadableContent(
            f"A content value is not serializable as canonical JSON ({type(value).__name__})."
        ) from exc


def canonical_arguments(value: Any) -> str:
    """Return tool arguments in a form re-serialization does not change.

    None gives `""`; a string is parsed as JSON (Python's `json`, so NaN/Infinity parse and the
    last duplicate key wins) and re-serialized canonically, or used stripped when it does not
    parse; anything else is `canonical_json(value)`. The string `"null"` gives `null`, not `""`.
    """
    if value is None:
        return ""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value.strip()
        except RecursionError as exc:
            raise UnreadableContent("Tool arguments nest too deeply to be read.") from exc
        return canonical_json(parsed)
    return canonical_json(value)


def _content_parts(content: Any) -> list[tuple[str, str]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [("text", content)] if content else []
    if not isinstance(content, list):
        raise UnreadableContent(f"An item's content is a {type(content).__name__}, not a string or a list of parts.")
    parts: list[tuple[str, str]] = []
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
        parts.append((block_type, canonical_json(block)))
    return parts


def _str_or_empty(value: Any) -> str:
    """The page's `str(x or "")` for ids: a falsy id is no id."""
    return str(value or "")


def _tool_calls(item: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    calls: list[tuple[str, str, str]] = []
    if item.get("type") == "function_call":
        name = str(item.get("name", ""))
        namespace = item.get("namespace")
        if namespace:  # a namespaced tool is flattened to `<namespace>__<name>` on its way to the backend
            name = f"{namespace}__{name}"
        call_id = _str_or_empty(item.get("call_id") or item.get("id"))
        calls.append((call_id, name, canonical_arguments(item.get("arguments"))))
    content = item.get("content")
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                calls.append(
                    (
                        _str_or_empty(block.get("id")),
                        str(block.get("name", "")),
                        canonical_arguments(block.get("input")),
                    )
                )
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
        calls.append(
            (
                _str_or_empty(element.get("id")),
                str(function.get("name", "")),
                canonical_arguments(function.get("arguments")),
            )
        )
    return calls


def read_item(item: Mapping[str, Any]) -> ItemContent:
    """Read one item's content parts and tool calls as the hash sees them; raises UnreadableContent."""
    return ItemContent(tuple(_content_parts(item.get("content"))), tuple(_tool_calls(item)))


def _feed(hasher: Any, tag: bytes, value: str) -> None:
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UnreadableContent("A content field holds text that is not encodable as UTF-8.") from exc
    hasher.update(tag)
    hasher.update(len(encoded).to_bytes(8, "big"))
    hasher.update(encoded)


def fingerprint(items: Iterable[Any]) -> str:
    """Fingerprint the model-authored items of a list, in order: 64 hex characters, or "" when there are none.

    Raises UnreadableContent when an element is not an object or an item breaks the page's rules.
    """
    hasher = hashlib.sha256(_DOMAIN)
    count = 0
    for item in items:
        if not isinstance(item, dict):
            raise UnreadableContent(f"An item is a {type(item).__name__}, not a JSON object.")
        if not is_model_authored(item):
            continue
        count += 1
        content = read_item(item)
        for part_type, payload in content.parts:
            _feed(hasher, _PART_TYPE, part_type)
            _feed(hasher, _PART_PAYLOAD, payload)
        for call_id, name, arguments in content.calls:
            _feed(hasher, _CALL_ID, call_id)
            _feed(hasher, _CALL_NAME, name)
            _feed(hasher, _CALL_ARGUMENTS, arguments)
    return hasher.hexdigest() if count else ""


def version_counts(version: Any, *, custody: bool) -> bool:
    """Whether a stored fingerprint of `fingerprint_version` is comparable with this module's.

    A custody row counts only with version 2; a lineage entry with 2 or null (writers that
    predate the field wrote this algorithm). Any other version is not comparable: the reading
    abstains instead of comparing different algorithms' bytes.
    """
    if isinstance(version, bool):
        return False
    if version is None:
        return not custody
    return isinstance(version, int) and version == FINGERPRINT_VERSION


def _first_output(dialect: str | None, response: Any) -> list[Any] | None:
    outputs = fingerprint_outputs(dialect, response)
    return outputs[0] if outputs else None


def output_fingerprint(response: Any, *, dialect: str | None) -> str | None:
    """Fingerprint a response's own output (a custody row's `output_fingerprint`).

    A chat response with several choices is read by its first choice in index order. Returns
    None when the dialect or shape is unknown or the output is unreadable; never raises.
    """
    try:
        output = _first_output(dialect, response)
        return None if output is None else fingerprint(output)
    except UnreadableContent:
        return None


def continuation_fingerprint(request: Any, response: Any, *, dialect: str | None) -> str | None:
    """Fingerprint a call's request items followed by its output (`continuation_fingerprint`, version 2).

    The request items are what the model server received for the call (Responses `input`, chat
    or Messages `messages`); their non-model turns drop out, so this is the model-authored spine
    of the conversation so far plus this call's output. Store it with `fingerprint_version` =
    `FINGERPRINT_VERSION`. None when either side is unknown or unreadable; never raises.
    """
    try:
        request_items = fingerprint_request_items(dialect, request)
        output = _first_output(dialect, response)
        if request_items is None or output is None:
            return None
        return fingerprint([*request_items, *output])
    except UnreadableContent:
        return None
