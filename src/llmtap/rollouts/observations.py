"""Agent observations (`ng_agent_observations`): what only the agent can see, and its join to captured calls.

A model server sees model HTTP calls; it cannot see which agent or subagent made a call, when a
tool ran and how it ended, when the context was compacted, or what a sandbox used. An agent that
wants those facts in its trajectory records them with `ObservationRecorder` and returns
`recorder.to_dict()` under the row key `ng_agent_observations`.

The bundle is a list of typed records told apart by `kind` (`agent_invocation`, `tool_call`,
`context_compaction`, `sandbox`), plus `gaps` for what the agent could not observe. List position
never means execution order.

`join_model_call_observations` ties the agent's model-call references to captured calls: by
`model_call_id`, or by the exact `(model_ref, response_id)` pair. Only a unique exact match
resolves; everything else stays unowned with a gap, and a call claimed by two invocations is owned
by neither. Timestamps and list order are never used to guess. The join is idempotent: its own
gaps carry `source="llmtap.join"` and are replaced on every run, the agent's gaps are kept.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llmtap.records import ModelCallRecord

__all__ = [
    "JOIN_GAP_SOURCE",
    "OBSERVATIONS_KEY",
    "AgentInvocation",
    "AgentObservations",
    "ContextCompactionObservation",
    "ConversationItem",
    "InvocationRecorder",
    "ModelCallRef",
    "ModelServerRef",
    "ObservationGap",
    "ObservationRecorder",
    "SandboxObservation",
    "ToolCallObservation",
    "ToolCallTimer",
    "join_model_call_observations",
    "model_call_owners",
]

OBSERVATIONS_KEY = "ng_agent_observations"
SCHEMA_VERSION = "1.0"
JOIN_GAP_SOURCE = "llmtap.join"


class _Observation(BaseModel):
    """Base of every observation model: unknown keys are kept, so a join never drops agent data."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)


class ModelServerRef(_Observation):
    """Which model server answered a call, as the capture records it (`{"type", "name"}`)."""

    type: str | None = None
    name: str | None = None


class ModelCallRef(_Observation):
    """An agent's reference to one model call: `model_call_id`, or both `model_ref` and `response_id`."""

    model_call_id: str | None = None
    model_ref: ModelServerRef | None = None
    response_id: str | None = None

    @model_validator(mode="after")
    def _has_join_key(self) -> ModelCallRef:
        if not self.model_call_id and not (self.model_ref is not None and self.response_id):
            raise ValueError(
                "A model call reference needs model_call_id, or both model_ref and response_id; "
                "pass the id the capture returned or the response's id with its model server."
            )
        return self


class ConversationItem(_Observation):
    """One model-visible conversation item, in the provider-neutral shape of `llmtap.dialects.history`."""

    role: str | None = None
    type: str = "message"
    text: str | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: dict[str, Any] | None = None


InvocationStatus = Literal["completed", "failed", "incomplete", "unknown"]


class AgentInvocation(_Observation):
    """One root agent or subagent conversation, with the model calls it made and what its model saw."""

    kind: Literal["agent_invocation"] = "agent_invocation"
    invocation_id: str
    parent_invocation_id: str | None = None
    spawned_by_tool_call_id: str | None = None
    agent: str | None = None
    status: InvocationStatus = "unknown"
    started_at: float | None = None
    completed_at: float | None = None
    duration_ms: float | None = Field(default=None, ge=0)
    error_type: str | None = None
    model_calls: list[ModelCallRef] = Field(default_factory=list)
    conversation: list[ConversationItem] = Field(default_factory=list)


TimingSource = Literal["executor", "artifact", "harness"]
ToolStatus = Literal["completed", "failed", "timeout", "cancelled", "incomplete", "unknown"]


