"""The emitter an agent uses to record what only it can see, as `ng_agent_observations`.

Usage::

    recorder = ObservationRecorder()
    invocation = recorder.invocation("main", agent_name="simple")
    with invocation.tool_call("call_1", name="add"):
        result = add(2, 3)
    row["ng_agent_observations"] = recorder.to_dict()
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from .schema import (
    AgentInvocation,
    AgentObservations,
    AnyObservation,
    ContextCompactionObservation,
    ConversationItem,
    InvocationStatus,
    ModelCallRef,
    ModelServerRef,
    ObservationGap,
    SandboxObservation,
    ToolCallObservation,
    ToolStatus,
)

__all__ = ["InvocationRecorder", "ObservationRecorder", "ToolCallTimer"]

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
        self._records: list[AnyObservation] = []
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

    def _add(self, record: AnyObservation) -> None:
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
