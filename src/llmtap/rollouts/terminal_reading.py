"""How terminal attribution's witnesses read a `/run` response and a captured call (specs/content-fingerprint.md).

A response is read as its raw items: the `output` list of a Responses object (non-object
elements dropped), a chat completion's first choice message, or an Anthropic message itself;
the items are then read by the content fingerprint's rules (`records.fingerprint`). An entry,
a captured call, is read lazily (`EntryView`): its served response id, the served ids of its
output items with their content keys, its own-output and continuation fingerprints (computed,
or stored with a `fingerprint_version` that counts), and its sequence identity.

Nothing here raises on odd JSON: an unreadable reading is empty, and the witness abstains.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any

from ..dialects import DIALECTS, Dialect, Normalized
from ..dialects.base import token_ids
from ..dialects.history import fingerprint_outputs, fingerprint_request_items
from ..records.fingerprint import (
    UnreadableContent,
    canonical_arguments,
    fingerprint,
    is_model_authored,
    read_item,
    version_counts,
)

__all__ = [
    "ContentKey",
    "EntryView",
    "content_key",
    "read_response",
    "served_item_id",
    "trailing_block",
]

ContentKey = tuple[Any, ...]


def text(value: Any) -> str | None:
    """A non-empty string, or None (an empty id counts as absent)."""
    return value if isinstance(value, str) and value else None


def field(entry: object, name: str) -> Any:
    """Read one field of a record object or of a dict shaped like one; a failing attribute reads as None."""
    if isinstance(entry, Mapping):
        return entry.get(name)
    try:
        return getattr(entry, name, None)
    except Exception:
        return None


def _has_model_item(outputs: Sequence[Sequence[Any]]) -> bool:
    return any(isinstance(item, dict) and is_model_authored(item) for output in outputs for item in output)


def _outputs(response: Any, dialect_name: object = None) -> tuple[str | None, list[list[Any]]]:
    """Return (dialect name, raw outputs) for a response object, one output per chat choice.

    With no known dialect every registered one tries; the object is read only when exactly one
    finds a model-authored item in it, since a shape two dialects both accept cannot be trusted.
    """
    if not isinstance(response, Mapping):
        return None, []
    names = [dialect_name] if isinstance(dialect_name, str) and dialect_name in DIALECTS else list(DIALECTS)
    readings = []
    for name in names:
        outputs = fingerprint_outputs(name, response) or []
        if _has_model_item(outputs):
            readings.append((name, outputs))
    return readings[0] if len(readings) == 1 else (None, [])


def read_response(response: Any) -> list[dict[str, Any]]:
    """The `/run` response's items, non-object elements dropped (the content witness's first step)."""
    _, outputs = _outputs(response)
    return [item for item in outputs[0] if isinstance(item, dict)] if outputs else []


def served_item_id(item: Mapping[str, Any]) -> str:
    """The id the model server gave an item: a `function_call`'s `call_id`, any other item's `id`; "" if none."""
    served = item.get("call_id") if item.get("type") == "function_call" else item.get("id")
    return text(served) or ""


def _bare_name(name: object) -> str:
    """A tool name without the namespace prefix a backend flattens in (`ns__name` gives `name`).

    Names that differ only before their last `__` compare equal here; the item-id witness also
    requires the served id and the canonical arguments to match.
    """
    return str(name).rsplit("__", 1)[-1]


def _call_key(name: object, arguments: object) -> ContentKey:
    return ("function_call", _bare_name(name), canonical_arguments(arguments))


def content_key(item: Mapping[str, Any]) -> ContentKey:
    """The item-id witness's content key: a call's bare name and arguments, or a message's parts.

    Raises UnreadableContent when the item's content breaks the fingerprint's rules.
    """
    if item.get("type") == "function_call":
        return _call_key(item.get("name", ""), item.get("arguments"))
    return ("message", read_item(item).parts)


def trailing_block(items: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The longest run of model-authored items at the very end; empty when the last item is not model output."""
    block: list[Mapping[str, Any]] = []
    for item in reversed(items):
        if not is_model_authored(item):
            break
        block.append(item)
    return block[::-1]


def _normalize(dialect: Dialect, value: Any) -> Normalized:
    try:
        return dialect.normalize(value)
    except Exception:  # a dialect bug must read as "nothing here", never break attribution
        return Normalized()


def _dialect_named(name: object) -> Dialect | None:
    return DIALECTS.get(name) if isinstance(name, str) else None


def _token_ids(value: Any) -> tuple[int, ...] | None:
    ids = token_ids(value)  # the dialects' one rule: non-negative ints, else unknown
    return None if ids is None else tuple(ids)


