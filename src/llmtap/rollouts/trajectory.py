"""The `ng_trajectory` projection (schema 1.0): one rollout's calls, turns, tools and outcome in one record.

Built from the rollout row, its captured `ModelCallRecord`s and, when the agent reported them,
its joined `ng_agent_observations`. The record holds:

- identity: `task_id`, `task_index`, `rollout_index`, `attempt_index`, `rollout_id`;
- `model_calls`, ordered by start time: `token_stats` (`prompt_tokens`, `completion_tokens`,
  `reasoning_tokens`, `total_tokens`, `cached_tokens`, `cache_creation_tokens`; null means
  unknown), `response_metadata`, timing, the payloads (unless left out), and the model-visible
  `input` and `output` as provider-neutral items (`llmtap.dialects.history`);
- `threads`: chains of calls where each call's input extends an earlier call's context exactly;
- `turns` (a new turn starts when a thread's new input carries a user message and no tool result),
  with question, answer, reasoning, status and cumulative `step_count`;
- `tool_calls`: every tool call the model made, with its model-visible output, and the status and
  timing the agent observed (`timing_source`), when it did, else those of the MCP call recorded
  on the wire (`timing_source: "mcp_wire"`, `tool_execution`: `rollouts.wire_tools`);
- `invocations`, `compactions` and `sandboxes` as the agent reported them (joined), `resolution`,
  `step_count` (model calls) and `gaps`.

To keep the record linear in size, a call's `input` stores only what is new: `{"continues":
{"model_call_id", "items", ["drop_output_reasoning"]}, "items": [...]}` means "the first `items`
entries of that call's input followed by its output (reasoning left out when flagged), then these".
`model_visible_input` rebuilds the full input from the persisted row alone (criterion C4).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from llmtap.dialects.history import (
    HistoryItem,
    continued_response_id,
    item_fingerprint,
    request_items,
    response_items,
)
from llmtap.records import ModelCallRecord

from .observations import AgentObservations, model_call_owners
from .trajectory_tools import tool_calls as project_tool_calls

__all__ = [
    "RESOLVED_KEYS",
    "SCHEMA_VERSION",
    "TRAJECTORY_KEY",
    "TrajectoryOptions",
    "model_visible_history",
    "model_visible_input",
    "project_trajectory",
]

TRAJECTORY_KEY = "ng_trajectory"
SCHEMA_VERSION = "1.0"

# Row keys a verifier uses to say whether the task was solved, read in this order (booleans only).
RESOLVED_KEYS = ("resolved", "is_resolved", "success", "is_correct", "correct", "passed")


@dataclass(frozen=True)
class TrajectoryOptions:
    """How to project: whether payload copies go in, and when a reward alone means "resolved"."""

    include_payloads: bool = True
    resolved_reward_threshold: float | None = None


@dataclass
class ProjectedCall:
    """One captured call on its way into the record: its items and its place in a thread."""

    record: ModelCallRecord
    invocation_id: str | None
    input_items: list[HistoryItem] | None
    output_items: list[HistoryItem]
    continues: dict[str, Any] | None = None
    new_start: int = 0
    thread_id: str = ""
    hashes: list[bytes] = field(default_factory=list)


def _rolling(start: bytes, items: Iterable[HistoryItem], fingerprints: dict[int, bytes]) -> list[bytes]:
    """Prefix digests: entry i identifies the sequence of the first i+1 items after `start`.

    `fingerprints` caches by object identity: the history memo shares the items of replayed
    messages between calls, and every item stays alive for the whole projection.
    """
    digests: list[bytes] = []
    current = start
    for item in items:
        fingerprint = fingerprints.get(id(item))
        if fingerprint is None:
            fingerprint = fingerprints[id(item)] = item_fingerprint(item)
        current = hashlib.blake2b(current + fingerprint, digest_size=16).digest()
        digests.append(current)
    return digests


def _gap(code: str, source: str, detail: str | None = None, invocation_id: str | None = None) -> dict[str, Any]:
    gap: dict[str, Any] = {"code": code, "source": source}
    if detail is not None:
        gap["detail"] = detail
    if invocation_id is not None:
        gap["invocation_id"] = invocation_id
    return gap


def _index(row: Mapping[str, Any], key: str) -> int | None:
    value = row.get(key)
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None


def project_trajectory(
    row: Mapping[str, Any],
    records: Sequence[ModelCallRecord],
    *,
    rollout_id: str | None,
    observations: AgentObservations | None = None,
    capture_gaps: Iterable[Mapping[str, Any]] = (),
    terminal_model_call_id: str | None = None,
    options: TrajectoryOptions = TrajectoryOptions(),
    tool_call_records: Sequence[Any] = (),
) -> dict[str, Any]:
    """Return the `ng_trajectory` record of one rollout.

    `tool_call_records` are the rollout's MCP `ToolCallRecord`s recorded on the wire: they fill
    the status and timing of tool attempts the agent did not report (`rollouts.wire_tools`).

    `capture_gaps` are the capture attachment's gaps, copied in so the record is self-describing
    (each keeps its `source`, `model_call_capture` when it names none).
    `terminal_model_call_id` (the call whose response the agent returned) decides which turn
    carries the rollout's `resolved`; without it only a rollout with a single thread gets one.
    Raises ValueError when a record is inconsistent (a negative duration); the caller then keeps
    the payloads on the capture attachment and reports `trajectory_projection_failed`.
    """
    gaps = [
        _gap(str(gap.get("code")), str(gap.get("source") or "model_call_capture"), gap.get("detail"))
        for gap in capture_gaps
    ]
    if observations is not None:
        for gap in observations.gaps:
            gaps.append(_gap(gap.code, gap.source or "agent_observations", gap.detail, gap.invocation_id))
    task_index = _index(row, "_ng_task_index")
    named_task = row.get("task_id")
    task_id = str(task_index) if task_index is not None else named_task if isinstance(named_task, str) else None
    if task_id is None:
        gaps.append(_gap("task_identity_unavailable", "trajectory"))
    owners = model_call_owners(observations, records) if observations is not None else {}
    ordered = sorted(
        records, key=lambda r: (r.started_at is None, r.started_at if r.started_at is not None else 0.0, r.call_index)
    )
    memo: dict[bytes, list[HistoryItem]] = {}
    calls = [_read_call(record, owners.get(record.call_index), gaps, memo) for record in ordered]
    _expand_previous_responses(calls, gaps)
    threads = _thread_calls(calls)
    turns = _turns(calls, task_id, rollout_id)
    resolution = _resolution(row, options)
    _mark_resolved(turns, threads, terminal_model_call_id, resolution["resolved"])
    tool_calls = project_tool_calls(calls, observations, gaps, tool_call_records)
    if not records:
        gaps.append(_gap("model_calls_unavailable", "trajectory"))
    if not turns:
        gaps.append(_gap("turns_unavailable", "trajectory"))
    if resolution["resolved"] is None:
        gaps.append(_gap("resolution_unavailable", "trajectory"))
    return {
        "schema_version": SCHEMA_VERSION,
        "task_id": task_id,
        "task_index": task_index,
        "rollout_index": _index(row, "_ng_rollout_index"),
        "attempt_index": _index(row, "_ng_attempt_index"),
        "rollout_id": rollout_id,
        "invocations": _dumped(observations.invocations if observations is not None else []),
        "model_calls": [_model_call_entry(call, options.include_payloads) for call in calls],
        "threads": threads,
        "turns": turns,
        "tool_calls": tool_calls,
        "compactions": _dumped(observations.compactions if observations is not None else []),
        "sandboxes": _dumped(observations.sandboxes if observations is not None else []),
        "resolution": resolution,
        "step_count": len(calls),
        "gaps": gaps,
    }


def _dumped(models: Sequence[BaseModel]) -> list[dict[str, Any]]:
    return [model.model_dump(mode="json", exclude_none=True) for model in models]


def _read_call(
    record: ModelCallRecord,
    invocation_id: str | None,
    gaps: list[dict[str, Any]],
    memo: dict[bytes, list[HistoryItem]],
) -> ProjectedCall:
    input_items = request_items(record.dialect, record.request, memo=memo)
    if input_items is None:
        gaps.append(_gap("conversation_unavailable", "trajectory", f"model_call:{record.model_call_id}:input"))
    output_items = response_items(record.dialect, record.response)
    if output_items is None and record.response is not None:
        # An error body is a response without model output: nothing the model said is missing.
        if record.error_category is None:
            gaps.append(_gap("conversation_unavailable", "trajectory", f"model_call:{record.model_call_id}:output"))
    return ProjectedCall(record, invocation_id, input_items, output_items or [])


def _expand_previous_responses(calls: list[ProjectedCall], gaps: list[dict[str, Any]]) -> None:
    """A `previous_response_id` request continues that response's context, server-side."""
    by_response: dict[str, list[ProjectedCall]] = {}
    for call in calls:
        if call.record.response_id:
            by_response.setdefault(call.record.response_id, []).append(call)
    position_of = {id(call): position for position, call in enumerate(calls)}
    for position, call in enumerate(calls):
        previous_id = continued_response_id(call.record.dialect, call.record.request)
        if previous_id is None or call.input_items is None:
            continue
        found = [earlier for earlier in by_response.get(previous_id, []) if position_of[id(earlier)] < position]
        if len(found) != 1 or found[0].input_items is None:
            gaps.append(_gap("previous_response_unavailable", "trajectory", previous_id))
            continue
        parent = found[0]
        assert parent.input_items is not None
        context = parent.input_items + parent.output_items
        call.input_items = context + call.input_items


