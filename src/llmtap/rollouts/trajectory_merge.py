"""Merge an agent's own `ng_trajectory` with the one projected from capture, never losing what the agent said.

Some agents (the reference system's among them) write `ng_trajectory` themselves, with evidence
capture cannot see: tool execution status and timing, turns, resolution. `llmtap attach` used
to replace that record with the projection; now it merges the two (`merge_trajectory`):

- the agent's record is the base; every value it reported (non-null) stays exactly as it was;
- a key the agent left out or set to null is filled from the projection; nested objects merge
  the same way, key by key (`token_stats`, `response_metadata`, `resolution`, ...);
- `model_calls` join by `model_call_id` and `tool_calls` by `tool_call_id` (the invocation ids
  must not differ); a joined entry merges as above, the agent's entries keep their order and
  capture's other entries follow in the projection's order;
- `turns`, `threads`, `invocations`, `compactions` and `sandboxes` are the agent's when it
  reported any, else the projection's (their ids are the producer's own, so they are not mixed);
- `gaps`: the agent's, then the projection's not already listed; the gaps that only say
  "nothing here" are decided on the merged record instead (`tool_timing_unavailable` counts the
  merged tool calls without any timing, `model_calls_unavailable`, `turns_unavailable`,
  `resolution_unavailable`, `task_identity_unavailable`), so capture never reports as missing
  what the agent measured.

When the two records name different rollouts or tasks the agent's record is kept as it was and
`producer_trajectory_identity_mismatch` is added to its gaps; a value that is not a schema 1.0
object is not merged at all (`ProducerTrajectoryInvalid`), and the caller leaves it untouched.
Merging is idempotent: merging a merged record with the same projection gives it back.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from llmtap.errors import LlmtapError

__all__ = ["ProducerTrajectoryInvalid", "merge_trajectory", "untimed_tool_calls"]

# Gaps that say only that the record lacks something: recomputed on the merged record.
_DERIVED_GAPS = ("tool_timing_unavailable", "model_calls_unavailable", "turns_unavailable", "resolution_unavailable")
_IDENTITY_KEYS = ("rollout_id", "task_id")
# Lists whose entries carry the producer's own ids (thread, invocation, turn numbers): never mixed.
_WHOLE_LISTS = ("turns", "threads", "invocations", "compactions", "sandboxes")
_TIMING_KEYS = ("started_at", "completed_at", "duration_ms", "timing_source")


class ProducerTrajectoryInvalid(LlmtapError, ValueError):
    """Raised when a row's own `ng_trajectory` is not a schema 1.0 object; it is then left as it was."""


def untimed_tool_calls(tool_calls: Sequence[Any]) -> int:
    """Count the tool calls run by the client for which no timing at all is known."""
    return sum(
        1
        for entry in tool_calls
        if isinstance(entry, Mapping)
        and not entry.get("hosted")
        and all(entry.get(key) is None for key in _TIMING_KEYS)
    )


def _filled(agent: Any, capture: Any) -> Any:
    """The agent's value, with the keys it left out or null taken from capture (objects merge key by key)."""
    if agent is None:
        return copy.deepcopy(capture)
    if not isinstance(agent, dict) or not isinstance(capture, Mapping):
        return agent
    merged = dict(agent)
    for key, value in capture.items():
        merged[key] = _filled(agent.get(key), value)
    return merged


def _joined(agent: Sequence[Any], capture: Sequence[Any], key: str) -> list[Any]:
    """The agent's entries (each filled from the capture entry it joins), then capture's others.

    A capture entry joins the agent entry with the same `key` and the same invocation (an
    unknown invocation on either side is compatible); when several are compatible, the first that
    already holds everything capture knows joins (a merged record merges to itself), else the
    only one with exactly the same invocation id, else the capture entry is listed on its own.
    """
    merged = list(agent)
    used: set[int] = set()
    positions: dict[Any, list[int]] = {}
    for position, mine in enumerate(agent):
        if isinstance(mine, Mapping) and _hashable_id(mine.get(key)) is not None:
            positions.setdefault(mine.get(key), []).append(position)
    for entry in capture:
        wanted = _hashable_id(entry.get(key)) if isinstance(entry, Mapping) else None
        found = positions.get(wanted, []) if wanted is not None else []
        candidates = [p for p in found if p not in used and _same_invocation(agent[p], entry)]
        if len(candidates) > 1:  # an entry already holding all of capture's is the one it joined before
            done = [p for p in candidates if _filled(agent[p], entry) == agent[p]]
            same = [p for p in candidates if agent[p].get("invocation_id") == entry.get("invocation_id")]
            candidates = done[:1] or same
        if len(candidates) == 1:
            used.add(candidates[0])
            merged[candidates[0]] = _filled(agent[candidates[0]], entry)
        else:
            merged.append(copy.deepcopy(entry))
    return merged