def _length(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _fingerprints(outputs: Sequence[Sequence[Any]], prefix: Sequence[Any] = ()) -> frozenset[str]:
    """Fingerprint `prefix + output` per output; unreadable and empty ("" : no model item) ones drop out."""
    found: set[str] = set()
    for output in outputs:
        try:
            value = fingerprint([*prefix, *output])
        except UnreadableContent:
            continue
        if value:
            found.add(value)
    return frozenset(found)


class EntryView:
    """One captured call as the witnesses read it; each reading is computed on first use.

    Entries are records, record dicts, raw capture lines, or custody rows (a `staging_key`: the
    tokens are staged elsewhere and the row carries precomputed fingerprints instead).
    """

    def __init__(self, row: object, call_id: str) -> None:
        self.row = row
        self.call_id = call_id
        self.custody = isinstance(row, Mapping) and row.get("staging_key") is not None

    @cached_property
    def _response(self) -> Mapping[str, Any] | None:
        response = field(self.row, "response")
        return response if isinstance(response, Mapping) else None

    @cached_property
    def _reading(self) -> tuple[str | None, list[list[Any]]]:
        return _outputs(self._response, field(self.row, "dialect"))

    @cached_property
    def _normalized(self) -> Normalized:
        dialect = _dialect_named(field(self.row, "dialect")) or _dialect_named(self._reading[0])
        return _normalize(dialect, self._response) if dialect and self._response else Normalized()

    @cached_property
    def response_id(self) -> str | None:
        return text(field(self.row, "response_id")) or self._normalized.response_id

    @cached_property
    def items_by_served_id(self) -> dict[str, set[ContentKey]]:
        """Map every served id in the call's output (items and nested chat `tool_calls`) to its content key(s)."""
        found: dict[str, set[ContentKey]] = {}

        def add(served: str, key: ContentKey) -> None:
            found.setdefault(served, set()).add(key)

        if self._response is None:  # a record without payloads still lists its tool calls
            calls = field(self.row, "tool_calls")
            for call in calls if isinstance(calls, list) else []:
                if isinstance(call, Mapping) and (served := text(call.get("call_id"))):
                    try:
                        add(served, _call_key(call.get("name", ""), call.get("arguments")))
                    except UnreadableContent:
                        continue
            return found
        for output in self._reading[1]:
            for item in output:
                if isinstance(item, dict):
                    self._add_item(item, add)
        return found

    @staticmethod
    def _add_item(item: dict[str, Any], add: Callable[[str, ContentKey], None]) -> None:
        """File one output item under its served id, and each chat tool call nested in it under the call's id."""
        try:
            if served_id := served_item_id(item):
                add(served_id, content_key(item))
        except UnreadableContent:
            pass
        calls = item.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if not isinstance(call, dict) or not (call_id := text(call.get("id"))):
                continue
            function = call.get("function") or {}
            if not isinstance(function, dict):
                continue
            try:
                add(call_id, _call_key(function.get("name", ""), function.get("arguments")))
            except UnreadableContent:
                continue

    def _stored(self, name: str) -> str | None:
        """A stored fingerprint when its `fingerprint_version` counts for this kind of entry, else None."""
        stored = field(self.row, name)
        if not isinstance(stored, str) or not version_counts(
            field(self.row, "fingerprint_version"), custody=self.custody
        ):
            return None
        return stored

    @cached_property
    def stored_version_rejected(self) -> bool:
        """True when the entry stored fingerprints under a version this module cannot compare."""
        stores = any(
            isinstance(field(self.row, name), str) for name in ("output_fingerprint", "continuation_fingerprint")
        )
        return stores and not version_counts(field(self.row, "fingerprint_version"), custody=self.custody)

    @cached_property
    def own_fingerprints(self) -> frozenset[str]:
        """The fingerprint of each output the call served (one per chat choice); a custody row's stored one."""
        if self.custody or self._response is None:
            stored = self._stored("output_fingerprint")
            return frozenset({stored}) if stored else frozenset()
        return _fingerprints(self._reading[1])

    @cached_property
    def continuation_fingerprints(self) -> frozenset[str]:
        """The call's cumulative fingerprint: stored by a lineage-aware writer, or request items + output."""
        if isinstance(field(self.row, "continuation_fingerprint"), str) or self.custody:
            stored = self._stored("continuation_fingerprint")
            return frozenset({stored}) if stored else frozenset()
        name, outputs = self._reading
        request_items = fingerprint_request_items(name, field(self.row, "request"))
        return frozenset() if request_items is None else _fingerprints(outputs, request_items)

    @cached_property
    def identity(self) -> tuple[Any, ...] | None:
        """Identify the call by its full token sequence, or None when that is unknown.

        A custody row: `(cumulative_hash, chain_hash, cumulative_length)`; an entry with a
        recorded `digest`: `(digest, cumulative_length)`, trusted, never recomputed; otherwise the
        prompt and completion token ids. The kind is part of the identity, so kinds never match.
        """
        length = _length(field(self.row, "cumulative_length"))
        if self.custody:
            digest = text(field(self.row, "cumulative_hash"))
            chain = field(self.row, "chain_hash")
            return ("custody", digest, text(chain), length) if digest and length is not None else None
        digest = text(field(self.row, "digest"))
        if digest is not None:
            return ("digest", digest, length) if length is not None else None
        prompt = _token_ids(field(self.row, "prompt_token_ids")) or _token_ids(self._normalized.prompt_token_ids)
        completion = _token_ids(field(self.row, "completion_token_ids")) or _token_ids(
            self._normalized.completion_token_ids
        )
        return ("tokens", prompt, completion) if prompt and completion else None
