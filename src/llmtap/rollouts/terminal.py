"""Terminal attribution: join a rollout's verified response to exactly one captured model call.

An agent's `/run` result carries `response`, the object the verifier scored; capture records
every call the model server served, auxiliary calls and abandoned retries included. Five
independent witnesses (`WITNESSES`) testify which call produced the response: `explicit` (the
caller names a `model_call_id`; a miss is only an abstention), `declared` (the harness reports
the response id it kept; unless exactly one call served it, selection stops), `response_id`,
`item_id` (the last model-authored item's served id, with the same content) and `content`
(fingerprints of the model-authored items, three readings pooled).

A witness that cannot name exactly one call abstains. Claims are verified, never ranked:
witnesses that agree, or that name calls with identical full token sequences, attribute; when
they disagree nothing is attributed and the contradiction is kept as evidence of a defect.

Entries are `ModelCallRecord` objects, dicts shaped like its `to_dict()` or a raw capture line,
or custody rows: dicts with a `staging_key` whose tokens are staged elsewhere, carrying
`cumulative_hash` (and `chain_hash`), `cumulative_length` and the fingerprints the two public
functions below compute. Provider JSON is read only through `llmtap.dialects`: the history items
of `dialects.history` (content, served ids, one output per chat choice) and `Normalized` (ids and
token ids). Nothing here raises: malformed input is an abstention.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ..dialects import DIALECTS, Dialect, Normalized
from ..dialects.history import HistoryItem, request_items, response_outputs, served_response_id

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from ..records import ModelCallRecord

__all__ = [
    "FALLBACK_MASK",
    "FALLBACK_SINGLE_CHAIN",
    "WITNESSES",
    "TerminalAttribution",
    "WitnessFinding",
    "assistant_fingerprint",
    "continuation_fingerprint",
    "resolve_terminal",
]

WITNESSES = ("explicit", "declared", "response_id", "item_id", "content")

# What the consumer does with a rollout no call could be attributed to: without a declared
# terminal response id, the builder's strict single-chain policy decides; with one, the rollout
# is masked, because the harness said which response it kept and capture cannot confirm it.
FALLBACK_SINGLE_CHAIN = "single_chain"
FALLBACK_MASK = "mask"

# A witness's verdict: it named one call, it looked and could not name exactly one, or it had
# nothing to read (no id given, no model-authored item in the response).
NAMED, ABSTAINED, SILENT = "named", "abstained", "silent"

# Roles whose turns are not model output: they end a model-authored block in a transcript.
_NON_MODEL_ROLES = frozenset({"user", "system", "developer", "tool"})

ContentKey = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class WitnessFinding:
    """What one witness testified: the call it named, or why it could not name one."""

    witness: str
    verdict: str
    model_call_id: str | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Return the finding as JSON-able data (the witness name is the key it is filed under)."""
        return {"verdict": self.verdict, "model_call_id": self.model_call_id, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class TerminalAttribution:
    """The joined terminal call, or the reasons no witness could name one.

    `method` joins the names of the witnesses that named the call (`"response_id+content"`);
    `contradictions` lists `(witness, model_call_id)` for every naming witness when they
    disagree; `fallback` says what the consumer does when nothing was attributed.
    """

    model_call_id: str | None
    method: str = ""
    reason: str = ""
    witnesses: tuple[WitnessFinding, ...] = ()
    contradictions: tuple[tuple[str, str], ...] = ()
    fallback: str | None = None

    @property
    def attributed(self) -> bool:
        """True when exactly one captured call was joined to the response."""
        return self.model_call_id is not None

    def to_dict(self) -> dict[str, Any]:
        """Return the attribution as the rollout attachment carries it."""
        return {
            "model_call_id": self.model_call_id,
            "attributed": self.attributed,
            "method": self.method,
            "reason": self.reason,
            "fallback": self.fallback,
            "witnesses": {finding.witness: finding.to_dict() for finding in self.witnesses},
            "contradictions": [{"witness": name, "model_call_id": call} for name, call in self.contradictions],
        }


# --- reading items --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Item:
    """One model-authored item: the id the model server gave it ("" if none) and its content."""

    served_id: str
    key: ContentKey


# A transcript slot is a model-authored item, or None for a turn that is not model output (a
# tool result, a user turn), which ends a model-authored block.
_Slot = _Item | None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _normalize(dialect: Dialect, value: Any) -> Normalized:
    try:
        return dialect.normalize(value)
    except Exception:  # a dialect bug must read as "nothing here", never break attribution
        return Normalized()


def _canonical(value: Any) -> str:
    """Serialize tool arguments so that key order and spacing do not matter."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def _tool_name_key(name: object) -> str:
    """Return a tool name without the namespace prefix a backend flattens in (`ns__name`).

    A namespaced Responses tool can reach a chat backend as `<namespace>__<name>` while the
    client keeps the bare name. Names that differ only before their last `__` compare equal
    here, but the arguments (and, for the item-id witness, the served id) must match too.
    """
    return name.rsplit("__", 1)[-1] if isinstance(name, str) else ""


def _tool_key(name: object, arguments: object) -> ContentKey:
    return ("tool", _tool_name_key(name), _canonical(arguments))


def _slots(items: Iterable[HistoryItem]) -> list[_Slot]:
    """Read history items into slots, in order; reasoning and empty messages leave no slot.

    A tool call is served under its call id; a message under the id of what it was read from.
    Tools the provider ran itself leave no slot either: a harness's transcript may keep or drop
    them, and their results come from the same response, not from a turn between calls.
    """
    slots: list[_Slot] = []
    for item in items:
        role, kind = item.get("role"), item.get("type")
        if item.get("hosted"):
            continue
        if role in _NON_MODEL_ROLES:
            slots.append(None)
        elif role == "assistant" and kind == "tool_call":
            key = _tool_key(item.get("name"), item.get("arguments"))
            slots.append(_Item(_text(item.get("call_id")) or "", key))
        elif role == "assistant" and kind == "message" and (text := _text(item.get("text"))):
            slots.append(_Item(_text(item.get("item_id")) or "", ("message", text)))
    return slots


def _dialect_named(name: object) -> Dialect | None:
    return DIALECTS.get(name) if isinstance(name, str) else None


def _read_outputs(response: Any, dialect_name: object = None) -> tuple[str | None, list[list[_Slot]]]:
    """Return (dialect name, outputs) for a response object, one output per chat choice.

    With no known dialect every registered one tries; the object is read only when exactly one
    finds model-authored items in it, since a shape two dialects both accept cannot be trusted.
    """
    if not isinstance(response, Mapping):
        return None, []
    names = [dialect_name] if isinstance(dialect_name, str) and dialect_name in DIALECTS else list(DIALECTS)
    readings: list[tuple[str, list[list[_Slot]]]] = []
    for name in names:
        outputs = [_slots(output) for output in response_outputs(name, response) or []]
        if any(slot is not None for output in outputs for slot in output):
            readings.append((name, outputs))
    return readings[0] if len(readings) == 1 else (None, [])


def _model_items(slots: Sequence[_Slot]) -> list[_Item]:
    return [slot for slot in slots if slot is not None]


def _fingerprint(items: Sequence[_Item]) -> str | None:
    """Digest the content of model-authored items, in order; ids do not take part."""
    if not items:
        return None
    payload = json.dumps([list(item.key) for item in items], separators=(",", ":"))
    return "sha256:" + hashlib.sha256(payload.encode("ascii")).hexdigest()


def _continuation(request: Any, dialect_name: str | None, output: Sequence[_Slot]) -> str | None:
    """Fingerprint the model-authored spine of a call's request context plus its own output."""
    own = _model_items(output)
    if dialect_name not in DIALECTS or not isinstance(request, Mapping) or not own:
        return None
    return _fingerprint(_model_items(_slots(request_items(dialect_name, request) or [])) + own)


def assistant_fingerprint(response: Any, *, dialect: str | None = None) -> str | None:
    """Fingerprint a response's own model-authored items, as a custody row's `assistant_fingerprint`.

    With a chat response that has several choices, the first choice is read. Returns None when
    the response has no model-authored item; never raises.
    """
    try:
        _, outputs = _read_outputs(response, dialect)
        return _fingerprint(_model_items(outputs[0])) if outputs else None
    except Exception:
        return None


def continuation_fingerprint(request: Any, response: Any, *, dialect: str) -> str | None:
    """Fingerprint the model-authored turns of `request` followed by the response's own items.

    This is a custody row's `continuation_fingerprint`: it matches a `/run` response that is the
    full transcript up to and including this call. Returns None when unreadable; never raises.
    """
    try:
        name, outputs = _read_outputs(response, dialect)
        return _continuation(request, name, outputs[0]) if outputs else None
    except Exception:
        return None


# --- entries ----------------------------------------------------------------------------------


def _field(entry: object, name: str) -> Any:
    """Read one field of a record object or of a dict shaped like one."""
    if isinstance(entry, Mapping):
        return entry.get(name)
    try:
        return getattr(entry, name, None)
    except Exception:
        return None


def _token_ids(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    return None


def _is_custody_row(entry: object) -> bool:
    """A token-free custody row stages its tokens externally under a key."""
    return isinstance(entry, Mapping) and entry.get("staging_key") is not None


class _Entry:
    """One captured call as the witnesses read it; each reading is computed on first use."""

    def __init__(self, row: object, call_id: str) -> None:
        self.row = row
        self.call_id = call_id
        self.custody = _is_custody_row(row)

    @cached_property
    def _response(self) -> Mapping[str, Any] | None:
        response = _field(self.row, "response")
        return response if isinstance(response, Mapping) else None

    @cached_property
    def _reading(self) -> tuple[str | None, list[list[_Slot]]]:
        return _read_outputs(self._response, _field(self.row, "dialect"))

    @cached_property
    def _normalized(self) -> Normalized:
        dialect = _dialect_named(_field(self.row, "dialect")) or _dialect_named(self._reading[0])
        return _normalize(dialect, self._response) if dialect and self._response else Normalized()

    @cached_property
    def response_id(self) -> str | None:
        return _text(_field(self.row, "response_id")) or self._normalized.response_id

    @cached_property
    def items_by_served_id(self) -> dict[str, set[ContentKey]]:
        """Map every served id in the call's recorded output to the content of its item(s)."""
        found: dict[str, set[ContentKey]] = {}
        if self._response is not None:
            items = [item for output in self._reading[1] for item in _model_items(output)]
        else:  # a record without payloads still lists its tool calls
            calls = _field(self.row, "tool_calls")
            items = [
                _Item(call["call_id"], _tool_key(call.get("name"), call.get("arguments")))
                for call in (calls if isinstance(calls, list) else [])
                if isinstance(call, Mapping) and _text(call.get("call_id"))
            ]
        for item in items:
            if item.served_id:
                found.setdefault(item.served_id, set()).add(item.key)
        return found

    @cached_property
    def own_fingerprints(self) -> frozenset[str]:
        """The fingerprint of each output the call served (one per chat choice)."""
        stored = _text(_field(self.row, "assistant_fingerprint"))
        if stored is not None:
            return frozenset({stored})
        return frozenset(fp for output in self._reading[1] if (fp := _fingerprint(_model_items(output))))

    @cached_property
    def continuation_fingerprints(self) -> frozenset[str]:
        stored = _text(_field(self.row, "continuation_fingerprint"))
        if stored is not None:
            return frozenset({stored})
        name, outputs = self._reading
        request = _field(self.row, "request")
        return frozenset(fp for output in outputs if (fp := _continuation(request, name, output)))

    @cached_property
    def identity(self) -> tuple[Any, ...] | None:
        """Identify the call by its full token sequence, or None when that is unknown.

        A custody row or a lineage-aware writer gives a whole-sequence `cumulative_hash` (and
        `chain_hash` as a secondary key) plus `cumulative_length`; a record with the token ids
        the upstream returned compares its prompt and completion ids directly.
        """
        digest = _text(_field(self.row, "cumulative_hash"))
        chain = _text(_field(self.row, "chain_hash"))
        length = _field(self.row, "cumulative_length")
        if (digest or chain) and isinstance(length, int) and not isinstance(length, bool):
            return ("digest", digest or "", chain or "", length)
        if self.custody:
            return None
        prompt = _token_ids(_field(self.row, "prompt_token_ids")) or _token_ids(self._normalized.prompt_token_ids)
        completion = _token_ids(_field(self.row, "completion_token_ids")) or _token_ids(
            self._normalized.completion_token_ids
        )
        return ("tokens", prompt, completion) if prompt and completion else None


def _entry_views(entries: Any) -> tuple[list[_Entry], int]:
    """Views of the entries that name a call, first occurrence of each id; and how many were skipped."""
    views: dict[str, _Entry] = {}
    skipped = 0
    try:
        rows = list(entries) if entries is not None and not isinstance(entries, (str, bytes, Mapping)) else []
    except Exception:
        rows = []
    for row in rows:
        call_id = _text(_field(row, "model_call_id"))
        if call_id is None:
            skipped += 1
        elif call_id not in views:
            views[call_id] = _Entry(row, call_id)
    return list(views.values()), skipped


def _collapse_identical(candidates: Sequence[_Entry]) -> _Entry | None:
    """Reduce candidates that carry the same full token sequence to one.

    Identical retries deliver the same chain whichever is chosen, so the smallest call id wins
    deterministically. Candidates with different or unknown sequences stay ambiguous: None.
    """
    unique = {entry.call_id: entry for entry in candidates}
    if len(unique) == 1:
        return next(iter(unique.values()))
    identities = {entry.identity for entry in unique.values()}
    if len(identities) != 1 or None in identities:
        return None
    return unique[min(unique)]


def _ids(entries: Iterable[_Entry]) -> str:
    return ", ".join(sorted(entry.call_id for entry in entries))


def _from_candidates(witness: str, candidates: Sequence[_Entry], what: str) -> WitnessFinding:
    """Name the one candidate (after collapsing identical retries), or abstain."""
    if not candidates:
        return WitnessFinding(witness, ABSTAINED, None, f"No captured call matches {what}.")
    chosen = _collapse_identical(candidates)
    if chosen is None:
        detail = f"Calls {_ids(candidates)} all match {what} and carry different or unknown token sequences."
        return WitnessFinding(witness, ABSTAINED, None, detail)
    count = len({entry.call_id for entry in candidates})
    detail = f"The only call that matches {what}."
    if count > 1:
        detail = (
            f"Calls {_ids(candidates)} match {what} with identical token sequences; the smallest id stands for them."
        )
    return WitnessFinding(witness, NAMED, chosen.call_id, detail)


# --- the witnesses ----------------------------------------------------------------------------


def _explicit_witness(views: Sequence[_Entry], explicit_call_id: object) -> WitnessFinding:
    if explicit_call_id is None:
        return WitnessFinding("explicit", SILENT, None, "No explicit call id was given.")
    if not _text(explicit_call_id):
        return WitnessFinding("explicit", ABSTAINED, None, "The explicit call id is not a non-empty string.")
    if any(view.call_id == explicit_call_id for view in views):
        return WitnessFinding("explicit", NAMED, str(explicit_call_id), "The caller named this call.")
    detail = f"The explicit call id {explicit_call_id!r} names no captured call."
    return WitnessFinding("explicit", ABSTAINED, None, detail)


def _declared_witness(views: Sequence[_Entry], declared_response_id: object) -> WitnessFinding:
    if declared_response_id is None:
        return WitnessFinding("declared", SILENT, None, "No terminal response id was declared.")
    declared = _text(declared_response_id)
    matches = [view for view in views if declared is not None and view.response_id == declared]
    if len(matches) == 1:
        detail = "The only call that served the declared response id."
        return WitnessFinding("declared", NAMED, matches[0].call_id, detail)
    shown = repr(declared_response_id) if declared is not None else "(not a non-empty string)"
    detail = f"The declared response id {shown} matches {len(matches)} captured calls, not exactly one."
    return WitnessFinding("declared", ABSTAINED, None, detail)


def _response_id_witness(views: Sequence[_Entry], response_id: str | None) -> WitnessFinding:
    if response_id is None:
        return WitnessFinding("response_id", SILENT, None, "The response carries no id.")
    matches = [view for view in views if view.response_id == response_id]
    return _from_candidates("response_id", matches, f"the response id {response_id!r}")


def _item_id_witness(views: Sequence[_Entry], slots: Sequence[_Slot]) -> WitnessFinding:
    """Name the call whose recorded output holds the response's last model-authored item.

    The id must come with the same content (tool name and canonical arguments, or message
    text), so a reused or colliding id cannot name a call the transcript does not end with. An
    item without an id, such as a message the harness composed itself, abstains.
    """
    items = _model_items(slots)
    if not items:
        return WitnessFinding("item_id", SILENT, None, "The response has no model-authored item.")
    last = items[-1]
    if not last.served_id:
        return WitnessFinding("item_id", ABSTAINED, None, "The last model-authored item carries no served id.")
    holders = [view for view in views if last.served_id in view.items_by_served_id]
    matches = [view for view in holders if last.key in view.items_by_served_id[last.served_id]]
    if holders and not matches:
        detail = f"Calls {_ids(holders)} served the item id {last.served_id!r} with different content."
        return WitnessFinding("item_id", ABSTAINED, None, detail)
    return _from_candidates("item_id", matches, f"the last model-authored item id {last.served_id!r}")


def _trailing_block(slots: Sequence[_Slot]) -> list[_Item]:
    """The last unbroken run of model-authored items (tool results or user turns may follow it)."""
    block: list[_Item] = []
    for slot in reversed(slots):
        if slot is not None:
            block.append(slot)
        elif block:
            break
    return block[::-1]


def _content_witness(views: Sequence[_Entry], slots: Sequence[_Slot]) -> WitnessFinding:
    """Pool the three content readings before deciding, so they compete instead of racing.

    A full transcript matches a call's cumulative fingerprint, a final-turn-only response its
    own output, and a merged transcript's trailing block the terminal call's own output. A first
    call's cumulative fingerprint is its own output's, so the readings can name different calls.
    """
    whole = _fingerprint(_model_items(slots))
    if whole is None:
        return WitnessFinding("content", SILENT, None, "The response has no model-authored item.")
    trailing = _fingerprint(_trailing_block(slots))
    matches: list[_Entry] = []
    readings: set[str] = set()
    for view in views:
        hits = {
            "cumulative": whole in view.continuation_fingerprints,
            "own output": whole in view.own_fingerprints,
            "trailing block": trailing in view.own_fingerprints,
        }
        if any(hits.values()):
            matches.append(view)
            readings.update(name for name, hit in hits.items() if hit)
    how = f" ({', '.join(sorted(readings))} reading)" if readings else ""
    return _from_candidates("content", matches, f"the response's model-authored content{how}")


# --- the verdict --------------------------------------------------------------------------------


def _verdict(findings: tuple[WitnessFinding, ...], views: Sequence[_Entry], declared: bool) -> TerminalAttribution:
    fallback = FALLBACK_MASK if declared else FALLBACK_SINGLE_CHAIN
    declared_finding = next(finding for finding in findings if finding.witness == "declared")
    if declared and declared_finding.verdict != NAMED:
        return TerminalAttribution(None, "", declared_finding.detail + " Selection stops.", findings, (), fallback)
    named = [finding for finding in findings if finding.verdict == NAMED and finding.model_call_id]
    if not named:
        return TerminalAttribution(None, "", "No witness named exactly one captured call.", findings, (), fallback)
    method = "+".join(finding.witness for finding in named)
    named_ids = {str(finding.model_call_id) for finding in named}
    if len(named_ids) == 1:
        reason = "Named by the only testifying witness." if len(named) == 1 else "The testifying witnesses agree."
        return TerminalAttribution(named[0].model_call_id, method, reason, findings)
    chosen = _collapse_identical([view for view in views if view.call_id in named_ids])
    if chosen is not None:
        reason = f"The witnesses named calls {', '.join(sorted(named_ids))} with identical full token sequences."
        return TerminalAttribution(chosen.call_id, method, reason, findings)
    contradictions = tuple((finding.witness, str(finding.model_call_id)) for finding in named)
    claims = "; ".join(f"{name} names {call}" for name, call in contradictions)
    reason = f"The witnesses contradict each other ({claims}); nothing is attributed."
    return TerminalAttribution(None, "", reason, findings, contradictions, fallback)


def resolve_terminal(
    entries: Iterable[ModelCallRecord | Mapping[str, Any]],
    response: Mapping[str, Any] | None,
    explicit_call_id: str | None = None,
    declared_response_id: str | None = None,
) -> TerminalAttribution:
    """Join the verified `/run` response to one captured model call.

    `entries` are the rollout's captured calls (records, record dicts or custody rows);
    `response` is the scored response object (a Responses object, a chat completion or an
    Anthropic message), or None. Never raises: anything unreadable is an abstention.

    Usage::

        attribution = resolve_terminal(read_model_call_records(store, "0-0"), result["response"])
        attachment["terminal"] = attribution.to_dict()
    """
    declared = declared_response_id is not None
    try:
        views, skipped = _entry_views(entries)
        _, outputs = _read_outputs(response)
        slots = outputs[0] if outputs else []
        findings = (
            _explicit_witness(views, explicit_call_id),
            _declared_witness(views, declared_response_id),
            _response_id_witness(views, served_response_id(response)),
            _item_id_witness(views, slots),
            _content_witness(views, slots),
        )
        attribution = _verdict(findings, views, declared)
    except Exception as exc:  # the last guard of "never raises": report, do not guess
        reason = f"Attribution failed on malformed input ({type(exc).__name__}); nothing is attributed."
        return TerminalAttribution(None, "", reason, (), (), FALLBACK_MASK if declared else FALLBACK_SINGLE_CHAIN)
    if skipped:
        counted = "1 entry" if skipped == 1 else f"{skipped} entries"
        note = f" {counted} without a model_call_id {'was' if skipped == 1 else 'were'} skipped."
        attribution = replace(attribution, reason=attribution.reason + note)
    return attribution