def _hashable_id(value: Any) -> str | int | None:
    """An entry id usable as a key: a string or an integer (anything else joins nothing)."""
    return value if isinstance(value, (str, int)) and not isinstance(value, bool) else None


def _same_invocation(agent: Mapping[str, Any], capture: Mapping[str, Any]) -> bool:
    mine, theirs = agent.get("invocation_id"), capture.get("invocation_id")
    return mine is None or theirs is None or mine == theirs


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _gap_list(agent: Sequence[Any], capture: Sequence[Any], merged: Mapping[str, Any]) -> list[Any]:
    gaps: list[Any] = []
    for gap in [*agent, *capture]:
        code = gap.get("code") if isinstance(gap, Mapping) else None
        if code in _DERIVED_GAPS or gap in gaps:
            continue
        if code == "task_identity_unavailable" and merged.get("task_id") is not None:
            continue
        gaps.append(gap)
    untimed = untimed_tool_calls(_list(merged.get("tool_calls")))
    if untimed:
        gaps.append({"code": "tool_timing_unavailable", "source": "trajectory", "detail": f"count={untimed}"})
    if not _list(merged.get("model_calls")):
        gaps.append({"code": "model_calls_unavailable", "source": "trajectory"})
    if not _list(merged.get("turns")):
        gaps.append({"code": "turns_unavailable", "source": "trajectory"})
    resolution = merged.get("resolution")
    if not isinstance(resolution, Mapping) or resolution.get("resolved") is None:
        gaps.append({"code": "resolution_unavailable", "source": "trajectory"})
    return gaps


def merge_trajectory(agent: Any, projected: Mapping[str, Any]) -> dict[str, Any]:
    """Merge the agent's own `ng_trajectory` with capture's projection (rules in the module docstring).

    Returns a new record; neither input is changed. Raises ProducerTrajectoryInvalid when
    `agent` is not an object or names a schema version other than the projection's.
    """
    if not isinstance(agent, dict):
        raise ProducerTrajectoryInvalid(f"The row's ng_trajectory is a {type(agent).__name__}, not an object.")
    version = agent.get("schema_version")
    if version is not None and version != projected.get("schema_version"):
        raise ProducerTrajectoryInvalid(
            f"The row's ng_trajectory has schema version {version!r}, not {projected.get('schema_version')!r}."
        )
    mismatched = [
        key
        for key in _IDENTITY_KEYS
        if agent.get(key) is not None and projected.get(key) is not None and agent.get(key) != projected.get(key)
    ]
    if mismatched:
        kept = copy.deepcopy(agent)
        gap = {"code": "producer_trajectory_identity_mismatch", "source": "trajectory", "detail": ",".join(mismatched)}
        if gap not in _list(kept.get("gaps")):
            kept["gaps"] = [*_list(kept.get("gaps")), gap]
        return kept
    merged: dict[str, Any] = _filled(copy.deepcopy(agent), projected)
    for key, joined_by in (("model_calls", "model_call_id"), ("tool_calls", "tool_call_id")):
        merged[key] = _joined(_list(agent.get(key)), _list(projected.get(key)), joined_by)
    for key in _WHOLE_LISTS:
        chosen = agent.get(key) if _list(agent.get(key)) else projected.get(key)
        merged[key] = copy.deepcopy(chosen)
    merged["gaps"] = _gap_list(_list(agent.get("gaps")), _list(projected.get("gaps")), merged)
    return merged