def _thread_calls(calls: list[ProjectedCall]) -> list[dict[str, Any]]:
    """Link each call to the latest earlier call (same invocation) whose context its input extends."""
    known: dict[tuple[str | None, int, bytes], tuple[ProjectedCall, bool]] = {}
    threads: dict[str, dict[str, Any]] = {}
    fingerprints: dict[int, bytes] = {}
    for call in calls:
        items = call.input_items or []
        call.hashes = _rolling(b"", items, fingerprints)
        parent: tuple[ProjectedCall, bool] | None = None
        length = 0
        for length in range(len(items), 0, -1):
            parent = known.get((call.invocation_id, length, call.hashes[length - 1]))
            if parent is not None:
                break
        if parent is not None and call.input_items is not None:
            parent_call, drop_reasoning = parent
            call.continues = {"model_call_id": parent_call.record.model_call_id, "items": length}
            if drop_reasoning:
                call.continues["drop_output_reasoning"] = True
            call.new_start = length
            call.thread_id = parent_call.thread_id
        else:
            call.thread_id = f"t{len(threads)}"
            threads[call.thread_id] = {
                "thread_id": call.thread_id,
                "invocation_id": call.invocation_id,
                "model_call_ids": [],
            }
        threads[call.thread_id]["model_call_ids"].append(call.record.model_call_id)
        if call.input_items is None:
            continue
        start = call.hashes[-1] if call.hashes else b""
        known[(call.invocation_id, len(items), start)] = (call, False)
        full = _rolling(start, call.output_items, fingerprints)
        if full:
            known[(call.invocation_id, len(items) + len(full), full[-1])] = (call, False)
        visible = [item for item in call.output_items if item["type"] != "reasoning"]
        if len(visible) != len(call.output_items) and visible:
            digests = _rolling(start, visible, fingerprints)
            known[(call.invocation_id, len(items) + len(digests), digests[-1])] = (call, True)
    return list(threads.values())


