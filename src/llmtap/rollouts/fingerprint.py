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
in `dialects.history` (`fingerprint_request_items`, `fingerprint_outputs`), as does where each
item shape keeps its text parts and tool calls (`dialects.content`); this module applies the
page's canonical forms and bytes to what they read.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from ..dialects.content import UnreadableContent, content_parts, tool_calls
from ..dialects.history import fingerprint_outputs, fingerprint_request_items

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


def read_item(item: Mapping[str, Any]) -> ItemContent:
    """Read one item's content parts and tool calls as the hash sees them; raises UnreadableContent."""
    parts = tuple(
        (part_type, payload if part_type == "text" and isinstance(payload, str) else canonical_json(payload))
        for part_type, payload in content_parts(item.get("content"))
    )
    calls = tuple((call_id, name, canonical_arguments(arguments)) for call_id, name, arguments in tool_calls(item))
    return ItemContent(parts, calls)


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