class ToolCallObservation(_Observation):
    """How one tool call ran, joined to the model-visible call by `(invocation_id, tool_call_id)`.

    Times are UTC Unix seconds; `duration_ms` is the measured interval and `timing_source` says
    who measured it (the tool executor, an artifact it left, or the agent harness around it).
    """

    kind: Literal["tool_call"] = "tool_call"
    invocation_id: str
    tool_call_id: str
    tool_name: str | None = None
    sandbox_id: str | None = None
    started_at: float | None = None
    completed_at: float | None = None
    duration_ms: float | None = Field(default=None, ge=0)
    clock_id: str | None = None
    timing_source: TimingSource | None = None
    status: ToolStatus = "unknown"
    error_type: str | None = None
    output: Any = None

    @model_validator(mode="after")
    def _ordered_times(self) -> ToolCallObservation:
        if self.started_at is not None and self.completed_at is not None and self.completed_at < self.started_at:
            raise ValueError(
                f"Tool call {self.tool_call_id!r} completed_at {self.completed_at} precedes started_at "
                f"{self.started_at}; record both from the same clock."
            )
        return self


class ContextCompactionObservation(_Observation):
    """A context compaction: the calls just before and after it, and the calls that performed it."""

    kind: Literal["context_compaction"] = "context_compaction"
    invocation_id: str
    observed_at: float | None = None
    trigger: str | None = None
    tokens_before: int | None = Field(default=None, ge=0)
    tokens_after: int | None = Field(default=None, ge=0)
    outcome: Literal["completed", "failed", "aborted", "unknown"] = "unknown"
    summary: str | None = None
    first_kept_item_id: str | None = None
    before_model_call: ModelCallRef | None = None
    model_calls: list[ModelCallRef] = Field(default_factory=list)
    after_model_call: ModelCallRef | None = None


class SandboxObservation(_Observation):
    """One sandbox execution and its measured (never configured) resource usage."""

    kind: Literal["sandbox"] = "sandbox"
    role: Literal["agent", "verifier", "environment"] = "agent"
    provider: str | None = None
    sandbox_id: str | None = None
    outcome: Literal["completed", "failed", "timeout", "oom", "sandbox_error", "cancelled", "unknown"] = "unknown"
    exit_code: int | None = None
    started_at: float | None = None
    completed_at: float | None = None
    wall_time_s: float | None = Field(default=None, ge=0)
    cpu_time_s: float | None = Field(default=None, ge=0)
    peak_memory_mib: float | None = Field(default=None, ge=0)
    resource_usage_source: str | None = None
    error_type: str | None = None


class ObservationGap(_Observation):
    """A fact that could not be observed or joined exactly; `source` names who reported it."""

    code: str
    invocation_id: str | None = None
    detail: str | None = None
    source: str | None = None


_Record = Union[AgentInvocation, ToolCallObservation, ContextCompactionObservation, SandboxObservation]
ObservationRecord = Annotated[_Record, Field(discriminator="kind")]