def _texts(items: Iterable[HistoryItem], kind: str, role: str | None = None) -> list[str]:
    return [
        item["text"]
        for item in items
        if item["type"] == kind and isinstance(item.get("text"), str) and (role is None or item["role"] == role)
    ]


def _opens_turn(new_items: Sequence[HistoryItem]) -> bool:
    has_user = any(item["type"] == "message" and item["role"] == "user" for item in new_items)
    return has_user and not any(item["type"] == "tool_result" for item in new_items)


def _call_ref(record: ModelCallRecord) -> dict[str, Any]:
    return {"model_call_id": record.model_call_id, "model_ref": record.model_ref, "response_id": record.response_id}


def _turn_status(call: ProjectedCall) -> str:
    if call.record.error_category is not None:
        return "error"
    kinds = {item["type"] for item in call.output_items}
    if "tool_call" in kinds and not any(item["type"] == "tool_result" for item in call.output_items):
        return "tool_calls_pending"
    if "message" in kinds:
        return "answered"
    return "no_output"


def _turns(calls: list[ProjectedCall], task_id: str | None, rollout_id: str | None) -> list[dict[str, Any]]:
    open_turn: dict[str, dict[str, Any]] = {}
    turns: list[dict[str, Any]] = []
    steps: dict[str | None, int] = {}
    numbers: dict[str | None, int] = {}
    for call in calls:
        new_items = (call.input_items or [])[call.new_start :]
        current = open_turn.get(call.thread_id)
        if current is None or _opens_turn(new_items):
            numbers[call.invocation_id] = numbers.get(call.invocation_id, 0) + 1
            questions = _texts(new_items if current is not None else (call.input_items or []), "message", "user")
            current = {
                "invocation_id": call.invocation_id,
                "thread_id": call.thread_id,
                "task_id": task_id,
                "rollout_id": rollout_id,
                "turn_no": numbers[call.invocation_id],
                "timestamp": call.record.started_at,
                "completed_at": None,
                "question": questions[-1] if questions else None,
                "answer": None,
                "reasoning_content": None,
                "status": None,
                "resolved": None,
                "step_count": 0,
                "model_calls": [],
                "tool_call_ids": [],
            }
            open_turn[call.thread_id] = current
            turns.append(current)
        steps[call.invocation_id] = steps.get(call.invocation_id, 0) + 1
        reasoning = _texts(call.output_items, "reasoning")
        if reasoning:
            current["reasoning_content"] = "\n\n".join(filter(None, [current["reasoning_content"], *reasoning]))
        answer = _texts(call.output_items, "message")
        current["answer"] = "\n".join(answer) if answer else None
        current["status"] = _turn_status(call)
        current["completed_at"] = call.record.completed_at
        current["step_count"] = steps[call.invocation_id]
        current["model_calls"].append(_call_ref(call.record))
        current["tool_call_ids"].extend(
            item["call_id"] for item in call.output_items if item["type"] == "tool_call" and item["call_id"]
        )
    return turns


