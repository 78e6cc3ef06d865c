"""The `ng_model_call_capture` attachment and `attach_file`, over real recorded calls in a real store.

`captured_line` (also used by the trajectory and observation tests) turns a recorded exchange into
the line a capture point persists, through the real pipeline (`raw_line_from_exchange`).
"""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from llmtap.errors import StoreError
from llmtap.exchange import Exchange
from llmtap.records import aggregate_metrics, raw_line_from_exchange
from llmtap.rollouts.attach import (
    CAPTURE_KEY,
    AttachOptions,
    AttachReport,
    attach_file,
    attach_rollout,
)
from llmtap.rollouts.observations import OBSERVATIONS_KEY, ObservationRecorder
from llmtap.rollouts.trajectory import TRAJECTORY_KEY
from llmtap.store import CaptureStore
from llmtap.store.readers import read_rollout_calls
from tests.fixtures import fixture

TOOL_CALL = "chat/tool-call-gpt4o"
TOOL_ANSWER = "chat/tool-result-followup-gpt4o"
PAYLOAD_KEYS = {"request", "response", "request_raw", "response_raw"}
POLICY = {"type": "responses_api_models", "name": "policy_model"}


def captured_line(
    fixture_id: str,
    *,
    model_call_id: str,
    started_at: float,
    request_json: Any = None,
    model_ref: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The persisted line of one recorded exchange, as the capture pipeline builds it."""
    recorded = fixture(fixture_id)
    body = recorded.request_json if request_json is None else request_json
    exchange = Exchange(
        method="POST",
        path=recorded.request_path,
        request_body=json.dumps(body).encode(),
        model_call_id=model_call_id,
        model_ref=model_ref,
    )
    exchange.started_at = started_at
    exchange.status_code = recorded.status
    exchange.response_headers = {"content-type": recorded.content_type}
    exchange.add_response_chunk(recorded.body_bytes)
    exchange.finish()
    return raw_line_from_exchange(exchange)


def store_fixtures(store: CaptureStore, rollout_id: str, *fixture_ids: str, start: float = 1_700_000_000.0) -> None:
    for position, fixture_id in enumerate(fixture_ids):
        store.append(
            rollout_id,
            captured_line(fixture_id, model_call_id=f"mc-{position}", started_at=start + position, model_ref=POLICY),
        )


def row_for(task: int = 3, rollout: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
        "responses_create_params": {"input": [{"role": "user", "content": "What's the weather?"}]},
        "response": {"id": "resp_final", "output": [{"type": "message", "content": "40 C"}]},
        "reward": 1.0,
        **extra,
    }


@pytest.fixture
def store(tmp_path: Path) -> CaptureStore:
    with CaptureStore(tmp_path / "model-calls") as opened:
        yield opened


def test_attachment_carries_id_metrics_and_calls_without_payloads_and_no_gaps_key(store: CaptureStore) -> None:
    store_fixtures(store, "3-1", TOOL_CALL, TOOL_ANSWER)

    attachment = attach_rollout(row_for(), store)[CAPTURE_KEY]

    assert set(attachment) == {"rollout_id", "metrics", "calls", "attribution"}
    assert attachment["rollout_id"] == "3-1"
    assert [call["call_index"] for call in attachment["calls"]] == [0, 1]
    assert all(not PAYLOAD_KEYS & set(call) for call in attachment["calls"])
    records = read_rollout_calls(store, "3-1").records
    assert attachment["metrics"] == aggregate_metrics(records)
    assert attachment["metrics"]["tokens_total"] == sum(record.tokens_total or 0 for record in records)
    assert attachment["metrics"]["num_calls"] == 2


def test_every_other_row_field_is_left_exactly_as_it_was(store: CaptureStore) -> None:
    store_fixtures(store, "3-1", TOOL_CALL)
    row = row_for(token_ids=[1, 2, 3], logprobs=[-0.5])
    original = copy.deepcopy(row)

    attached = attach_rollout(row, store)

    assert row == original
    assert {key: value for key, value in attached.items() if key not in (CAPTURE_KEY, TRAJECTORY_KEY)} == original


def test_a_rollout_without_a_capture_file_gets_no_records(store: CaptureStore) -> None:
    attachment = attach_rollout(row_for(), store)[CAPTURE_KEY]

    assert attachment["calls"] == []
    assert attachment["metrics"]["num_calls"] == 0
    assert attachment["metrics"]["tokens_total"] is None
    assert attachment["gaps"] == [{"code": "model_call_capture_no_records"}]


def test_an_empty_capture_file_gets_no_records(store: CaptureStore) -> None:
    store.path_for("3-1").write_bytes(b"")

    assert attach_rollout(row_for(), store)[CAPTURE_KEY]["gaps"] == [{"code": "model_call_capture_no_records"}]


def test_a_damaged_middle_line_is_counted_and_keeps_the_others_indices(store: CaptureStore) -> None:
    first = orjson.dumps(captured_line(TOOL_CALL, model_call_id="a", started_at=1.0))
    last = orjson.dumps(captured_line(TOOL_ANSWER, model_call_id="b", started_at=2.0))
    store.path_for("3-1").write_bytes(first + b"\n{not json\n" + last + b"\n")

    attachment = attach_rollout(row_for(), store)[CAPTURE_KEY]

    assert [call["call_index"] for call in attachment["calls"]] == [0, 2]
    assert attachment["gaps"] == [{"code": "model_call_capture_records_unreadable", "detail": "count=1"}]


def test_the_incomplete_marker_becomes_a_gap(store: CaptureStore) -> None:
    store_fixtures(store, "3-1", TOOL_CALL)
    store.mark_incomplete("3-1", "test")

    assert {"code": "model_call_capture_incomplete"} in attach_rollout(row_for(), store)[CAPTURE_KEY]["gaps"]


def test_calls_of_a_cleared_attempt_are_counted_as_late_writes_and_never_attached(store: CaptureStore) -> None:
    stale = captured_line(TOOL_CALL, model_call_id="stale", started_at=1.0)
    store.clear("3-1")
    store.append("3-1", stale)
    store_fixtures(store, "3-1", TOOL_ANSWER, start=4_000_000_000.0)

    attachment = attach_rollout(row_for(), store)[CAPTURE_KEY]

    assert [call["model_call_id"] for call in attachment["calls"]] == ["mc-0"]
    assert attachment["gaps"] == [{"code": "model_call_capture_late_writes", "detail": "count=1"}]


def test_a_torn_tail_is_reported(store: CaptureStore) -> None:
    store_fixtures(store, "3-1", TOOL_CALL)
    with store.path_for("3-1").open("ab") as handle:
        handle.write(b'{"model_call_id": "half')

    attachment = attach_rollout(row_for(), store)[CAPTURE_KEY]

    assert len(attachment["calls"]) == 1
    assert attachment["gaps"] == [{"code": "model_call_capture_torn_tail"}]


def test_a_capture_that_cannot_be_read_becomes_an_unreadable_gap(store: CaptureStore) -> None:
    store.path_for("3-1").mkdir(parents=True)

    attachment = attach_rollout(row_for(), store)[CAPTURE_KEY]

    assert attachment["calls"] == []
    assert attachment["gaps"] == [{"code": "model_call_capture_unreadable", "detail": "StoreError"}]


def test_a_row_naming_no_rollout_gets_a_gap_not_an_error(store: CaptureStore) -> None:
    attachment = attach_rollout({"reward": 0.0}, store)[CAPTURE_KEY]

    assert attachment["rollout_id"] is None
    assert [gap["code"] for gap in attachment["gaps"]] == ["rollout_id_unavailable"]


def test_an_invalid_explicit_rollout_id_gets_a_gap_naming_the_error(store: CaptureStore) -> None:
    attachment = attach_rollout({"_ng_rollout_id": "../escape"}, store)[CAPTURE_KEY]

    assert attachment["gaps"] == [{"code": "rollout_id_unavailable", "detail": "InvalidRolloutIdError"}]


def test_a_retry_attempt_reads_only_its_own_suffixed_capture(store: CaptureStore) -> None:
    store_fixtures(store, "3-1", TOOL_CALL)
    store_fixtures(store, "3-1-a2", TOOL_ANSWER)

    attachment = attach_rollout(row_for(_ng_attempt_index=2), store)[CAPTURE_KEY]

    assert attachment["rollout_id"] == "3-1-a2"
    assert [call["response_id"] for call in attachment["calls"]] == [
        read_rollout_calls(store, "3-1-a2").records[0].response_id
    ]


def test_after_projection_payloads_live_in_the_trajectory_only(store: CaptureStore) -> None:
    store_fixtures(store, "3-1", TOOL_CALL, TOOL_ANSWER)

    attached = attach_rollout(row_for(), store)

    assert all(not PAYLOAD_KEYS & set(call) for call in attached[CAPTURE_KEY]["calls"])
    calls = attached[TRAJECTORY_KEY]["model_calls"]
    assert [call["request"] for call in calls] == [fixture(TOOL_CALL).request_json, fixture(TOOL_ANSWER).request_json]


def test_keep_payloads_out_leaves_no_payload_copy_anywhere(store: CaptureStore) -> None:
    store_fixtures(store, "3-1", TOOL_CALL)

    attached = attach_rollout(row_for(), store, options=AttachOptions(keep_payloads_out=True))

    assert all(not PAYLOAD_KEYS & set(call) for call in attached[CAPTURE_KEY]["calls"])
    assert all(not PAYLOAD_KEYS & set(call) for call in attached[TRAJECTORY_KEY]["model_calls"])


def test_without_a_trajectory_payloads_are_attached_only_when_asked(store: CaptureStore) -> None:
    store_fixtures(store, "3-1", TOOL_CALL)

    plain = attach_rollout(row_for(), store, options=AttachOptions(trajectory=False))
    asked = attach_rollout(row_for(), store, options=AttachOptions(trajectory=False, include_payloads=True))

    assert TRAJECTORY_KEY not in plain
    assert not PAYLOAD_KEYS & set(plain[CAPTURE_KEY]["calls"][0])
    assert asked[CAPTURE_KEY]["calls"][0]["request"] == fixture(TOOL_CALL).request_json


def test_a_failed_projection_keeps_payloads_on_the_calls_and_says_why(store: CaptureStore) -> None:
    line = captured_line(TOOL_CALL, model_call_id="broken", started_at=1.0)
    line["latency_ms"] = -5.0
    store.append("3-1", line)
    attached = attach_rollout(row_for(), store)
    # A trajectory the agent wrote itself is not capture's to drop: it stays exactly as it was.
    kept = attach_rollout(row_for(**{TRAJECTORY_KEY: {"agent": "own"}}), store)

    assert TRAJECTORY_KEY not in attached
    assert kept[TRAJECTORY_KEY] == {"agent": "own"}
    assert kept[CAPTURE_KEY]["gaps"] == [{"code": "trajectory_projection_failed", "detail": "ValueError"}]
    assert attached[CAPTURE_KEY]["calls"][0]["request"] == fixture(TOOL_CALL).request_json
    assert attached[CAPTURE_KEY]["gaps"] == [{"code": "trajectory_projection_failed", "detail": "ValueError"}]


def test_agent_observations_are_joined_to_the_captured_calls(store: CaptureStore) -> None:
    store_fixtures(store, "3-1", TOOL_CALL, TOOL_ANSWER)
    recorder = ObservationRecorder(source="test-agent")
    with recorder.invocation("main") as main:
        main.model_call(model_call_id="mc-0")
        main.model_call(model_call_id="mc-1")

    attached = attach_rollout(row_for(**{OBSERVATIONS_KEY: recorder.to_dict()}), store)

    invocation = attached[OBSERVATIONS_KEY]["records"][0]
    records = read_rollout_calls(store, "3-1").records
    assert [ref["response_id"] for ref in invocation["model_calls"]] == [record.response_id for record in records]
    assert "gaps" not in attached[OBSERVATIONS_KEY] or attached[OBSERVATIONS_KEY]["gaps"] == []
    assert {call["invocation_id"] for call in attached[TRAJECTORY_KEY]["model_calls"]} == {"main"}


def test_invalid_observations_are_left_as_sent_and_noted_in_the_trajectory(store: CaptureStore) -> None:
    store_fixtures(store, "3-1", TOOL_CALL)
    invalid = {"source": "x", "records": [{"kind": "agent_invocation"}]}

    attached = attach_rollout(row_for(**{OBSERVATIONS_KEY: invalid}), store)

    assert attached[OBSERVATIONS_KEY] == invalid
    assert {"code": "agent_observations_invalid", "source": "agent_observations"} in attached[TRAJECTORY_KEY]["gaps"]


def test_attaching_twice_gives_the_same_row(store: CaptureStore) -> None:
    store_fixtures(store, "3-1", TOOL_CALL, TOOL_ANSWER)
    recorder = ObservationRecorder(source="test-agent")
    recorder.invocation("main").model_call(model_call_id="mc-0")
    once = attach_rollout(row_for(**{OBSERVATIONS_KEY: recorder.to_dict()}), store)

    assert attach_rollout(once, store) == once


# attach_file --------------------------------------------------------------------------------------


def write_jsonl(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(line + b"\n" for line in lines))


def test_attach_file_attaches_every_row_in_order(store: CaptureStore, tmp_path: Path) -> None:
    store_fixtures(store, "0-0", TOOL_CALL)
    store_fixtures(store, "1-0", TOOL_CALL, TOOL_ANSWER)
    source = tmp_path / "rollouts.jsonl"
    write_jsonl(source, [orjson.dumps(row_for(0, 0)), orjson.dumps(row_for(1, 0)), orjson.dumps(row_for(2, 0))])

    report = attach_file(source, tmp_path / "out.jsonl", store.root)

    rows = [orjson.loads(line) for line in (tmp_path / "out.jsonl").read_bytes().splitlines()]
    assert [row[CAPTURE_KEY]["rollout_id"] for row in rows] == ["0-0", "1-0", "2-0"]
    assert [len(row[CAPTURE_KEY]["calls"]) for row in rows] == [1, 2, 0]
    assert (report.rows, report.attached, report.calls, report.bad_lines) == (3, 3, 3, 0)
    assert report.gap_counts == {"model_call_capture_no_records": 1}


def test_a_bad_input_line_is_written_back_unchanged_and_reported(store: CaptureStore, tmp_path: Path) -> None:
    store_fixtures(store, "0-0", TOOL_CALL)
    source = tmp_path / "rollouts.jsonl"
    write_jsonl(source, [b"{truncated", b"", b"[1, 2]", orjson.dumps(row_for(0, 0))])

    report = attach_file(source, tmp_path / "out.jsonl", store)

    lines = (tmp_path / "out.jsonl").read_bytes().split(b"\n")
    assert lines[:3] == [b"{truncated", b"", b"[1, 2]"]
    assert orjson.loads(lines[3])[CAPTURE_KEY]["rollout_id"] == "0-0"
    assert report.bad_lines == 2
    assert [number for number, _reason in report.bad_line_samples] == [1, 3]


def test_a_row_with_nan_keeps_its_nan(store: CaptureStore, tmp_path: Path) -> None:
    source = tmp_path / "rollouts.jsonl"
    write_jsonl(source, [b'{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": NaN}'])

    attach_file(source, source, store)

    row = json.loads(source.read_bytes())
    assert math.isnan(row["reward"])
    assert row[CAPTURE_KEY]["gaps"] == [{"code": "model_call_capture_no_records"}]


def test_attach_file_can_rewrite_its_input_in_place(store: CaptureStore, tmp_path: Path) -> None:
    store_fixtures(store, "0-0", TOOL_CALL)
    source = tmp_path / "rollouts.jsonl"
    write_jsonl(source, [orjson.dumps(row_for(0, 0))])

    attach_file(source, source, store)

    assert orjson.loads(source.read_bytes())[CAPTURE_KEY]["metrics"]["num_calls"] == 1
    assert sorted(os.listdir(tmp_path)) == ["model-calls", "rollouts.jsonl"]


def test_an_interrupted_run_leaves_the_output_untouched_and_no_temporary_file(store: CaptureStore, tmp_path: Path) -> None:
    source = tmp_path / "rollouts.jsonl"
    write_jsonl(source, [orjson.dumps(row_for(task, 0)) for task in range(1500)])
    target = tmp_path / "out.jsonl"
    target.write_bytes(b"previous\n")

    def interrupt(report: AttachReport) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        attach_file(source, target, store, progress=interrupt)

    assert target.read_bytes() == b"previous\n"
    assert sorted(os.listdir(tmp_path)) == ["model-calls", "out.jsonl", "rollouts.jsonl"]


def test_attach_file_refuses_a_capture_directory_that_does_not_exist(tmp_path: Path) -> None:
    source = tmp_path / "rollouts.jsonl"
    write_jsonl(source, [orjson.dumps(row_for())])

    with pytest.raises(StoreError, match="does not exist"):
        attach_file(source, tmp_path / "out.jsonl", tmp_path / "missing")


def test_attachment_names_the_call_whose_response_the_agent_returned(tmp_path: Path) -> None:
    from llmtap.exchange import Exchange
    from llmtap.records import raw_line_from_exchange
    from tests.fixtures import fixture as recorded_fixture

    store = CaptureStore(tmp_path)
    ids = []
    for name in ("chat/tool-call-gpt4o", "chat/tool-result-followup-gpt4o"):
        recorded = recorded_fixture(name)
        exchange = Exchange(method="POST", path=recorded.request_path, request_body=json.dumps(recorded.request_json).encode())
        exchange.status_code = 200
        exchange.response_headers = {"content-type": recorded.content_type}
        exchange.add_response_chunk(recorded.body_bytes)
        line = raw_line_from_exchange(exchange)
        ids.append(line["model_call_id"])
        store.append("0-0", line)
    final = json.loads(recorded_fixture("chat/tool-result-followup-gpt4o").body_text)
    row = attach_rollout({"_ng_task_index": 0, "_ng_rollout_index": 0, "response": final, "reward": 1.0}, store)
    attribution = row["ng_model_call_capture"]["attribution"]
    assert attribution["attributed"] and attribution["model_call_id"] == ids[1]
    assert "response_id" in attribution["method"]
    assert row["reward"] == 1.0 and row["response"] == final


def test_explicit_terminal_call_key_is_used(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    row = attach_rollout({"_ng_rollout_id": "x", "_ng_terminal_model_call_id": "nope"}, store)
    attribution = row["ng_model_call_capture"]["attribution"]
    assert not attribution["attributed"]
    assert attribution["witnesses"]["explicit"]["verdict"] == "abstained"


# an agent's own ng_trajectory -----------------------------------------------------------------------

WEATHER_CALL_ID = "call_IUonKM9GCNis5eMRHuusMqoy"


def reference_agent_trajectory() -> dict[str, Any]:
    """The `ng_trajectory` an agent that reports its own (the reference system's) writes for 3-1."""
    return {
        "schema_version": "1.0",
        "task_id": "3",
        "task_index": 3,
        "rollout_index": 1,
        "attempt_index": None,
        "rollout_id": "3-1",
        "invocations": [{"invocation_id": "inv-0", "agent_name": "simple_agent"}],
        "model_calls": [],
        "turns": [
            {
                "invocation_id": "inv-0",
                "turn_no": 1,
                "question": "What's the weather in Florence,Italy?",
                "answer": "The weather in Florence, Italy is currently 40\u00b0C.",
                "status": "answered",
                "resolved": True,
                "step_count": 2,
            }
        ],
        "tool_calls": [
            {
                "invocation_id": "inv-0",
                "tool_call_id": WEATHER_CALL_ID,
                "tool_name": "weather",
                "status": "completed",
                "output": None,
                "started_at": 1_700_000_000.4,
                "completed_at": 1_700_000_000.40163,
                "duration_ms": 1.63,
                "timing_source": "agent",
            },
            {
                "invocation_id": "inv-0",
                "tool_call_id": "local-1",
                "tool_name": "cleanup",
                "status": "completed",
                "duration_ms": 0.2,
            },
        ],
        "resolution": {"status": "resolved", "resolved": True, "reward": 1.0, "source": "verifier"},
        "step_count": 2,
        "gaps": [{"code": "multimodal_history_redacted", "source": "producer"}],
    }


def test_attach_keeps_the_agents_own_trajectory_and_adds_what_capture_knows(store: CaptureStore) -> None:
    store_fixtures(store, "3-1", TOOL_CALL, TOOL_ANSWER)
    own = reference_agent_trajectory()
    row = row_for(**{TRAJECTORY_KEY: copy.deepcopy(own)})

    merged = attach_rollout(row, store)[TRAJECTORY_KEY]
    projected_alone = attach_rollout(row_for(), store)[TRAJECTORY_KEY]

    # What replacing used to give: capture alone cannot time the tool.
    weather_alone = next(t for t in projected_alone["tool_calls"] if t["tool_call_id"] == WEATHER_CALL_ID)
    assert weather_alone["status"] == "unknown" and weather_alone["duration_ms"] is None
    assert {"code": "tool_timing_unavailable", "source": "trajectory", "detail": "count=1"} in projected_alone["gaps"]
    # Merged: the agent's status and timing stay, capture adds the call that asked and the output shown.
    weather = next(t for t in merged["tool_calls"] if t["tool_call_id"] == WEATHER_CALL_ID)
    assert {key: weather[key] for key in own["tool_calls"][0] if key != "output"} == {
        key: value for key, value in own["tool_calls"][0].items() if key != "output"
    }
    assert weather["output"] == "40 C"  # the agent left it null: the model-visible output fills it
    assert weather["requested_by_model_call_id"] == "mc-0" and weather["output_model_call_id"] == "mc-1"
    assert weather["arguments"] == {"location": "Florence, Italy"}
    assert merged["tool_calls"][1] == own["tool_calls"][1]  # a tool capture never saw stays
    assert len(merged["tool_calls"]) == 2
    assert "tool_timing_unavailable" not in {gap["code"] for gap in merged["gaps"]}
    # Everything else the agent reported is kept; capture adds the calls it recorded.
    for key in ("turns", "invocations", "resolution", "step_count", "task_id", "rollout_id"):
        assert merged[key] == own[key]
    assert [call["model_call_id"] for call in merged["model_calls"]] == ["mc-0", "mc-1"]
    assert merged["model_calls"][0]["request"] == fixture(TOOL_CALL).request_json
    assert merged["threads"] == projected_alone["threads"]
    assert merged["gaps"][0] == own["gaps"][0]
    assert "model_calls_unavailable" not in {gap["code"] for gap in merged["gaps"]}
    # The payloads live in the merged trajectory, so the attached calls leave them out.
    assert all(not PAYLOAD_KEYS & set(call) for call in attach_rollout(row, store)[CAPTURE_KEY]["calls"])


def test_attaching_an_agents_trajectory_twice_gives_the_same_row(store: CaptureStore) -> None:
    store_fixtures(store, "3-1", TOOL_CALL, TOOL_ANSWER)
    once = attach_rollout(row_for(**{TRAJECTORY_KEY: reference_agent_trajectory()}), store)

    assert attach_rollout(once, store) == once


def test_an_agents_trajectory_for_another_rollout_is_kept_unmerged_with_the_mismatch_noted(
    store: CaptureStore,
) -> None:
    store_fixtures(store, "3-1", TOOL_CALL)
    own = {**reference_agent_trajectory(), "rollout_id": "9-9"}

    merged = attach_rollout(row_for(**{TRAJECTORY_KEY: copy.deepcopy(own)}), store)[TRAJECTORY_KEY]

    assert {key: value for key, value in merged.items() if key != "gaps"} == {
        key: value for key, value in own.items() if key != "gaps"
    }
    assert merged["gaps"] == [
        *own["gaps"],
        {"code": "producer_trajectory_identity_mismatch", "source": "trajectory", "detail": "rollout_id"},
    ]


@pytest.mark.parametrize("value", ["text", [1, 2], {"schema_version": "2.0", "turns": [1]}], ids=repr)
def test_an_agents_trajectory_that_is_not_schema_1_0_is_left_exactly_as_it_was(store: CaptureStore, value: Any) -> None:
    store_fixtures(store, "3-1", TOOL_CALL)

    attached = attach_rollout(row_for(**{TRAJECTORY_KEY: copy.deepcopy(value)}), store)

    assert attached[TRAJECTORY_KEY] == value
    assert attached[CAPTURE_KEY]["gaps"] == [{"code": "producer_trajectory_invalid", "detail": type(value).__name__}]
    # No trajectory of ours holds the payloads, so the attached calls keep them.
    assert attached[CAPTURE_KEY]["calls"][0]["request"] == fixture(TOOL_CALL).request_json
