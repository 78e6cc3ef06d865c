"""The `ng_trajectory` projection over real recorded calls written through a real store.

Criteria (specs/trajectory-capabilities.md): C1 and C2 (per-call token statistics and metadata)
and C4 (model-visible history rebuilt from the persisted row) for every rollout through the
capturing server; C3 (turns), C5 (tool status and timing) and C6 (parallel tool timing) where the
agent reports observations. Follow-up requests either are real recordings or are derived from one
by the edit an agent makes (adding a user message, dropping a replayed thinking block).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtap.dialects.history import item_fingerprint, request_items
from llmtap.records import ModelCallRecord
from llmtap.rollouts.attach import attach_rollout
from llmtap.rollouts.observations import OBSERVATIONS_KEY, AgentObservations, ObservationRecorder
from llmtap.rollouts.trajectory import (
    TRAJECTORY_KEY,
    TrajectoryOptions,
    model_visible_history,
    model_visible_input,
    project_trajectory,
)
from llmtap.rollouts.trajectory_merge import ProducerTrajectoryInvalid, merge_trajectory, untimed_tool_calls
from llmtap.store import CaptureStore
from llmtap.store.readers import read_rollout_calls
from tests.dialects.test_history import JSON
from tests.fixtures import RecordedExchange, all_fixtures, fixture
from tests.rollouts.test_attach import POLICY, captured_line

ROW = {"_ng_task_index": 7, "_ng_rollout_index": 2, "reward": 1.0}
TOKEN_FIELDS = ("prompt_tokens", "completion_tokens", "reasoning_tokens", "total_tokens", "cached_tokens")


class Rollout:
    """A rollout's calls in a real capture store, and its attached, persisted and re-read row."""

    def __init__(self, root: Path) -> None:
        self.store = CaptureStore(root)
        self.clock = 1_700_000_000.0
        self.count = 0

    def call(self, fixture_id: str, request_json: Any = None, *, model_ref: dict[str, Any] | None = POLICY) -> str:
        model_call_id = f"mc-{self.count}"
        self.count += 1
        self.clock += 1.0
        line = captured_line(fixture_id, model_call_id=model_call_id, started_at=self.clock, request_json=request_json, model_ref=model_ref)
        self.store.append("7-2", line)
        return model_call_id

    def records(self) -> list[ModelCallRecord]:
        return read_rollout_calls(self.store, "7-2").records

    def persisted_row(self, **extra: Any) -> dict[str, Any]:
        """Attach, write as one JSONL line, and read it back: what a consumer of the file sees."""
        line = orjson.dumps(attach_rollout({**ROW, **extra}, self.store))
        return dict(orjson.loads(line))

    def trajectory(self, **extra: Any) -> dict[str, Any]:
        trajectory: dict[str, Any] = self.persisted_row(**extra)[TRAJECTORY_KEY]
        return trajectory


@pytest.fixture
def rollout(tmp_path: Path) -> Rollout:
    opened = Rollout(tmp_path / "model-calls")
    yield opened
    opened.store.close()


def recorded_input(fixture_id: str, request_json: Any = None) -> list[dict[str, Any]]:
    recorded = fixture(fixture_id)
    items = request_items(recorded.dialect, recorded.request_json if request_json is None else request_json)
    assert items is not None
    return items


def fingerprints(items: list[dict[str, Any]]) -> list[bytes]:
    return [item_fingerprint(item) for item in items]


def by_id(trajectory: dict[str, Any], model_call_id: str) -> dict[str, Any]:
    return next(call for call in trajectory["model_calls"] if call["model_call_id"] == model_call_id)


# C1, C2: token statistics and response metadata for every call -----------------------------------


