"""Agent observations (`ng_agent_observations`): what only the agent can see, and its join to captured calls.

A model server sees model HTTP calls; it cannot see which agent or subagent made a call, when a
tool ran and how it ended, when the context was compacted, or what a sandbox used. An agent that
wants those facts in its trajectory records them with `ObservationRecorder` and returns
`recorder.to_dict()` under the row key `ng_agent_observations`.

This package is the public face of three modules: `schema` (the typed records), `recorder`
(the emitter) and `join` (the exact-match join to captured calls).
"""

from __future__ import annotations

from .join import JOIN_CODES, join_model_call_observations, model_call_owners
from .recorder import InvocationRecorder, ObservationRecorder, ToolCallTimer
from .schema import (
    JOIN_GAP_SOURCE,
    OBSERVATIONS_KEY,
    SCHEMA_VERSION,
    AgentInvocation,
    AgentObservations,
    ContextCompactionObservation,
    ConversationItem,
    ModelCallRef,
    ModelServerRef,
    ObservationGap,
    SandboxObservation,
    ToolCallObservation,
)

__all__ = [
    "JOIN_CODES",
    "JOIN_GAP_SOURCE",
    "OBSERVATIONS_KEY",
    "SCHEMA_VERSION",
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