def _resolution(row: Mapping[str, Any], options: TrajectoryOptions) -> dict[str, Any]:
    reward = row.get("reward")
    reward = float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None
    resolved: bool | None = None
    source: str | None = None
    for key in RESOLVED_KEYS:
        if isinstance(row.get(key), bool):
            resolved, source = row[key], key
            break
    if resolved is None and reward is not None and options.resolved_reward_threshold is not None:
        resolved = reward >= options.resolved_reward_threshold
        source = f"reward>={options.resolved_reward_threshold:g}"
    error = row.get("error")
    failed = error not in (None, "", {}, [])
    status = "error" if failed else "unknown" if resolved is None else "resolved" if resolved else "unresolved"
    return {"status": status, "resolved": resolved, "reward": reward, "source": source}


def _mark_resolved(
    turns: list[dict[str, Any]], threads: list[dict[str, Any]], terminal_id: str | None, resolved: bool | None
) -> None:
    """Put the rollout's outcome on the turn it belongs to, when that turn is known exactly."""
    target: dict[str, Any] | None = None
    if terminal_id is not None:
        target = next(
            (turn for turn in turns if any(ref["model_call_id"] == terminal_id for ref in turn["model_calls"])), None
        )
    elif len(threads) == 1 and turns:
        target = turns[-1]
    if target is not None:
        target["resolved"] = resolved


