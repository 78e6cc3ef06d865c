"""The join of an agent's model-call references to captured calls.

By `model_call_id`, or by the exact `(model_ref, response_id)` pair. Only a unique exact match
resolves; everything else stays unowned with a gap, and a call claimed by two invocations is owned
by neither. Timestamps and list order are never used to guess. The join is idempotent: its own
gaps carry `source="llmtap.join"` and are replaced on every run, the agent's gaps are kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from llmtap.records import ModelCallRecord

from .schema import (
    JOIN_GAP_SOURCE,
    AgentObservations,
    ContextCompactionObservation,
    ModelCallRef,
    ModelServerRef,
    ObservationGap,
)

__all__ = ["JOIN_CODES", "join_model_call_observations", "model_call_owners"]

JOIN_CODES = frozenset(
    {
        "model_call_reference_unmatched",
        "model_call_reference_ambiguous",
        "model_call_reference_conflict",
        "model_call_ownership_unavailable",
    }
)


def _ref_key(model_ref: ModelServerRef | Mapping[str, Any] | None) -> tuple[Any, Any] | None:
    if model_ref is None:
        return None
    if isinstance(model_ref, ModelServerRef):
        return (model_ref.type, model_ref.name)
    return (model_ref.get("type"), model_ref.get("name"))


def _label(reference: ModelCallRef) -> str:
    return reference.model_call_id or reference.response_id or "unknown"


@dataclass
class _Lookup:
    """Captured calls indexed by their exact join keys."""

    by_call_id: dict[str, list[ModelCallRecord]] = field(default_factory=dict)
    by_response: dict[tuple[Any, Any, str], list[ModelCallRecord]] = field(default_factory=dict)

    @classmethod
    def of(cls, records: Iterable[ModelCallRecord]) -> _Lookup:
        lookup = cls()
        for record in records:
            lookup.by_call_id.setdefault(record.model_call_id, []).append(record)
            key = _ref_key(record.model_ref)
            if key is not None and record.response_id:
                lookup.by_response.setdefault((*key, record.response_id), []).append(record)
        return lookup

    def resolve(self, reference: ModelCallRef) -> tuple[ModelCallRecord | None, str | None]:
        """Return the one call a reference names, or None and the gap code saying why not."""
        if reference.model_call_id:
            found = self.by_call_id.get(reference.model_call_id, [])
        else:
            key = _ref_key(reference.model_ref)
            found = self.by_response.get((*key, reference.response_id), []) if key and reference.response_id else []
        if not found:
            return None, "model_call_reference_unmatched"
        if len(found) > 1:
            return None, "model_call_reference_ambiguous"
        call = found[0]
        given_key = _ref_key(reference.model_ref)
        if reference.response_id is not None and reference.response_id != call.response_id:
            return None, "model_call_reference_conflict"
        if given_key is not None and given_key != _ref_key(call.model_ref):
            return None, "model_call_reference_conflict"
        return call, None


def _canonical(call: ModelCallRecord) -> ModelCallRef:
    return ModelCallRef(
        model_call_id=call.model_call_id,
        model_ref=ModelServerRef.model_validate(call.model_ref) if call.model_ref is not None else None,
        response_id=call.response_id,
    )


@dataclass
class _Resolution:
    """Which captured call each invocation owns, and the gaps met on the way."""

    owners: dict[int, str]
    gaps: list[ObservationGap]
    resolved: dict[tuple[str, int], ModelCallRecord]


def _resolve_ownership(observations: AgentObservations, lookup: _Lookup) -> _Resolution:
    gaps: list[ObservationGap] = []
    claims: dict[int, set[str]] = {}
    resolved: dict[tuple[str, int], ModelCallRecord] = {}
    for invocation in observations.invocations:
        for position, reference in enumerate(invocation.model_calls):
            call, problem = lookup.resolve(reference)
            if call is None:
                code = problem or "model_call_reference_unmatched"
                gaps.append(_join_gap(code, invocation.invocation_id, _label(reference)))
                continue
            claims.setdefault(id(call), set()).add(invocation.invocation_id)
            resolved[(invocation.invocation_id, position)] = call
    owners: dict[int, str] = {}
    for call_identity, claimants in claims.items():
        if len(claimants) == 1:
            owners[call_identity] = next(iter(claimants))
    for (invocation_id, position), call in list(resolved.items()):
        if id(call) not in owners:
            gaps.append(_join_gap("model_call_reference_conflict", invocation_id, call.model_call_id))
            del resolved[(invocation_id, position)]
    return _Resolution(owners, gaps, resolved)


def _join_gap(code: str, invocation_id: str | None, detail: str | None) -> ObservationGap:
    return ObservationGap(code=code, invocation_id=invocation_id, detail=detail, source=JOIN_GAP_SOURCE)


def join_model_call_observations(
    observations: AgentObservations | Mapping[str, Any],
    records: Iterable[ModelCallRecord],
) -> AgentObservations:
    """Resolve an agent's model-call references against a rollout's captured calls, never guessing.

    Returns a new bundle: resolved references rewritten to the call's canonical identifiers;
    unresolved ones kept as the agent gave them, each with a gap (`model_call_reference_unmatched`,
    `_ambiguous`, or `_conflict` when its identifiers disagree with the call or two invocations
    claim the call); compaction calls must be owned by the compaction's invocation; every captured
    call no invocation owns gets `model_call_ownership_unavailable` (detail
    `capture:<model_call_id>:call_index=<n>`). Running it again on its own output changes nothing.
    Raises pydantic's ValidationError when `observations` is not a valid bundle.
    """
    bundle = (
        observations.model_copy(deep=True)
        if isinstance(observations, AgentObservations)
        else AgentObservations.model_validate(dict(observations))
    )
    captured = list(records)
    lookup = _Lookup.of(captured)
    resolution = _resolve_ownership(bundle, lookup)
    for invocation in bundle.invocations:
        for position, reference in enumerate(invocation.model_calls):
            call = resolution.resolved.get((invocation.invocation_id, position))
            if call is not None:
                invocation.model_calls[position] = _canonical(call)
    gaps = list(resolution.gaps)
    for compaction in bundle.compactions:
        gaps.extend(_join_compaction(compaction, lookup, resolution.owners))
    for call in captured:
        if id(call) not in resolution.owners:
            detail = f"capture:{call.model_call_id}:call_index={call.call_index}"
            gaps.append(_join_gap("model_call_ownership_unavailable", None, detail))
    kept = [gap for gap in bundle.gaps if gap.source != JOIN_GAP_SOURCE]
    unique: dict[tuple[str, str | None, str | None], ObservationGap] = {}
    for gap in [*kept, *gaps]:
        unique.setdefault((gap.code, gap.invocation_id, gap.detail), gap)
    bundle.gaps = list(unique.values())
    return bundle


def _join_compaction(
    compaction: ContextCompactionObservation, lookup: _Lookup, owners: dict[int, str]
) -> list[ObservationGap]:
    """Resolve a compaction's references; the calls that performed it must be its invocation's own."""
    gaps: list[ObservationGap] = []
    owner_id = compaction.invocation_id

    def checked(reference: ModelCallRef, where: str, must_own: bool) -> ModelCallRef:
        call, problem = lookup.resolve(reference)
        owner = owners.get(id(call)) if call is not None else None
        if call is None:
            code = problem or "model_call_reference_unmatched"
        elif owner is not None and owner != owner_id:
            code = "model_call_reference_conflict"
        elif owner is None and must_own:
            code = "model_call_ownership_unavailable"
        else:
            return _canonical(call)
        gaps.append(_join_gap(code, owner_id, f"{where}:{call.model_call_id if call else _label(reference)}"))
        return reference

    compaction.model_calls = [checked(reference, "model_calls", True) for reference in compaction.model_calls]
    for field_name in ("before_model_call", "after_model_call"):
        reference = getattr(compaction, field_name)
        if reference is not None:
            setattr(compaction, field_name, checked(reference, field_name, False))
    return gaps


def model_call_owners(observations: AgentObservations, records: Iterable[ModelCallRecord]) -> dict[int, str]:
    """Return `{call_index: invocation_id}` for the captured calls exactly one invocation owns."""
    captured = list(records)
    resolution = _resolve_ownership(observations, _Lookup.of(captured))
    return {call.call_index: resolution.owners[id(call)] for call in captured if id(call) in resolution.owners}