class AgentObservations(_Observation):
    """Everything one agent observed for one rollout (the `ng_agent_observations` row value)."""

    schema_version: str = SCHEMA_VERSION
    source: str = "unknown"
    records: list[ObservationRecord] = Field(default_factory=list)
    gaps: list[ObservationGap] = Field(default_factory=list)

    @model_validator(mode="after")
    def _invocation_tree_is_sound(self) -> AgentObservations:
        parents: dict[str, str | None] = {}
        for record in self.records:
            if isinstance(record, AgentInvocation):
                if record.invocation_id in parents:
                    raise ValueError(
                        f"Invocation id {record.invocation_id!r} appears twice; give each invocation its own id."
                    )
                parents[record.invocation_id] = record.parent_invocation_id
        for start in parents:
            seen = {start}
            current = parents[start]
            while current is not None and current in parents:
                if current in seen:
                    raise ValueError(
                        f"Invocation {start!r} is its own ancestor through parent_invocation_id; "
                        "parents must form a tree."
                    )
                seen.add(current)
                current = parents[current]
        return self

    @property
    def invocations(self) -> list[AgentInvocation]:
        """The agent invocation records."""
        return [record for record in self.records if isinstance(record, AgentInvocation)]

    @property
    def tool_calls(self) -> list[ToolCallObservation]:
        """The tool call records."""
        return [record for record in self.records if isinstance(record, ToolCallObservation)]

    @property
    def compactions(self) -> list[ContextCompactionObservation]:
        """The context compaction records."""
        return [record for record in self.records if isinstance(record, ContextCompactionObservation)]

    @property
    def sandboxes(self) -> list[SandboxObservation]:
        """The sandbox records."""
        return [record for record in self.records if isinstance(record, SandboxObservation)]

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-able row value, leaving out fields that are None."""
        return self.model_dump(mode="json", exclude_none=True)


# The emitter an agent uses ----------------------------------------------------------------------

# Timestamps are the monotonic clock moved onto the wall clock once per process, so the intervals
# of calls measured in different threads order exactly as they ran (a thread switch between two
# separate clock reads could otherwise invert them).
_WALL_ANCHOR = time.time()
_MONO_ANCHOR = time.perf_counter()


def _wall(mono: float) -> float:
    return _WALL_ANCHOR + (mono - _MONO_ANCHOR)


def _now() -> float:
    return _wall(time.perf_counter())


class ToolCallTimer:
    """Measures one tool call (`with` or `async with`) on the monotonic clock, as UTC seconds.

    Leaving the block normally marks the call `completed` unless `status` was set; an exception
    marks it `failed` (`timeout` for a TimeoutError, `cancelled` for a cancellation) with the
    exception's class name, and is re-raised. Set `output` to what the tool returned to the model.
    """

    def __init__(self, recorder: ObservationRecorder, observation: ToolCallObservation) -> None:
        self._recorder = recorder
        self.observation = observation
        self.output: Any = None
        self.status: ToolStatus | None = None
        self._started_mono = 0.0

    def __enter__(self) -> ToolCallTimer:
        self._started_mono = time.perf_counter()
        self.observation.started_at = _wall(self._started_mono)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        ended = time.perf_counter()
        observation = self.observation
        observation.completed_at = _wall(ended)
        observation.duration_ms = round((ended - self._started_mono) * 1000.0, 3)
        observation.timing_source = observation.timing_source or "harness"
        if exc_type is None:
            observation.status = self.status or "completed"
        else:
            observation.status = _status_for_exception(exc_type)
            observation.error_type = exc_type.__name__
        if self.output is not None:
            observation.output = self.output
        self._recorder._add(observation)

    async def __aenter__(self) -> ToolCallTimer:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self.__exit__(exc_type)


def _status_for_exception(exc_type: type[BaseException]) -> ToolStatus:
    if issubclass(exc_type, TimeoutError):
        return "timeout"
    return "cancelled" if exc_type.__name__ == "CancelledError" else "failed"


class InvocationRecorder:
    """Records one agent invocation: its model calls, conversation, tool calls and compactions."""

    def __init__(self, recorder: ObservationRecorder, invocation: AgentInvocation) -> None:
        self._recorder = recorder
        self.invocation = invocation

    @property
    def invocation_id(self) -> str:
        """This invocation's id."""
        return self.invocation.invocation_id

    def model_call(
        self,
        *,
        model_call_id: str | None = None,
        model_ref: Mapping[str, Any] | None = None,
        response_id: str | None = None,
    ) -> None:
        """Note a model call this invocation made, by the identifiers the agent observed."""
        server = ModelServerRef.model_validate(dict(model_ref)) if model_ref is not None else None
        reference = ModelCallRef(model_call_id=model_call_id, model_ref=server, response_id=response_id)
        with self._recorder._lock:
            self.invocation.model_calls.append(reference)

    def item(self, role: str | None, kind: str = "message", **fields: Any) -> None:
        """Append one model-visible conversation item (`text`, `call_id`, `name`, `arguments`, ...)."""
        item = ConversationItem(role=role, type=kind, **fields)
        with self._recorder._lock:
            self.invocation.conversation.append(item)

    def items(self, items: Iterable[Mapping[str, Any]]) -> None:
        """Append items already in the provider-neutral history shape (`llmtap.dialects.history`)."""
        parsed = [ConversationItem.model_validate(dict(item)) for item in items]
        with self._recorder._lock:
            self.invocation.conversation.extend(parsed)

    def tool_call(self, tool_call_id: str, tool_name: str | None = None, **fields: Any) -> ToolCallTimer:
        """Return a timer to wrap one tool execution in; the observation is kept when the block ends.

        `fields` are further `ToolCallObservation` fields, such as `sandbox_id` or `clock_id`.

        Usage::

            with invocation.tool_call(call.id, "search") as timer:
                timer.output = run_search(**arguments)
        """
        observation = ToolCallObservation(
            invocation_id=self.invocation_id, tool_call_id=tool_call_id, tool_name=tool_name, **fields
        )
        return ToolCallTimer(self._recorder, observation)

    def tool_result(
        self, tool_call_id: str, tool_name: str | None = None, *, status: ToolStatus, **fields: Any
    ) -> ToolCallObservation:
        """Record a tool call that another component timed (`timing_source` executor or artifact).

        `duration_ms` is derived from `started_at` and `completed_at` when only those are given.
        """
        started, completed = fields.get("started_at"), fields.get("completed_at")
        if fields.get("duration_ms") is None and started is not None and completed is not None:
            fields["duration_ms"] = round((completed - started) * 1000.0, 3)
        observation = ToolCallObservation(
            invocation_id=self.invocation_id, tool_call_id=tool_call_id, tool_name=tool_name, status=status, **fields
        )
        self._recorder._add(observation)
        return observation

    def compaction(self, **fields: Any) -> ContextCompactionObservation:
        """Record a context compaction in this invocation (`trigger`, `tokens_before`, `model_calls`, ...)."""
        fields.setdefault("observed_at", _now())
        observation = ContextCompactionObservation(invocation_id=self.invocation_id, **fields)
        self._recorder._add(observation)
        return observation

    def finish(self, status: InvocationStatus = "completed", **fields: Any) -> None:
        """Mark the invocation ended now, with its outcome and any further fields (`error_type`)."""
        with self._recorder._lock:
            invocation = self.invocation
            invocation.completed_at = _now()
            if invocation.started_at is not None:
                invocation.duration_ms = round(max(0.0, invocation.completed_at - invocation.started_at) * 1000.0, 3)
            invocation.status = status
            for key, value in fields.items():
                setattr(invocation, key, value)

    def __enter__(self) -> InvocationRecorder:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if exc_type is None:
            self.finish("completed")
        else:
            self.finish("failed", error_type=exc_type.__name__)