@pytest.mark.parametrize("recorded", all_fixtures(), ids=lambda f: f.id)
def test_every_call_has_token_statistics_and_response_metadata(rollout: Rollout, recorded: RecordedExchange) -> None:
    rollout.call(recorded.id)
    record = rollout.records()[0]

    call = rollout.trajectory()["model_calls"][0]

    assert call["token_stats"] == {
        "prompt_tokens": record.tokens_in,
        "completion_tokens": record.tokens_out,
        "reasoning_tokens": record.tokens_reasoning,
        "total_tokens": record.tokens_total,
        "cached_tokens": record.cached_tokens,
        "cache_creation_tokens": record.cache_creation_tokens,
    }
    metadata = call["response_metadata"]
    assert (metadata["response_id"], metadata["model"], metadata["status_code"], metadata["error_category"]) == (
        record.response_id,
        record.model,
        recorded.status,
        record.error_category,
    )
    assert call["duration_ms"] == record.latency_total_ms and call["started_at"] == record.started_at


def test_unknown_token_counts_stay_null_not_zero(rollout: Rollout) -> None:
    rollout.call("messages/text-basic-sonnet4")

    stats = rollout.trajectory()["model_calls"][0]["token_stats"]

    assert stats["reasoning_tokens"] is None
    assert all(isinstance(stats[name], int) for name in ("prompt_tokens", "completion_tokens", "total_tokens"))


# C4: the model-visible history from the persisted row alone ---------------------------------------


@pytest.mark.parametrize(
    ("first", "follow_up"),
    [
        ("chat/tool-call-gpt4o", "chat/tool-result-followup-gpt4o"),
        ("messages/tool-use-sonnet4", "messages/tool-result-followup-sonnet4"),
        ("messages/thinking-tool-use-sonnet4", "messages/thinking-replay-request-sonnet4"),
        ("responses/function-call-gpt55", "responses/function-call-output-followup-gpt55"),
    ],
)
def test_each_calls_input_is_rebuilt_from_the_row_while_only_new_items_are_stored(
    rollout: Rollout, first: str, follow_up: str
) -> None:
    first_id, second_id = rollout.call(first), rollout.call(follow_up)

    trajectory = rollout.trajectory()

    assert fingerprints(model_visible_input(trajectory, first_id)) == fingerprints(recorded_input(first))
    assert fingerprints(model_visible_input(trajectory, second_id)) == fingerprints(recorded_input(follow_up))
    second = by_id(trajectory, second_id)["input"]
    assert second["continues"]["model_call_id"] == first_id
    assert [item["type"] for item in second["items"]] == ["tool_result"]
    assert model_visible_history(trajectory, second_id)[-1] == by_id(trajectory, second_id)["output"][-1]


def test_a_follow_up_that_drops_the_replayed_thinking_still_continues_its_call(rollout: Rollout) -> None:
    request = copy.deepcopy(fixture("messages/thinking-replay-request-sonnet4").request_json)
    request["messages"][1]["content"] = [block for block in request["messages"][1]["content"] if block["type"] != "thinking"]
    first_id = rollout.call("messages/thinking-tool-use-sonnet4")
    second_id = rollout.call("messages/thinking-replay-request-sonnet4", request)

    trajectory = rollout.trajectory()

    assert by_id(trajectory, second_id)["input"]["continues"] == {
        "model_call_id": first_id,
        "items": len(recorded_input("messages/thinking-replay-request-sonnet4", request)) - 1,
        "drop_output_reasoning": True,
    }
    assert fingerprints(model_visible_input(trajectory, second_id)) == fingerprints(
        recorded_input("messages/thinking-replay-request-sonnet4", request)
    )


def test_a_previous_response_id_request_includes_the_server_side_context(rollout: Rollout) -> None:
    first = fixture("responses/function-call-gpt55")
    first_id = rollout.call(first.id)
    record = rollout.records()[0]
    call_id = record.tool_calls[0]["call_id"]
    request = {
        "model": first.request_json["model"],
        "previous_response_id": record.response_id,
        "input": [{"type": "function_call_output", "call_id": call_id, "output": "2869461"}],
    }
    second_id = rollout.call("responses/function-call-output-followup-gpt55", request)

    trajectory = rollout.trajectory()

    assert by_id(trajectory, second_id)["input"]["continues"]["model_call_id"] == first_id
    assert fingerprints(model_visible_input(trajectory, second_id)) == fingerprints(
        recorded_input("responses/function-call-output-followup-gpt55")
    )


