"""The typed `ng_agent_observations` schema: agent invocations, tool calls, compactions, sandboxes, gaps.

A list of typed records told apart by `kind` (`agent_invocation`, `tool_call`,
`context_compaction`, `sandbox`), plus `gaps` for what the agent could not observe. List position
never means execution order. `observations.py` is the public face; the emitter and the join live
beside this module.
"""


from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "JOIN_GAP_SOURCE",
    "OBSERVATIONS_KEY",
    "SCHEMA_VERSION",
    "AgentInvocation",
    "AgentObservations",
    "ContextCompactionObservation",
    "ConversationItem",
    "ModelCallRef",
    "ModelServerRef",
    "ObservationGap",
    "SandboxObservation",
    "ToolCallObservation",
    "AnyObservation",
    "ObservationRecord",
    "ToolStatus",
    "InvocationStatus",
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


# One record of the bundle, of any kind; as a field type it is told apart by `kind`.
AnyObservation = Union[AgentInvocation, ToolCallObservation, ContextCompactionObservation, SandboxObservation]
ObservationRecord = Annotated[AnyObservation, Field(discriminator="kind")]


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