class ObservationRecorder:
    """Builds one rollout's `ng_agent_observations`; safe to use from threads and tasks.

    Usage::

        recorder = ObservationRecorder(source="my_agent")
        with recorder.invocation("main") as main:
            main.model_call(model_call_id=captured_id)
            with main.tool_call(call.id, call.name) as timer:
                timer.output = run_tool(call)
        return {"response": final, "reward": 1.0, "ng_agent_observations": recorder.to_dict()}
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self._lock = threading.RLock()
        self._records: list[_Record] = []
        self._gaps: list[ObservationGap] = []

    def invocation(self, invocation_id: str, **fields: Any) -> InvocationRecorder:
        """Start recording an invocation (`parent_invocation_id`, `spawned_by_tool_call_id`, `agent`).

        Use the result as a context manager to finish it: `completed`, or `failed` on an exception.
        """
        fields.setdefault("started_at", _now())
        invocation = AgentInvocation(invocation_id=invocation_id, **fields)
        self._add(invocation)
        return InvocationRecorder(self, invocation)

    def sandbox(self, **fields: Any) -> SandboxObservation:
        """Record one sandbox execution's outcome and measured usage."""
        observation = SandboxObservation(**fields)
        self._add(observation)
        return observation

    def gap(self, code: str, detail: str | None = None, *, invocation_id: str | None = None) -> None:
        """Record something the agent could not observe."""
        with self._lock:
            gap = ObservationGap(code=code, detail=detail, invocation_id=invocation_id, source=self.source)
            self._gaps.append(gap)

    def _add(self, record: _Record) -> None:
        with self._lock:
            self._records.append(record)

    def build(self) -> AgentObservations:
        """Return the validated bundle recorded so far."""
        with self._lock:
            records = [record.model_copy(deep=True) for record in self._records]
            return AgentObservations(source=self.source, records=records, gaps=list(self._gaps))

    def to_dict(self) -> dict[str, Any]:
        """Return the bundle as the JSON-able `ng_agent_observations` value."""
        return self.build().to_dict()


# The join ---------------------------------------------------------------------------------------

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