def test_a_previous_response_that_was_not_captured_is_a_gap(rollout: Rollout) -> None:
    recorded = fixture("responses/previous-response-id-function-call-gpt41")
    rollout.call(recorded.id)

    gaps = rollout.trajectory()["gaps"]

    assert {
        "code": "previous_response_unavailable",
        "source": "trajectory",
        "detail": recorded.request_json["previous_response_id"],
    } in gaps


def test_a_request_that_is_not_json_is_a_conversation_gap(rollout: Rollout) -> None:
    rollout.call("chat/text-basic-gpt4o", "not json at all")

    trajectory = rollout.trajectory()

    assert trajectory["model_calls"][0]["input"] is None
    assert trajectory["model_calls"][0]["request"] == '"not json at all"'
    assert {"code": "conversation_unavailable", "source": "trajectory", "detail": "model_call:mc-0:input"} in trajectory["gaps"]


# Threads, turns, resolution (C3) ----------------------------------------------------------------


def test_an_unrelated_call_forms_its_own_thread(rollout: Rollout) -> None:
    first, second = rollout.call("chat/tool-call-gpt4o"), rollout.call("chat/tool-result-followup-gpt4o")
    judge = rollout.call("responses/text-basic-gpt55", model_ref={"type": "responses_api_models", "name": "judge"})

    threads = rollout.trajectory()["threads"]

    assert [thread["model_call_ids"] for thread in threads] == [[first, second], [judge]]


def test_a_new_user_message_opens_the_next_turn(rollout: Rollout) -> None:
    first = fixture("chat/text-basic-gpt4o")
    rollout.call(first.id)
    follow_up = copy.deepcopy(first.request_json)
    follow_up["messages"] += [{"role": "assistant", "content": "Oi!"}, {"role": "user", "content": "And in Spanish?"}]
    rollout.call("chat/reasoning-tokens-o4-mini", follow_up)

    turns = rollout.trajectory(resolved=True)["turns"]

    assert [(turn["turn_no"], turn["question"], turn["step_count"]) for turn in turns] == [
        (1, "Say hi in Portuguese", 1),
        (2, "And in Spanish?", 2),
    ]
    assert turns[0]["answer"] == "Oi!" and turns[0]["status"] == "answered"
    assert [turn["resolved"] for turn in turns] == [None, True]
    assert all((turn["task_id"], turn["rollout_id"]) == ("7", "7-2") for turn in turns)


def test_a_retry_and_a_tool_round_trip_stay_in_one_turn(rollout: Rollout) -> None:
    rollout.call("chat/tool-call-gpt4o")
    rollout.call("chat/tool-call-gpt4o")
    rollout.call("chat/tool-result-followup-gpt4o")

    trajectory = rollout.trajectory()

    assert len(trajectory["threads"]) == 1
    [turn] = trajectory["turns"]
    assert turn["step_count"] == 3 and trajectory["step_count"] == 3
    assert turn["question"] == fixture("chat/tool-call-gpt4o").request_json["messages"][-1]["content"]
    assert turn["status"] == "answered" and turn["answer"].startswith("The weather in")


def test_reasoning_is_collected_per_turn(rollout: Rollout) -> None:
    rollout.call("messages/thinking-tool-use-sonnet4")

    [turn] = rollout.trajectory()["turns"]

    assert turn["reasoning_content"].startswith("The user is asking")
    assert turn["status"] == "tool_calls_pending"


