"""Terminal attribution: join a rollout's verified response to exactly one captured model call.

An agent's `/run` result carries `response`, the object the verifier scored; capture records
every call the model server served, auxiliary calls and abandoned retries included. Five
independent witnesses (`WITNESSES`) testify which call produced the response: `explicit` (the
caller names a `model_call_id`; a miss is only an abstention), `declared` (the harness reports
the response id it kept; unless exactly one call served it, selection stops), `response_id`,
`item_id` (the last model-authored item's served id, with the same content) and `content`
(the version-2 content fingerprint of `records.fingerprint`, three readings pooled).

A witness that cannot name exactly one call abstains. Claims are verified, never ranked:
witnesses that agree, or that name calls with identical full token sequences, attribute (the
first naming witness's call, in witness order); when they disagree nothing is attributed and the
contradiction is kept as evidence of a defect. The reading rules are those of
specs/content-fingerprint.md, implemented in `terminal_reading`.

Entries are `ModelCallRecord` objects, dicts shaped like its `to_dict()` or a raw capture line,
lineage entries (a stored `continuation_fingerprint`, `fingerprint_version`, `digest`,
`cumulative_length`) or custody rows: dicts with a `staging_key` whose tokens are staged
elsewhere, carrying `cumulative_hash`, `chain_hash`, `cumulative_length`, `output_fingerprint`,
`continuation_fingerprint` and `fingerprint_version`. Nothing here raises: malformed input is an
abstention.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..dialects.history import served_response_id
from ..records.fingerprint import (
    UnreadableContent,
    continuation_fingerprint,
    fingerprint,
    is_model_authored,
    output_fingerprint,
)
from .terminal_reading import EntryView, content_key, field, read_response, served_item_id, text, trailing_block

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from ..records import ModelCallRecord

__all__ = [
    "FALLBACK_MASK",
    "FALLBACK_SINGLE_CHAIN",
    "METHODS",
    "WITNESSES",
    "TerminalAttribution",
    "WitnessFinding",
    "continuation_fingerprint",
    "output_fingerprint",
    "resolve_terminal",
]

WITNESSES = ("explicit", "declared", "response_id", "item_id", "content")
# What a verdict's `method` can be: the naming witness, the content witness by the reading that
# named the call (`content` when it was a custody row's stored fingerprint).
METHODS = ("explicit", "declared", "response_id", "item_id", "content_cumulative", "content_output", "content")

# What the consumer does with a rollout no call could be attributed to: without a declared
# terminal response id, the builder's strict single-chain policy decides; with one, the rollout
# is masked, because the harness said which response it kept and capture cannot confirm it.
FALLBACK_SINGLE_CHAIN = "single_chain"
FALLBACK_MASK = "mask"

# A witness's verdict: it named one call, it looked and could not name exactly one, or it had
# nothing to read (no id given, no model-authored item in the response).
NAMED, ABSTAINED, SILENT = "named", "abstained", "silent"


@dataclass(frozen=True, slots=True)
class WitnessFinding:
    """What one witness testified: the call it named, or why it could not name one.

    `method` refines the witness's name when it named a call by one of several readings (the
    content witness: `content_cumulative`, `content_output` or `content`).
    """

    witness: str
    verdict: str
    model_call_id: str | None = None
    detail: str = ""
    method: str = ""

    @property
    def name(self) -> str:
        """The name a verdict gives this finding: its method, else its witness."""
        return self.method or self.witness

    def to_dict(self) -> dict[str, Any]:
        """Return the finding as JSON-able data (the witness name is the key it is filed under)."""
        return {"verdict": self.verdict, "model_call_id": self.model_call_id, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class TerminalAttribution:
    """The joined terminal call, or the reasons no witness could name one.

    `method` is the naming witness's name alone (one of `METHODS`); the witnesses that agree
    with it are `corroborated_by`, in witness order, and listed in `reason` as
    `corroborated_by=response_id+content_output`.
    `contradictions` lists `(witness, model_call_id)` for every naming witness when they
    disagree; `fallback` says what the consumer does when nothing was attributed.
    """

    model_call_id: str | None
    method: str = ""
    reason: str = ""
    witnesses: tuple[WitnessFinding, ...] = ()
    contradictions: tuple[tuple[str, str], ...] = ()
    fallback: str | None = None
    corroborated_by: tuple[str, ...] = ()

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


# --- entries ----------------------------------------------------------------------------------


def _entry_views(entries: Any) -> tuple[list[EntryView], int]:
    """Views of the entries that name a call, first occurrence of each id; and how many were skipped."""
    views: dict[str, EntryView] = {}
    skipped = 0
    try:
        rows = list(entries) if entries is not None and not isinstance(entries, (str, bytes, Mapping)) else []
    except Exception:
        rows = []
    for row in rows:
        call_id = text(field(row, "model_call_id"))
        if call_id is None:
            skipped += 1
        elif call_id not in views:
            views[call_id] = EntryView(row, call_id)
    return list(views.values()), skipped


def _collapse_identical(candidates: Sequence[EntryView]) -> EntryView | None:
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


def _ids(entries: Iterable[EntryView]) -> str:
    return ", ".join(sorted(entry.call_id for entry in entries))


def _from_candidates(witness: str, candidates: Sequence[EntryView], what: str) -> WitnessFinding:
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


def _explicit_witness(views: Sequence[EntryView], explicit_call_id: object) -> WitnessFinding:
    if explicit_call_id is None or explicit_call_id == "":
        return WitnessFinding("explicit", SILENT, None, "No explicit call id was given.")
    if not text(explicit_call_id):
        return WitnessFinding("explicit", ABSTAINED, None, "The explicit call id is not a non-empty string.")
    if any(view.call_id == explicit_call_id for view in views):
        return WitnessFinding("explicit", NAMED, str(explicit_call_id), "The caller named this call.")
    detail = f"The explicit call id {explicit_call_id!r} names no captured call."
    return WitnessFinding("explicit", ABSTAINED, None, detail)


def _declared_witness(views: Sequence[EntryView], declared_response_id: object) -> WitnessFinding:
    if not _is_declared(declared_response_id):
        return WitnessFinding("declared", SILENT, None, "No terminal response id was declared.")
    declared = text(declared_response_id)
    matches = [view for view in views if declared is not None and view.response_id == declared]
    if len(matches) == 1:
        detail = "The only call that served the declared response id."
        return WitnessFinding("declared", NAMED, matches[0].call_id, detail)
    shown = repr(declared_response_id) if declared is not None else "(not a non-empty string)"
    detail = f"The declared response id {shown} matches {len(matches)} captured calls, not exactly one."
    return WitnessFinding("declared", ABSTAINED, None, detail)


def _response_id_witness(views: Sequence[EntryView], response_id: str | None) -> WitnessFinding:
    if response_id is None:
        return WitnessFinding("response_id", SILENT, None, "The response carries no id.")
    matches = [view for view in views if view.response_id == response_id]
    return _from_candidates("response_id", matches, f"the response id {response_id!r}")


def _item_id_witness(views: Sequence[EntryView], items: Sequence[dict[str, Any]]) -> WitnessFinding:
    """Name the call whose recorded output holds the response's last model-authored item.

    Tool outputs and user turns after that item are not model output, so they do not move it.
    The id must come with the same content (bare tool name and canonical arguments, or message
    parts), so a reused or colliding id cannot name a call the transcript does not end with. An
    item without an id, such as a message the harness composed itself, abstains.
    """
    model = [item for item in items if is_model_authored(item)]
    if not model:
        return WitnessFinding("item_id", SILENT, None, "The response has no model-authored item.")
    last = model[-1]
    served = served_item_id(last)
    if not served:
        return WitnessFinding("item_id", ABSTAINED, None, "The last model-authored item carries no served id.")
    try:
        key = content_key(last)
    except UnreadableContent as exc:
        return WitnessFinding("item_id", ABSTAINED, None, f"The last model-authored item is unreadable: {exc}")
    holders = [view for view in views if served in view.items_by_served_id]
    matches = [view for view in holders if key in view.items_by_served_id[served]]
    if holders and not matches:
        detail = f"Calls {_ids(holders)} served the item id {served!r} with different content."
        return WitnessFinding("item_id", ABSTAINED, None, detail)
    return _from_candidates("item_id", matches, f"the last model-authored item id {served!r}")


def _content_witness(views: Sequence[EntryView], items: Sequence[dict[str, Any]]) -> WitnessFinding:
    """Pool the three content readings before deciding, so they compete instead of racing.

    A full transcript matches a call's cumulative fingerprint, a final-turn-only response its
    own output, and a merged transcript's trailing block the terminal call's own output. A first
    call's cumulative fingerprint is its own output's, so the readings can name different calls.
    The finding's method says which reading named the call: `content` for a custody row (its
    stored fingerprints are its only readings), else `content_cumulative` or `content_output`.
    """
    try:
        whole = fingerprint(items)
        block = trailing_block(items)
        trailing = fingerprint(block) if block else None
    except UnreadableContent as exc:
        return WitnessFinding("content", ABSTAINED, None, f"The response's content is unreadable: {exc}")
    if not whole:
        return WitnessFinding("content", SILENT, None, "The response has no model-authored item.")
    matches: list[EntryView] = []
    hits_of: dict[str, set[str]] = {}
    for view in views:
        hits = {
            reading
            for reading, hit in (
                ("cumulative", whole in view.continuation_fingerprints),
                ("own output", whole in view.own_fingerprints),
                ("trailing block", trailing is not None and trailing in view.own_fingerprints),
            )
            if hit
        }
        if hits:
            matches.append(view)
            hits_of[view.call_id] = hits
    readings = sorted(set().union(*hits_of.values())) if hits_of else []
    how = f" ({', '.join(readings)} reading)" if readings else ""
    rejected = [view.call_id for view in views if view.stored_version_rejected]
    if rejected:
        how += f"; calls {', '.join(sorted(rejected))} stored fingerprints of another version, not comparable"
    finding = _from_candidates("content", matches, f"the response's model-authored content{how}")
    if finding.model_call_id is None:
        return finding
    chosen = next(view for view in matches if view.call_id == finding.model_call_id)
    method = "content" if chosen.custody else "content_cumulative"
    if not chosen.custody and "cumulative" not in hits_of[chosen.call_id]:
        method = "content_output"
    return replace(finding, method=method)


# --- the verdict --------------------------------------------------------------------------------


def _is_declared(declared_response_id: object) -> bool:
    """An empty-string declaration counts as absent."""
    return declared_response_id is not None and declared_response_id != ""


def _corroboration(others: Sequence[WitnessFinding]) -> str:
    return f" corroborated_by={'+'.join(finding.name for finding in others)}" if others else ""


def _verdict(findings: tuple[WitnessFinding, ...], views: Sequence[EntryView], declared: bool) -> TerminalAttribution:
    """Attribute when the naming witnesses agree; the first in witness order names the call.

    Agreement is the same call, or calls with one full token sequence; then the first naming
    witness's call is the verdict (not the smallest id: the strongest reading the caller gave
    stands), `method` is that witness's name, and the others are listed as `corroborated_by`.
    """
    fallback = FALLBACK_MASK if declared else FALLBACK_SINGLE_CHAIN
    declared_finding = next(finding for finding in findings if finding.witness == "declared")
    if declared and declared_finding.verdict != NAMED:
        return TerminalAttribution(None, "", declared_finding.detail + " Selection stops.", findings, (), fallback)
    named = [finding for finding in findings if finding.verdict == NAMED and finding.model_call_id]
    if not named:
        return TerminalAttribution(None, "", "No witness named exactly one captured call.", findings, (), fallback)
    first, others = named[0], named[1:]
    corroborating = tuple(finding.name for finding in others)
    named_ids = {str(finding.model_call_id) for finding in named}
    if len(named_ids) == 1:
        reason = "Named by the only testifying witness." if not others else "The testifying witnesses agree."
        return TerminalAttribution(
            first.model_call_id, first.name, reason + _corroboration(others), findings, corroborated_by=corroborating
        )
    if _collapse_identical([view for view in views if view.call_id in named_ids]) is not None:
        reason = (
            f"The witnesses named calls {', '.join(sorted(named_ids))} with identical full token sequences; "
            f"the first witness's call stands."
        )
        return TerminalAttribution(
            first.model_call_id, first.name, reason + _corroboration(others), findings, corroborated_by=corroborating
        )
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
    declared = _is_declared(declared_response_id)
    try:
        views, skipped = _entry_views(entries)
        items = read_response(response)
        findings = (
            _explicit_witness(views, explicit_call_id),
            _declared_witness(views, declared_response_id),
            _response_id_witness(views, served_response_id(response)),
            _item_id_witness(views, items),
            _content_witness(views, items),
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
