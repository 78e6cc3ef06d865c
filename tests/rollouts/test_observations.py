"""Agent observations: the emitter, schema validation, and the exact-only join to captured calls."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from llmtap.records import ModelCallRecord
from llmtap.rollouts.observations import (
    JOIN_GAP_SOURCE,
    AgentObservations,
    ModelCallRef,
    ObservationRecorder,
    ToolCallObservation,
    join_model_call_observations,
    model_call_owners,
)
from llmtap.store import CaptureStore
from llmtap.store.readers import read_rollout_calls
from tests.rollouts.test_attach import POLICY, captured_line

JUDGE = {"type": "responses_api_models", "name": "judge_model"}


@pytest.fixture
def records(tmp_path: Path) -> list[ModelCallRecord]:
    """Three real calls: two policy calls of one conversation and one judge call."""
    with CaptureStore(tmp_path / "model-calls") as store:
        store.append("0-0", captured_line("chat/tool-call-gpt4o", model_call_id="a", started_at=1.0, model_ref=POLICY))
        store.append("0-0", captured_line("chat/tool-result-followup-gpt4o", model_call_id="b", started_at=2.0, model_ref=POLICY))
        store.append("0-0", captured_line("responses/text-basic-gpt55", model_call_id="c", started_at=3.0, model_ref=JUDGE))
        return read_rollout_calls(store, "0-0").records


def gap_set(bundle: AgentObservations) -> set[tuple[str, str | None, str | None]]:
    return {(gap.code, gap.invocation_id, gap.detail) for gap in bundle.gaps}


def bundle_with(*invocations: dict[str, Any], records: list[dict[str, Any]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    return {
        "source": "test",
        "records": [{"kind": "agent_invocation", **invocation} for invocation in invocations] + list(records),
    }


# The emitter ------------------------------------------------------------------------------------


def test_the_recorder_builds_a_valid_bundle_with_measured_tool_timing() -> None:
    recorder = ObservationRecorder(source="my-agent")
    with recorder.invocation("main", agent="simple") as main:
        main.model_call(model_call_id="a")
        main.item("user", text="What's the weather?")
        main.item("assistant", "tool_call", call_id="call_1", name="weather", arguments={"city": "Rome"})
        with main.tool_call("call_1", "weather") as timer:
            timer.output = "40 C"
        main.item("tool", "tool_result", call_id="call_1", text="40 C")

    data = recorder.to_dict()
    bundle = AgentObservations.model_validate(data)

    invocation, tool = bundle.invocations[0], bundle.tool_calls[0]
    assert invocation.status == "completed" and invocation.agent == "simple"
    assert [item.type for item in invocation.conversation] == ["message", "tool_call", "tool_result"]
    assert (tool.invocation_id, tool.tool_call_id, tool.status, tool.output) == ("main", "call_1", "completed", "40 C")
    assert tool.timing_source == "harness"
    assert tool.started_at is not None and tool.completed_at is not None and tool.duration_ms is not None
    assert tool.started_at <= tool.completed_at and tool.duration_ms >= 0
    assert AgentObservations.model_validate(data).to_dict() == data


def test_a_failing_tool_is_recorded_failed_and_the_error_still_raised() -> None:
    recorder = ObservationRecorder(source="my-agent")
    main = recorder.invocation("main")

    with pytest.raises(RuntimeError):
        with main.tool_call("call_1", "shell"):
            raise RuntimeError("exit 1")
    with pytest.raises(TimeoutError):
        with main.tool_call("call_2", "shell"):
            raise TimeoutError

    tools = recorder.build().tool_calls
    assert [(tool.status, tool.error_type) for tool in tools] == [("failed", "RuntimeError"), ("timeout", "TimeoutError")]


def test_an_async_tool_call_is_timed_the_same_way() -> None:
    recorder = ObservationRecorder(source="my-agent")
    main = recorder.invocation("main")

    async def run() -> None:
        async with main.tool_call("call_1", "fetch") as timer:
            await asyncio.sleep(0)
            timer.status = "incomplete"

    asyncio.run(run())

    assert recorder.build().tool_calls[0].status == "incomplete"


def test_parallel_tool_calls_each_keep_their_own_interval() -> None:
    recorder = ObservationRecorder(source="my-agent")
    main = recorder.invocation("main")
    both_running = threading.Barrier(2)

    def run(call_id: str) -> None:
        with main.tool_call(call_id, "search"):
            both_running.wait(timeout=10)

    threads = [threading.Thread(target=run, args=(call_id,)) for call_id in ("call_1", "call_2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    first, second = sorted(recorder.build().tool_calls, key=lambda tool: tool.tool_call_id)
    assert first.started_at is not None and second.started_at is not None
    assert first.completed_at is not None and second.completed_at is not None
    assert first.started_at < second.completed_at and second.started_at < first.completed_at


def test_a_subagent_compaction_and_sandbox_are_recorded_with_their_links() -> None:
    recorder = ObservationRecorder(source="my-agent")
    main = recorder.invocation("main")
    helper = recorder.invocation("helper", parent_invocation_id="main", spawned_by_tool_call_id="call_9")
    helper.compaction(trigger="context_limit", tokens_before=9000, tokens_after=1200, model_calls=[{"model_call_id": "a"}])
    recorder.sandbox(sandbox_id="sb-1", role="agent", outcome="completed", exit_code=0, peak_memory_mib=512.0)
    recorder.gap("tool_output_unavailable", "call_9", invocation_id=main.invocation_id)

    bundle = recorder.build()

    assert bundle.invocations[1].parent_invocation_id == "main"
    assert bundle.compactions[0].model_calls == [ModelCallRef(model_call_id="a")]
    assert bundle.sandboxes[0].peak_memory_mib == 512.0
    assert bundle.gaps[0].source == "my-agent"


# The schema -------------------------------------------------------------------------------------


def test_invocation_ids_must_be_unique() -> None:
    with pytest.raises(ValidationError, match="appears twice"):
        AgentObservations.model_validate(bundle_with({"invocation_id": "a"}, {"invocation_id": "a"}))


def test_parent_links_must_not_form_a_cycle() -> None:
    with pytest.raises(ValidationError, match="own ancestor"):
        AgentObservations.model_validate(
            bundle_with({"invocation_id": "a", "parent_invocation_id": "b"}, {"invocation_id": "b", "parent_invocation_id": "a"})
        )


def test_a_reference_needs_a_call_id_or_a_server_and_response_id() -> None:
    with pytest.raises(ValidationError, match="model_call_id, or both"):
        ModelCallRef(response_id="resp_1")


def test_a_tool_call_cannot_complete_before_it_starts() -> None:
    with pytest.raises(ValidationError, match="precedes"):
        ToolCallObservation(invocation_id="a", tool_call_id="t", started_at=2.0, completed_at=1.0)


def test_unknown_keys_from_a_newer_agent_are_kept() -> None:
    data = bundle_with({"invocation_id": "a", "harness_version": "9"})

    assert AgentObservations.model_validate(data).to_dict()["records"][0]["harness_version"] == "9"


# The join ---------------------------------------------------------------------------------------


def test_a_reference_by_call_id_resolves_to_the_canonical_identifiers(records: list[ModelCallRecord]) -> None:
    joined = join_model_call_observations(bundle_with({"invocation_id": "main", "model_calls": [{"model_call_id": "a"}]}), records)

    assert joined.invocations[0].model_calls[0].model_dump(exclude_none=True) == {
        "model_call_id": "a",
        "model_ref": POLICY,
        "response_id": records[0].response_id,
    }


def test_a_reference_by_server_and_response_id_resolves(records: list[ModelCallRecord]) -> None:
    reference = {"model_ref": JUDGE, "response_id": records[2].response_id}

    joined = join_model_call_observations(bundle_with({"invocation_id": "judge", "model_calls": [reference]}), records)

    assert joined.invocations[0].model_calls[0].model_call_id == "c"
    assert model_call_owners(joined, records) == {2: "judge"}


def test_a_reference_to_no_captured_call_stays_unowned_with_a_gap(records: list[ModelCallRecord]) -> None:
    joined = join_model_call_observations(bundle_with({"invocation_id": "main", "model_calls": [{"model_call_id": "zzz"}]}), records)

    assert joined.invocations[0].model_calls[0].model_dump(exclude_none=True) == {"model_call_id": "zzz"}
    assert ("model_call_reference_unmatched", "main", "zzz") in gap_set(joined)


def test_a_response_id_served_twice_is_ambiguous_and_owned_by_no_one(records: list[ModelCallRecord]) -> None:
    twin = ModelCallRecord(model_call_id="d", call_index=3, model_ref=JUDGE, response_id=records[2].response_id)
    reference = {"model_ref": JUDGE, "response_id": records[2].response_id}

    joined = join_model_call_observations(bundle_with({"invocation_id": "judge", "model_calls": [reference]}), [*records, twin])

    assert ("model_call_reference_ambiguous", "judge", records[2].response_id) in gap_set(joined)
    assert model_call_owners(joined, [*records, twin]) == {}


def test_identifiers_that_disagree_with_the_call_are_a_conflict(records: list[ModelCallRecord]) -> None:
    reference = {"model_call_id": "a", "response_id": "resp_other"}

    joined = join_model_call_observations(bundle_with({"invocation_id": "main", "model_calls": [reference]}), records)

    assert ("model_call_reference_conflict", "main", "a") in gap_set(joined)
    assert joined.invocations[0].model_calls[0].response_id == "resp_other"


def test_a_call_claimed_by_two_invocations_is_owned_by_neither(records: list[ModelCallRecord]) -> None:
    bundle = bundle_with(
        {"invocation_id": "main", "model_calls": [{"model_call_id": "a"}]},
        {"invocation_id": "helper", "model_calls": [{"model_call_id": "a"}]},
    )

    joined = join_model_call_observations(bundle, records)

    assert {("model_call_reference_conflict", "main", "a"), ("model_call_reference_conflict", "helper", "a")} <= gap_set(joined)
    assert ("model_call_ownership_unavailable", None, "capture:a:call_index=0") in gap_set(joined)
    assert model_call_owners(joined, records) == {}


def test_every_captured_call_no_invocation_owns_gets_a_gap(records: list[ModelCallRecord]) -> None:
    joined = join_model_call_observations(bundle_with({"invocation_id": "main", "model_calls": [{"model_call_id": "a"}]}), records)

    assert {gap for gap in gap_set(joined) if gap[0] == "model_call_ownership_unavailable"} == {
        ("model_call_ownership_unavailable", None, "capture:b:call_index=1"),
        ("model_call_ownership_unavailable", None, "capture:c:call_index=2"),
    }
    assert all(gap.source == JOIN_GAP_SOURCE for gap in joined.gaps)


def test_compaction_calls_must_belong_to_the_compacting_invocation(records: list[ModelCallRecord]) -> None:
    compaction = {
        "kind": "context_compaction",
        "invocation_id": "main",
        "before_model_call": {"model_call_id": "a"},
        "model_calls": [{"model_call_id": "b"}, {"model_call_id": "c"}],
        "after_model_call": {"model_call_id": "b"},
    }
    bundle = bundle_with(
        {"invocation_id": "main", "model_calls": [{"model_call_id": "a"}, {"model_call_id": "b"}]},
        {"invocation_id": "judge", "model_calls": [{"model_call_id": "c"}]},
        records=[compaction],
    )

    joined = join_model_call_observations(bundle, records)

    resolved = joined.compactions[0]
    assert resolved.before_model_call is not None and resolved.before_model_call.response_id == records[0].response_id
    assert resolved.model_calls[0].response_id == records[1].response_id
    assert resolved.model_calls[1].response_id is None
    assert ("model_call_reference_conflict", "main", "model_calls:c") in gap_set(joined)


def test_a_compaction_call_nobody_owns_is_reported_as_ownership_unavailable(records: list[ModelCallRecord]) -> None:
    compaction = {"kind": "context_compaction", "invocation_id": "main", "model_calls": [{"model_call_id": "b"}]}

    joined = join_model_call_observations(bundle_with({"invocation_id": "main"}, records=[compaction]), records)

    assert ("model_call_ownership_unavailable", "main", "model_calls:b") in gap_set(joined)


def test_the_join_is_idempotent_and_keeps_the_agents_own_gaps(records: list[ModelCallRecord]) -> None:
    bundle = bundle_with(
        {"invocation_id": "main", "model_calls": [{"model_call_id": "a"}, {"model_call_id": "missing"}]},
    )
    bundle["gaps"] = [{"code": "tool_output_unavailable", "detail": "call_1"}]

    once = join_model_call_observations(bundle, records)
    twice = join_model_call_observations(once, records)

    assert twice.to_dict() == once.to_dict()
    assert ("tool_output_unavailable", None, "call_1") in gap_set(twice)


def test_the_join_leaves_its_input_untouched(records: list[ModelCallRecord]) -> None:
    bundle = AgentObservations.model_validate(bundle_with({"invocation_id": "main", "model_calls": [{"model_call_id": "a"}]}))
    before = bundle.to_dict()

    join_model_call_observations(bundle, records)

    assert bundle.to_dict() == before