def test_resolution_comes_from_an_explicit_verdict_or_an_opted_in_reward_threshold(rollout: Rollout) -> None:
    rollout.call("chat/text-basic-gpt4o")
    records = rollout.records()

    explicit = project_trajectory({**ROW, "resolved": False}, records, rollout_id="7-2")["resolution"]
    by_reward = project_trajectory(ROW, records, rollout_id="7-2", options=TrajectoryOptions(resolved_reward_threshold=1.0))
    unknown = project_trajectory(ROW, records, rollout_id="7-2")

    assert explicit == {"status": "unresolved", "resolved": False, "reward": 1.0, "source": "resolved"}
    assert by_reward["resolution"]["resolved"] is True and by_reward["turns"][0]["resolved"] is True
    assert unknown["resolution"]["status"] == "unknown"
    assert {"code": "resolution_unavailable", "source": "trajectory"} in unknown["gaps"]


def test_the_terminal_call_names_the_turn_that_earned_the_outcome(rollout: Rollout) -> None:
    policy = rollout.call("chat/text-basic-gpt4o")
    rollout.call("responses/text-basic-gpt55", model_ref={"type": "responses_api_models", "name": "judge"})
    records = rollout.records()

    without = project_trajectory({**ROW, "resolved": True}, records, rollout_id="7-2")
    named = project_trajectory({**ROW, "resolved": True}, records, rollout_id="7-2", terminal_model_call_id=policy)

    assert [turn["resolved"] for turn in without["turns"]] == [None, None]
    assert [turn["resolved"] for turn in named["turns"]] == [True, None]


def test_a_rollout_without_calls_says_what_is_missing(rollout: Rollout) -> None:
    gaps = {gap["code"] for gap in rollout.trajectory()["gaps"]}

    assert {"model_call_capture_no_records", "model_calls_unavailable", "turns_unavailable"} <= gaps


def test_a_row_without_task_index_has_no_task_identity(rollout: Rollout) -> None:
    trajectory = project_trajectory({"_ng_rollout_id": "job-1"}, [], rollout_id="job-1")

    assert trajectory["task_id"] is None
    assert {"code": "task_identity_unavailable", "source": "trajectory"} in trajectory["gaps"]


def test_payloads_can_be_left_out_of_the_projection(rollout: Rollout) -> None:
    rollout.call("chat/text-basic-gpt4o")

    trajectory = project_trajectory(ROW, rollout.records(), rollout_id="7-2", options=TrajectoryOptions(include_payloads=False))

    assert "request" not in trajectory["model_calls"][0] and trajectory["model_calls"][0]["output"]


# Tool calls (C5, C6) ------------------------------------------------------------------------------


def test_a_tool_call_gets_the_output_the_model_saw_and_a_timing_gap_without_observations(rollout: Rollout) -> None:
    rollout.call("messages/tool-use-sonnet4")
    rollout.call("messages/tool-result-followup-sonnet4")

    trajectory = rollout.trajectory()

    [tool] = trajectory["tool_calls"]
    assert (tool["tool_name"], tool["arguments"], tool["output"], tool["status"]) == (
        "weather",
        {"location": "Florence,Italy"},
        "40 C",
        "unknown",
    )
    assert (tool["requested_by_model_call_id"], tool["output_model_call_id"]) == ("mc-0", "mc-1")
    assert tool["started_at"] is None and tool["timing_source"] is None
    assert {"code": "tool_timing_unavailable", "source": "trajectory", "detail": "count=1"} in trajectory["gaps"]


def test_a_tool_result_flagged_as_error_makes_the_attempt_failed(rollout: Rollout) -> None:
    request = copy.deepcopy(fixture("messages/tool-result-followup-sonnet4").request_json)
    request["messages"][-1]["content"][0]["is_error"] = True
    rollout.call("messages/tool-use-sonnet4")
    rollout.call("messages/tool-result-followup-sonnet4", request)

    assert rollout.trajectory()["tool_calls"][0]["status"] == "failed"