def _model_call_entry(call: ProjectedCall, include_payloads: bool) -> dict[str, Any]:
    record = call.record
    if record.latency_total_ms is not None and record.latency_total_ms < 0:
        raise ValueError(
            f"Model call {record.model_call_id!r} has a negative latency ({record.latency_total_ms} ms); "
            "its capture line is inconsistent."
        )
    entry: dict[str, Any] = {
        "model_call_id": record.model_call_id,
        "call_index": record.call_index,
        "invocation_id": call.invocation_id,
        "thread_id": call.thread_id,
        "started_at": record.started_at,
        "completed_at": record.completed_at,
        "duration_ms": record.latency_total_ms,
        "response_metadata": {
            "response_id": record.response_id,
            "model_ref": record.model_ref,
            "model": record.model,
            "dialect": record.dialect,
            "provider": record.provider,
            "status_code": record.status_code,
            "response_status": record.response_status,
            "finish_reason": record.finish_reason,
            "finish_reason_normalized": record.finish_reason_normalized,
            "error_category": record.error_category,
            "error": record.error,
            "latency_ttft_ms": record.latency_ttft_ms,
            "stream": record.stream,
            "stream_truncated": record.stream_truncated,
        },
        "token_stats": {
            "prompt_tokens": record.tokens_in,
            "completion_tokens": record.tokens_out,
            "reasoning_tokens": record.tokens_reasoning,
            "total_tokens": record.tokens_total,
            "cached_tokens": record.cached_tokens,
            "cache_creation_tokens": record.cache_creation_tokens,
        },
        "input": None
        if call.input_items is None
        else {"continues": call.continues, "items": call.input_items[call.new_start :]},
        "output": call.output_items,
    }
    if include_payloads:
        entry["request"] = record.request if record.request is not None else record.request_raw
        entry["response"] = record.response if record.response is not None else record.response_raw
    return entry


def model_visible_input(trajectory: Mapping[str, Any], model_call_id: str) -> list[HistoryItem]:
    """Rebuild everything the model saw as input on one call, from a persisted `ng_trajectory`.

    Raises KeyError when the trajectory has no such call, and ValueError when that call's input
    was not readable (the trajectory then lists a `conversation_unavailable` gap for it).
    """
    entries = {entry["model_call_id"]: entry for entry in trajectory.get("model_calls", [])}
    chain: list[Mapping[str, Any]] = []
    current: str | None = model_call_id
    while current is not None:
        entry = entries[current]
        if entry.get("input") is None:
            raise ValueError(f"The input of model call {current!r} was not readable; see the trajectory's gaps.")
        chain.append(entry)
        continues = entry["input"].get("continues")
        current = continues["model_call_id"] if continues else None
    items: list[HistoryItem] = []
    for position in range(len(chain) - 1, -1, -1):
        entry = chain[position]
        continues = entry["input"].get("continues")
        if continues:
            parent = chain[position + 1]
            outputs = parent.get("output") or []
            if continues.get("drop_output_reasoning"):
                outputs = [item for item in outputs if item.get("type") != "reasoning"]
            items = (items + list(outputs))[: continues["items"]]
        items = items + list(entry["input"]["items"])
    return items


def model_visible_history(trajectory: Mapping[str, Any], model_call_id: str) -> list[HistoryItem]:
    """Return one call's full model-visible history: its input followed by its output."""
    entry = next(entry for entry in trajectory.get("model_calls", []) if entry["model_call_id"] == model_call_id)
    return model_visible_input(trajectory, model_call_id) + list(entry.get("output") or [])
