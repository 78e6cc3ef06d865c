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
in each dialect (`Dialect.fingerprint_request_items`, `fingerprint_outputs`), as does where each
item shape keeps its text parts and tool calls (`dialects.content`); this module applies the
page's canonical forms and bytes to what they read. `records.line` stores each call's
continuation fingerprint on the line it builds, so this runs on the capture path.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from ..dialects import DIALECTS, Dialect
from ..dialects.content import UnreadableContent, content_parts, tool_calls

__all__ = [
    "FINGERPRINT_VERSION",
    "FieldMemo",
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


def _part_payload(payload: Any) -> str:
    """A content part's payload as hashed: a text part's text, any other block's canonical JSON
    (a "text" block without a string text among them)."""
    return payload if type(payload) is str else canonical_json(payload)


def read_item(item: Mapping[str, Any]) -> ItemContent:
    """Read one item's content parts and tool calls as the hash sees them; raises UnreadableContent."""
    parts = tuple((part_type, _part_payload(payload)) for part_type, payload in content_parts(item.get("content")))
    calls = tuple((call_id, name, canonical_arguments(arguments)) for call_id, name, arguments in tool_calls(item))
    return ItemContent(parts, calls)


def _field(tag: bytes, value: str) -> bytes:
    """One field as the hash reads it: the tag byte, the UTF-8 length as 8 big-endian bytes, the bytes."""
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UnreadableContent("A content field holds text that is not encodable as UTF-8.") from exc
    return tag + len(encoded).to_bytes(8, "big") + encoded


# The fields of a plain text part but its payload, computed once: the common case on the capture path.
_TEXT_PART_TYPE = _field(_PART_TYPE, "text")


def _item_fields(item: dict[str, Any]) -> bytes:
    """What one model-authored item feeds the hash: its content parts, then its tool calls, joined."""
    fields: list[bytes] = []
    for part_type, payload in content_parts(item.get("content")):
        fields.append(_field(_PART_TYPE, part_type))
        fields.append(_field(_PART_PAYLOAD, _part_payload(payload)))
    for call_id, name, arguments in tool_calls(item):
        fields.append(_field(_CALL_ID, call_id))
        fields.append(_field(_CALL_NAME, name))
        fields.append(_field(_CALL_ARGUMENTS, canonical_arguments(arguments)))
    return b"".join(fields)


class FieldMemo:
    """The fields of model-authored items already read, by each item's compact JSON.

    An agent's every request repeats the conversation so far, so without this each call would
    re-read (and re-canonicalize the tool arguments of) every earlier turn: quadratic in the
    rollout's length. Keyed by the item's bytes, the fields are a function of the key alone, for
    values parsed by orjson (no NaN or Infinity, which orjson would write as null; the capture
    path's lines are). Bounded by `limit_bytes` of keys and fields: full, it starts over. Safe
    to share between threads (each step is one dictionary operation; the size is approximate).
    """

    __slots__ = ("_fields", "_bytes", "limit_bytes")

    def __init__(self, limit_bytes: int = 8 * 1024 * 1024) -> None:
        self._fields: dict[bytes, bytes] = {}
        self._bytes = 0
        self.limit_bytes = limit_bytes

    def __len__(self) -> int:
        return len(self._fields)

    def fields(self, item: dict[str, Any]) -> bytes:
        try:
            key = orjson.dumps(item)
        except orjson.JSONEncodeError:  # not writable as a key (a non-string key, a huge integer): read it
            return _item_fields(item)
        found = self._fields.get(key)
        if found is None:
            found = _item_fields(item)
            size = len(key) + len(found)
            if self._bytes + size > self.limit_bytes:
                self._fields.clear()
                self._bytes = 0
            self._fields[key] = found
            self._bytes += size
        return found


def fingerprint(items: Iterable[Any], *, memo: FieldMemo | None = None) -> str:
    """Fingerprint the model-authored items of a list, in order: 64 hex characters, or "" when there are none.

    Raises UnreadableContent when an element is not an object or an item breaks the page's rules.
    This runs on the capture path for every call (`records.line` stores each call's continuation
    fingerprint), so the fields are joined and hashed once, an item whose content is a plain
    string with no tool calls (most chat turns) skips the general readers, and `memo` keeps
    what the other items feed from one call to the next.
    """
    fields: list[bytes] = [_DOMAIN]
    count = 0
    for item in items:
        if not isinstance(item, dict):
            raise UnreadableContent(f"An item is a {type(item).__name__}, not a JSON object.")
        if item.get("role") != "assistant" and item.get("type") != "function_call":  # is_model_authored, inlined
            continue
        count += 1
        content = item.get("content")
        if type(content) is str and not item.get("tool_calls") and item.get("type") != "function_call":
            if content:
                fields.append(_TEXT_PART_TYPE)
                fields.append(_field(_PART_PAYLOAD, content))
        else:
            fields.append(_item_fields(item) if memo is None else memo.fields(item))
    return hashlib.sha256(b"".join(fields)).hexdigest() if count else ""


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


def _dialect(dialect: Dialect | str | None) -> Dialect | None:
    return DIALECTS.get(dialect) if isinstance(dialect, str) else dialect


def _is_object(value: Any) -> bool:
    return isinstance(value, dict) or isinstance(value, Mapping)  # a dict first: the ABC check costs far more


def _first_output(dialect: Dialect | None, response: Any) -> list[Any] | None:
    if dialect is None or not _is_object(response):
        return None
    outputs = dialect.fingerprint_outputs(response)
    return outputs[0] if outputs else None


def output_fingerprint(response: Any, *, dialect: Dialect | str | None) -> str | None:
    """Fingerprint a response's own output (a custody row's `output_fingerprint`).

    A chat response with several choices is read by its first choice in index order. Returns
    None when the dialect or shape is unknown or the output is unreadable; never raises.
    """
    try:
        output = _first_output(_dialect(dialect), response)
        return None if output is None else fingerprint(output)
    except UnreadableContent:
        return None


def continuation_fingerprint(
    request: Any, response: Any, *, dialect: Dialect | str | None, memo: FieldMemo | None = None
) -> str | None:
    """Fingerprint a call's request items followed by its output (`continuation_fingerprint`, version 2).

    The request items are what the model server received for the call (Responses `input`, chat
    or Messages `messages`); their non-model turns drop out, so this is the model-authored spine
    of the conversation so far plus this call's output. `dialect` is a dialect or its name;
    `memo` (see `FieldMemo`) saves re-reading the turns earlier calls already read.
    Store it with `fingerprint_version` = `FINGERPRINT_VERSION`: `records.line` does, on every
    line it writes. None when either side is unknown or unreadable; never raises.
    """
    found = _dialect(dialect)
    if found is None or not _is_object(request):
        return None
    try:
        request_items = found.fingerprint_request_items(request)
        output = _first_output(found, response)
        if request_items is None or output is None:
            return None
        request_items.extend(output)  # the dialect's list is a fresh copy
        return fingerprint(request_items, memo=memo)
    except UnreadableContent:
        return None