def test_hosted_tools_are_marked_and_need_no_agent_timing(rollout: Rollout) -> None:
    rollout.call("messages/web-search-sonnet4")

    trajectory = rollout.trajectory()

    assert [tool["hosted"] for tool in trajectory["tool_calls"]] == [True]
    recorded = json.loads(fixture("messages/web-search-sonnet4").body_text)
    [result] = [block for block in recorded["content"] if block["type"] == "web_search_tool_result"]
    tool = trajectory["tool_calls"][0]
    assert (tool["tool_call_id"], tool["tool_name"]) == (result["tool_use_id"], "web_search")
    assert json.loads(tool["output"]) == result["content"]  # the search results the provider ran, as recorded
    assert "tool_timing_unavailable" not in {gap["code"] for gap in trajectory["gaps"]}


def test_observed_parallel_tool_calls_keep_their_own_status_and_timing(rollout: Rollout) -> None:
    rollout.call("chat/parallel-tool-calls-gpt41-nano")
    calls = rollout.records()[0].tool_calls
    recorder = ObservationRecorder(source="test-agent")
    main = recorder.invocation("main")
    main.model_call(model_call_id="mc-0")
    main.tool_result(calls[0]["call_id"], status="completed", started_at=100.0, completed_at=100.5, timing_source="executor", output="sunny")
    main.tool_result(calls[1]["call_id"], status="timeout", started_at=100.1, completed_at=102.1, timing_source="executor")

    trajectory = rollout.trajectory(**{OBSERVATIONS_KEY: recorder.to_dict()})

    tools = {tool["tool_call_id"]: tool for tool in trajectory["tool_calls"]}
    first, second = tools[calls[0]["call_id"]], tools[calls[1]["call_id"]]
    assert (first["status"], first["started_at"], first["completed_at"], first["duration_ms"]) == ("completed", 100.0, 100.5, 500.0)
    assert (second["status"], second["started_at"], second["completed_at"], second["duration_ms"]) == ("timeout", 100.1, 102.1, 2000.0)
    assert first["output"] == "sunny" and first["timing_source"] == "executor" and first["invocation_id"] == "main"
    assert "tool_timing_unavailable" not in {gap["code"] for gap in trajectory["gaps"]}


def test_owned_calls_carry_their_invocation_and_turns_number_within_it(rollout: Rollout) -> None:
    first, second = rollout.call("chat/tool-call-gpt4o"), rollout.call("chat/tool-result-followup-gpt4o")
    judge = rollout.call("responses/text-basic-gpt55", model_ref={"type": "responses_api_models", "name": "judge"})
    recorder = ObservationRecorder(source="test-agent")
    with recorder.invocation("main") as main:
        main.model_call(model_call_id=first)
        main.model_call(model_call_id=second)

    trajectory = rollout.trajectory(**{OBSERVATIONS_KEY: recorder.to_dict()})

    assert {call["model_call_id"]: call["invocation_id"] for call in trajectory["model_calls"]} == {
        first: "main",
        second: "main",
        judge: None,
    }
    assert [(turn["invocation_id"], turn["turn_no"]) for turn in trajectory["turns"]] == [("main", 1), (None, 1)]
    assert [invocation["invocation_id"] for invocation in trajectory["invocations"]] == ["main"]
    assert {"code": "model_call_ownership_unavailable", "source": "llmtap.join", "detail": f"capture:{judge}:call_index=2"} in trajectory["gaps"]


def test_compactions_and_sandbox_runs_the_agent_observed_are_carried(rollout: Rollout) -> None:
    first = rollout.call("chat/tool-call-gpt4o")
    recorder = ObservationRecorder(source="test-agent")
    main = recorder.invocation("main")
    main.model_call(model_call_id=first)
    main.compaction(trigger="context_limit", tokens_before=9000, tokens_after=1200, before_model_call={"model_call_id": first})
    recorder.sandbox(sandbox_id="sb-1", outcome="completed", exit_code=0, cpu_time_s=1.5, peak_memory_mib=256.0)

    trajectory = rollout.trajectory(**{OBSERVATIONS_KEY: recorder.to_dict()})

    [compaction] = trajectory["compactions"]
    assert compaction["before_model_call"]["response_id"] == rollout.records()[0].response_id
    assert (compaction["tokens_before"], compaction["tokens_after"]) == (9000, 1200)
    assert trajectory["sandboxes"] == [
        {"kind": "sandbox", "role": "agent", "sandbox_id": "sb-1", "outcome": "completed", "exit_code": 0,
         "cpu_time_s": 1.5, "peak_memory_mib": 256.0}
    ]


def test_an_observed_tool_call_the_model_never_made_is_still_listed(rollout: Rollout) -> None:
    recorder = ObservationRecorder(source="test-agent")
    recorder.invocation("main").tool_result("setup", "prepare_repo", status="completed", started_at=1.0, completed_at=3.0)

    trajectory = rollout.trajectory(**{OBSERVATIONS_KEY: recorder.to_dict()})

    [tool] = trajectory["tool_calls"]
    assert (tool["tool_call_id"], tool["requested_by_model_call_id"], tool["duration_ms"]) == ("setup", None, 2000.0)


def test_a_negative_latency_fails_the_projection(rollout: Rollout) -> None:
    rollout.call("chat/text-basic-gpt4o")
    record = rollout.records()[0]
    record.latency_total_ms = -1.0

    with pytest.raises(ValueError, match="negative latency"):
        project_trajectory(ROW, [record], rollout_id="7-2", observations=AgentObservations())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    calls=st.lists(
        st.tuples(st.sampled_from(["responses", "chat", "messages", None]), JSON, JSON, st.none() | st.floats(0, 10)),
        max_size=5,
    ),
    row=st.dictionaries(st.sampled_from(["_ng_task_index", "reward", "resolved", "error", "task_id"]), JSON, max_size=4),
)
def test_any_captured_payloads_project_without_raising(
    calls: list[tuple[str | None, Any, Any, float | None]], row: dict[str, Any]
) -> None:
    records = [
        ModelCallRecord(
            model_call_id=f"m{index}",
            call_index=index,
            dialect=dialect,
            request=request if isinstance(request, dict) else None,
            response=response if isinstance(response, dict) else None,
            started_at=started,
        )
        for index, (dialect, request, response, started) in enumerate(calls)
    ]

    trajectory = project_trajectory(row, records, rollout_id="0-0")

    assert len(trajectory["model_calls"]) == len(records)
    for entry in trajectory["model_calls"]:
        if entry["input"] is not None:
            model_visible_input(trajectory, entry["model_call_id"])
    json.dumps(trajectory)  # the standard library: a row may carry integers beyond 64 bits


# --- merging an agent's own trajectory (rollouts.trajectory_merge) --------------------------------


def _projection() -> dict[str, Any]:
    lines = [
        captured_line("chat/tool-call-gpt4o", model_call_id="mc-0", started_at=1.0, model_ref=POLICY),
        captured_line("chat/tool-result-followup-gpt4o", model_call_id="mc-1", started_at=2.0, model_ref=POLICY),
    ]
    records = [ModelCallRecord.from_raw_line(line, index) for index, line in enumerate(lines)]
    return project_trajectory({**ROW, "_ng_task_index": 3, "_ng_rollout_index": 1}, records, rollout_id="3-1")


PROJECTION = _projection()
leaf = st.none() | st.booleans() | st.integers(-3, 3) | st.floats(0, 5) | st.text("ab", max_size=2)
tool_entry = st.fixed_dictionaries(
    {"tool_call_id": st.sampled_from([None, "call_IUonKM9GCNis5eMRHuusMqoy", "other"])},
    optional={
        "invocation_id": st.sampled_from([None, "inv-0", "inv-1"]),
        "status": leaf,
        "duration_ms": leaf,
        "started_at": leaf,
        "output": leaf,
        "hosted": st.booleans(),
    },
)
model_entry = st.fixed_dictionaries(
    {"model_call_id": st.sampled_from([None, "mc-0", "mc-1", "mc-9"])},
    optional={"duration_ms": leaf, "token_stats": st.dictionaries(st.sampled_from(TOKEN_FIELDS), leaf, max_size=3)},
)
agent_records = st.fixed_dictionaries(
    {},
    optional={
        "schema_version": st.just("1.0"),
        "task_id": st.sampled_from([None, "3"]),
        "rollout_id": st.sampled_from([None, "3-1"]),
        "step_count": leaf,
        "turns": st.lists(st.dictionaries(st.sampled_from(["turn_no", "answer"]), leaf, max_size=2), max_size=2),
        "tool_calls": st.lists(tool_entry, max_size=3),
        "model_calls": st.lists(model_entry, max_size=3),
        "resolution": st.dictionaries(st.sampled_from(["status", "resolved", "reward"]), leaf, max_size=3),
        "gaps": st.lists(
            st.fixed_dictionaries({"code": st.sampled_from(["tool_timing_unavailable", "agent_gap"])}), max_size=2
        ),
        "extra": leaf,
    },
)


def _kept(agent: Any, merged: Any) -> bool:
    """Every non-null value the agent reported is in `merged`, at the same place (lists: entries kept)."""
    if isinstance(agent, dict):
        return isinstance(merged, dict) and all(
            value is None or (key in merged and _kept(value, merged[key])) for key, value in agent.items()
        )
    if isinstance(agent, list):
        return isinstance(merged, list) and len(merged) >= len(agent) and all(map(_kept, agent, merged))
    return bool(agent == merged)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(agent=agent_records)
def test_a_merge_keeps_every_value_the_agent_reported_and_is_idempotent(agent: dict[str, Any]) -> None:
    original, projection = copy.deepcopy(agent), copy.deepcopy(PROJECTION)

    merged = merge_trajectory(agent, PROJECTION)

    assert agent == original and projection == PROJECTION  # neither input changes
    kept_keys = {key: value for key, value in agent.items() if key != "gaps"}
    assert _kept(kept_keys, merged)
    assert merge_trajectory(merged, PROJECTION) == merged
    assert all(gap in merged["gaps"] for gap in agent.get("gaps", []) if gap["code"] != "tool_timing_unavailable")
    untimed = untimed_tool_calls(merged["tool_calls"])
    timing_gaps = [gap for gap in merged["gaps"] if gap["code"] == "tool_timing_unavailable"]
    expected = {"code": "tool_timing_unavailable", "source": "trajectory", "detail": f"count={untimed}"}
    assert timing_gaps == ([expected] if untimed else [])


def test_merging_a_projection_into_itself_changes_nothing() -> None:
    assert merge_trajectory(copy.deepcopy(PROJECTION), PROJECTION) == PROJECTION


def test_a_capture_call_joins_only_an_agent_entry_of_a_compatible_invocation() -> None:
    agent = {"tool_calls": [{"tool_call_id": "call_IUonKM9GCNis5eMRHuusMqoy", "invocation_id": "inv-0"}]}
    capture = copy.deepcopy(PROJECTION)
    capture["tool_calls"][0]["invocation_id"] = "inv-1"

    merged = merge_trajectory(agent, capture)

    assert [entry["invocation_id"] for entry in merged["tool_calls"]] == ["inv-0", "inv-1"]
    assert merged["tool_calls"][0] == agent["tool_calls"][0]


@pytest.mark.parametrize("value", [None, "x", 3, [], {"schema_version": "0.9"}], ids=repr)
def test_a_value_that_is_not_a_schema_1_0_record_is_refused(value: Any) -> None:
    with pytest.raises(ProducerTrajectoryInvalid):
        merge_trajectory(value, PROJECTION)
