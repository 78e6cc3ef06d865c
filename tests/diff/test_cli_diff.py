"""`llmtap diff A B` through the CLI: each regression class fails the gate, identical runs pass, bad inputs exit 2."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from llmtap.cli import main
from llmtap.diff.render import DIFF_SCHEMA
from tests.diff.runs import agent_run, answer_with, line_for, write_capsule, write_rows, write_run
from tests.fixtures import fixture


def run_diff(*args: str | Path) -> Result:
    return CliRunner().invoke(main, ["diff", *map(str, args)], catch_exceptions=False)


def diff_json(*args: str | Path) -> tuple[int, dict[str, Any]]:
    result = run_diff(*args, "--json")
    return result.exit_code, json.loads(result.output)


@pytest.fixture
def run_a(tmp_path: Path) -> Path:
    return write_run(tmp_path / "a", agent_run())


def codes(payload: dict[str, Any]) -> list[str]:
    return [reason["code"] for reason in payload["gate"]["reasons"]]


def test_identical_runs_pass_the_gate_with_every_call_unchanged(tmp_path: Path, run_a: Path) -> None:
    run_b = write_run(tmp_path / "b", agent_run())
    code, payload = diff_json(run_a, run_b, "--assert-no-regressions")
    assert code == 0
    assert payload["summary"]["calls"] == {"unchanged": 7, "changed": 0, "added": 0, "removed": 0}
    assert payload["summary"]["rollouts"]["unchanged"] == 4
    assert payload["rollouts"] == [] and payload["gate"] == {
        "passed": True,
        "reasons": [],
        "unlisted": {},
        "unchecked": [],
    }
    text = run_diff(run_a, run_b, "--assert-no-regressions")
    assert text.exit_code == 0 and "gate: no regressions" in text.output


def test_a_removed_call_fails_the_gate_and_the_rest_still_pair(tmp_path: Path, run_a: Path) -> None:
    rollouts = agent_run()
    del rollouts["0-0"][0]
    run_b = write_run(tmp_path / "b", rollouts)
    code, payload = diff_json(run_a, run_b, "--assert-no-regressions")
    assert code == 1
    assert payload["summary"]["calls"] == {"unchanged": 6, "changed": 0, "added": 0, "removed": 1}
    assert codes(payload) == ["call_removed"]
    (reason,) = payload["gate"]["reasons"]
    # A removed call exists only in run A: the reason points at its line there.
    assert reason["file"] == str((run_a / "0-0.capture.jsonl").resolve()) and reason["line"] == 1
    (rollout,) = payload["rollouts"]
    assert rollout["key"] == "0-0" and [c["status"] for c in rollout["calls"]] == ["removed"]
    assert rollout["tool_sequence"] == {"before": ["weather"], "after": []}


def test_an_added_call_fails_unless_allowed(tmp_path: Path, run_a: Path) -> None:
    rollouts = agent_run()
    rollouts["1-1"].insert(0, line_for(fixture("chat/refusal-gpt4o"), rollout_id="1-1", latency_ms=100.0))
    run_b = write_run(tmp_path / "b", rollouts)
    code, payload = diff_json(run_a, run_b, "--assert-no-regressions")
    assert code == 1 and codes(payload) == ["call_added"]
    added = payload["rollouts"][0]["calls"][0]
    assert added["status"] == "added" and added["call_index"] == 0
    assert payload["summary"]["calls"]["unchanged"] == 7
    assert run_diff(run_a, run_b, "--assert-no-regressions", "--allow-added").exit_code == 0


def test_an_allowed_new_call_may_still_not_fail(tmp_path: Path, run_a: Path) -> None:
    rollouts = agent_run()
    rollouts["1-1"].append(line_for(fixture("chat/error-404-model-not-found"), rollout_id="1-1"))
    run_b = write_run(tmp_path / "b", rollouts)
    code, payload = diff_json(run_a, run_b, "--assert-no-regressions", "--allow-added")
    assert code == 1 and codes(payload) == ["added_call_error"]
    assert "failed (not_found)" in payload["gate"]["reasons"][0]["message"]


def test_a_success_that_became_an_error_fails_the_gate(tmp_path: Path, run_a: Path) -> None:
    rollouts = agent_run()
    error = fixture("chat/error-404-model-not-found")
    rollouts["1-1"] = [
        line_for(
            fixture("chat/text-basic-gpt4o"), rollout_id="1-1", body=error.body_bytes, status=404, latency_ms=100.0
        )
    ]
    run_b = write_run(tmp_path / "b", rollouts)
    code, payload = diff_json(run_a, run_b, "--assert-no-regressions")
    assert code == 1 and codes(payload) == ["became_error"]
    (call,) = payload["rollouts"][0]["calls"]
    assert call["error"] == {"before": None, "after": "not_found", "status_before": 200, "status_after": 404}
    assert call["request"]["parts"] == [] and call["became_error"] is True


def test_a_dropped_reward_fails_the_gate(tmp_path: Path, run_a: Path) -> None:
    rewards = {"0-0": 1.0, "0-1": 1.0, "1-0": 0.5, "1-1": 1.0}
    rows_a = write_rows(tmp_path / "a.jsonl", run_a, rewards)
    run_b = write_run(tmp_path / "b", agent_run())
    rows_b = write_rows(tmp_path / "b.jsonl", run_b, {**rewards, "1-0": 0.0})
    code, payload = diff_json(rows_a, rows_b, "--assert-no-regressions")
    assert code == 1 and codes(payload) == ["reward_dropped"]
    (rollout,) = payload["rollouts"]
    assert rollout["key"] == "1-0" and rollout["reward"] == {"before": 0.5, "after": 0.0}
    assert payload["a"]["kind"] == "rows" and payload["payloads"] is True
    assert payload["summary"]["calls"]["unchanged"] == 7
    assert diff_json(rows_a, rows_a, "--assert-no-regressions")[0] == 0


def test_token_growth_above_the_threshold_fails_the_gate(tmp_path: Path, run_a: Path) -> None:
    rollouts = agent_run()
    basic = fixture("chat/text-basic-gpt4o")
    body = json.loads(basic.body_text)
    body["usage"]["completion_tokens"] = 500
    rollouts["1-1"] = [line_for(basic, rollout_id="1-1", body=json.dumps(body).encode(), latency_ms=100.0)]
    run_b = write_run(tmp_path / "b", rollouts)
    code, payload = diff_json(run_a, run_b, "--assert-no-regressions", "--max-token-increase", "10%")
    assert code == 1 and codes(payload) == ["token_increase"]
    (call,) = payload["rollouts"][0]["calls"]
    assert call["tokens"]["out"] == {"before": 2, "after": 500, "delta": 498}
    assert run_diff(run_a, run_b, "--assert-no-regressions", "--max-token-increase", "1000%").exit_code == 0


def test_latency_p95_growth_above_the_threshold_fails_the_gate(tmp_path: Path, run_a: Path) -> None:
    run_b = write_run(tmp_path / "b", agent_run(latency_ms=130.0))
    code, payload = diff_json(run_a, run_b, "--assert-no-regressions", "--max-latency-p95-increase", "20%")
    assert code == 1 and codes(payload) == ["latency_p95_increase"]
    assert payload["summary"]["latency_p95_ms"] == {"before": 100.0, "after": 130.0, "change": 0.3}
    # Latency never makes a call changed.
    assert payload["summary"]["calls"]["unchanged"] == 7
    assert run_diff(run_a, run_b, "--assert-no-regressions", "--max-latency-p95-increase", "0.5").exit_code == 0


def test_every_reason_is_listed_when_several_regressions_meet(tmp_path: Path, run_a: Path) -> None:
    rollouts = agent_run(latency_ms=300.0)
    del rollouts["0-1"][1]
    rollouts["1-1"].append(line_for(fixture("chat/refusal-gpt4o"), rollout_id="1-1"))
    run_b = write_run(tmp_path / "b", rollouts)
    code, payload = diff_json(run_a, run_b, "--assert-no-regressions", "--max-latency-p95-increase", "20%")
    assert code == 1
    assert sorted(codes(payload)) == ["call_added", "call_removed", "latency_p95_increase"]
    text = run_diff(run_a, run_b, "--assert-no-regressions", "--max-latency-p95-increase", "20%")
    assert text.exit_code == 1
    for code_name in ("call_added", "call_removed", "latency_p95_increase"):
        assert code_name in text.output


def test_a_changed_answer_shows_its_text_diff_and_is_not_a_regression(tmp_path: Path, run_a: Path) -> None:
    rollouts = agent_run()
    basic = fixture("chat/text-basic-gpt4o")
    rollouts["1-1"] = [line_for(basic, rollout_id="1-1", body=answer_with(basic, "Olá!"), latency_ms=100.0)]
    run_b = write_run(tmp_path / "b", rollouts)
    code, payload = diff_json(run_a, run_b, "--assert-no-regressions")
    assert code == 0
    (call,) = payload["rollouts"][0]["calls"]
    assert (
        call["status"] == "changed" and "-Oi!" in call["response_text_diff"] and "+Olá!" in call["response_text_diff"]
    )
    text = run_diff(run_a, run_b)
    assert text.exit_code == 0 and "+Olá!" in text.output


def test_a_changed_prompt_names_the_message_and_pointer(tmp_path: Path, run_a: Path) -> None:
    rollouts = agent_run()
    basic = fixture("chat/text-basic-gpt4o")
    request = copy.deepcopy(basic.request_json)
    request["messages"][1]["content"] = "Say hi in Spanish"
    request["temperature"] = 0
    rollouts["1-1"] = [line_for(basic, rollout_id="1-1", request=request, latency_ms=100.0)]
    run_b = write_run(tmp_path / "b", rollouts)
    _, payload = diff_json(run_a, run_b)
    (call,) = payload["rollouts"][0]["calls"]
    assert call["request"]["parts"] == ["conversation", "sampling"]
    by_pointer = {d["pointer"]: d for d in call["request"]["differences"]}
    assert by_pointer["/request/messages/1/content"]["message_index"] == 1
    assert by_pointer["/request/temperature"] == {
        "pointer": "/request/temperature",
        "before": None,
        "after": "0",
        "part": "sampling",
        "field": "temperature",
        "message_index": None,
    }


def test_the_json_output_schema_is_pinned(tmp_path: Path, run_a: Path) -> None:
    rollouts = agent_run()
    rollouts["1-1"] = []
    del rollouts["1-1"]
    run_b = write_run(tmp_path / "b", rollouts)
    _, payload = diff_json(run_a, run_b, "--assert-no-regressions")
    assert payload["schema"] == DIFF_SCHEMA == "llmtap.diff/1"
    assert sorted(payload) == ["a", "b", "gate", "notes", "payloads", "rollouts", "schema", "summary"]
    assert sorted(payload["a"]) == ["kind", "path", "rollouts"]
    assert sorted(payload["summary"]) == [
        "a", "b", "calls", "latency_p50_ms", "latency_p95_ms", "rollouts", "tokens_in", "tokens_out", "ttft_p95_ms"
    ]  # fmt: skip
    assert sorted(payload["summary"]["a"]) == [
        "calls", "errors", "incomplete_rollouts", "latency_ms", "reward_mean", "rollouts", "tokens", "tokens_unknown",
        "ttft_ms", "unreadable_lines",
    ]  # fmt: skip
    (rollout,) = payload["rollouts"]
    assert sorted(rollout) == [
        "call_count", "calls", "counts", "file_a", "file_b", "key", "reward", "rollout_a", "rollout_b", "status",
        "tool_sequence",
    ]  # fmt: skip
    assert rollout["status"] == "removed" and rollout["rollout_b"] is None
    assert sorted(rollout["calls"][0]) == [
        "call_index", "endpoint", "error_category", "finish_reason", "latency_ms", "line", "model", "status",
        "tokens_in", "tokens_out", "tool_calls",
    ]  # fmt: skip
    assert sorted(payload["gate"]["reasons"][0]) == ["call_index", "code", "file", "line", "message", "rollout"]


def test_the_changed_call_detail_schema_is_pinned(tmp_path: Path, run_a: Path) -> None:
    rollouts = agent_run()
    basic = fixture("chat/text-basic-gpt4o")
    rollouts["1-1"] = [line_for(basic, rollout_id="1-1", body=answer_with(basic, "Olá!"), latency_ms=90.0)]
    _, payload = diff_json(run_a, write_run(tmp_path / "b", rollouts))
    (call,) = payload["rollouts"][0]["calls"]
    assert sorted(call) == [
        "a_call_index", "b_call_index", "b_line", "became_error", "endpoint", "error", "finish_reason", "latency_ms",
        "model", "request", "response_text_diff", "status", "tokens", "tool_calls", "ttft_ms",
    ]  # fmt: skip
    assert call["latency_ms"] == {"before": 100.0, "after": 90.0, "delta": -10.0}
    assert call["model"] == {"before": "gpt-4o-2024-08-06", "after": "gpt-4o-2024-08-06"}
    assert call["b_line"] == 1


def test_github_annotations_point_at_the_capture_file_line(tmp_path: Path, run_a: Path) -> None:
    rollouts = agent_run()
    rollouts["1-1"].append(line_for(fixture("chat/refusal-gpt4o"), rollout_id="1-1"))
    run_b = write_run(tmp_path / "b", rollouts)
    result = run_diff(run_a, run_b, "--assert-no-regressions", "--format", "github")
    assert result.exit_code == 1
    lines = result.output.splitlines()
    error = next(line for line in lines if line.startswith("::error"))
    expected_file = (run_b / "1-1.capture.jsonl").resolve()
    assert error.startswith(f"::error file={expected_file},line=2,title=llmtap diff%3A call_added::")
    assert lines[-1].startswith("::notice title=llmtap diff::calls 7 unchanged")


def test_capsules_compare_like_capture_directories(tmp_path: Path) -> None:
    a = write_capsule(tmp_path / "01ARZ3NDEKTSV4RRFFQ69G5FAV", agent_run())
    b = write_capsule(tmp_path / "01ARZ3NDEKTSV4RRFFQ69G5FAW", agent_run())
    code, payload = diff_json(a, b, "--assert-no-regressions")
    assert code == 0 and payload["a"]["kind"] == "capsule" and payload["summary"]["calls"]["unchanged"] == 7


def test_runs_with_no_rollout_in_common_are_not_comparable(tmp_path: Path, run_a: Path) -> None:
    run_b = write_run(tmp_path / "b", {"other": agent_run()["1-1"]})
    result = CliRunner().invoke(main, ["diff", str(run_a), str(run_b)])
    assert result.exit_code == 2 and "share no rollout id" in result.output


def test_a_missing_input_is_not_comparable(tmp_path: Path, run_a: Path) -> None:
    result = CliRunner().invoke(main, ["diff", str(run_a), str(tmp_path / "nope"), "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2 and "neither a path nor a run" in result.output


def test_key_on_a_directory_is_refused(tmp_path: Path, run_a: Path) -> None:
    result = CliRunner().invoke(main, ["diff", str(run_a), str(run_a), "--key", "task"])
    assert result.exit_code == 2 and "--key aligns collect/attach rows only" in result.output


def test_rows_align_by_a_declared_key_and_refuse_duplicates(tmp_path: Path, run_a: Path) -> None:
    rewards = {"0-0": 1.0, "0-1": 1.0, "1-0": 1.0, "1-1": 1.0}
    tasks = {rollout_id: {"task": f"t{n}"} for n, rollout_id in enumerate(rewards)}
    rows_a = write_rows(tmp_path / "a.jsonl", run_a, rewards, extra=tasks)
    rows_b = write_rows(tmp_path / "b.jsonl", run_a, rewards, extra=tasks)
    code, payload = diff_json(rows_a, rows_b, "--key", "task", "--assert-no-regressions")
    assert code == 0 and payload["summary"]["rollouts"]["unchanged"] == 4
    same_task = {rollout_id: {"task": "t"} for rollout_id in rewards}
    rows_dup = write_rows(tmp_path / "dup.jsonl", run_a, rewards, extra=same_task)
    result = CliRunner().invoke(main, ["diff", str(rows_a), str(rows_dup), "--key", "task"])
    assert result.exit_code == 2 and "share the key" in result.output
    result = CliRunner().invoke(main, ["diff", str(rows_a), str(rows_b), "--key", "missing"])
    assert result.exit_code == 2 and "has no 'missing'" in result.output


def test_rows_without_an_attachment_are_not_comparable(tmp_path: Path, run_a: Path) -> None:
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"_ng_rollout_id": "0-0", "reward": 1.0}) + "\n")
    result = CliRunner().invoke(main, ["diff", str(plain), str(plain)])
    assert result.exit_code == 2 and "ng_model_call_capture" in result.output


def test_a_linked_input_is_refused(tmp_path: Path, run_a: Path) -> None:
    link = tmp_path / "link"
    os.symlink(run_a, link)
    result = CliRunner().invoke(main, ["diff", str(run_a), str(link)])
    assert result.exit_code == 2 and "symbolic link" in result.output


def test_a_fifo_in_place_of_a_rows_file_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "rows.jsonl"
    os.mkfifo(fifo)
    result = CliRunner().invoke(main, ["diff", str(fifo), str(fifo)])
    assert result.exit_code == 2 and "not a regular file" in result.output


def test_a_row_over_the_size_bound_is_refused(tmp_path: Path, run_a: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmtap.diff import sources

    rows = write_rows(tmp_path / "a.jsonl", run_a, {"0-0": 1.0})
    monkeypatch.setattr(sources, "MAX_ROW_BYTES", 100)
    result = CliRunner().invoke(main, ["diff", str(rows), str(rows)])
    assert result.exit_code == 2 and "longer than 100 bytes" in result.output


def test_thresholds_without_the_gate_are_a_usage_error(run_a: Path) -> None:
    result = CliRunner().invoke(main, ["diff", str(run_a), str(run_a), "--max-token-increase", "10%"])
    assert result.exit_code == 2 and "--assert-no-regressions" in result.output
    result = CliRunner().invoke(
        main, ["diff", str(run_a), str(run_a), "--assert-no-regressions", "--max-token-increase", "ten"]
    )
    assert result.exit_code == 2 and "is not a threshold" in result.output


def test_rows_attached_without_payloads_compare_on_normalized_fields(tmp_path: Path, run_a: Path) -> None:
    from llmtap.rollouts.attach import AttachOptions

    rewards = {"0-0": 1.0, "0-1": 1.0, "1-0": 1.0, "1-1": 1.0}
    rows_a = write_rows(tmp_path / "a.jsonl", run_a, rewards, options=AttachOptions())
    rollouts = agent_run()
    del rollouts["0-0"][1]
    rows_b = write_rows(tmp_path / "b.jsonl", write_run(tmp_path / "b", rollouts), rewards, options=AttachOptions())
    code, payload = diff_json(rows_a, rows_b, "--assert-no-regressions")
    assert payload["payloads"] is False
    assert payload["notes"] == [
        "request and response payloads are absent on one side: calls compare on normalized fields only"
    ]
    assert code == 1 and codes(payload) == ["call_removed"]
    assert payload["summary"]["calls"] == {"unchanged": 6, "changed": 0, "added": 0, "removed": 1}


def test_runs_are_found_by_id_and_latest_under_the_runs_directory(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    first = write_capsule(runs / "01ARZ3NDEKTSV4RRFFQ69G5FAV", agent_run())
    write_capsule(runs / "01ARZ3NDEKTSV4RRFFQ69G5FAW", agent_run())
    code, payload = diff_json("01ARZ3NDEKTSV4RRFFQ69G5FAV", "latest", "--runs-dir", runs, "--assert-no-regressions")
    assert code == 0
    assert payload["a"]["path"] == str(first) and payload["b"]["path"].endswith("01ARZ3NDEKTSV4RRFFQ69G5FAW")


def test_a_key_value_over_the_bound_is_refused(tmp_path: Path, run_a: Path) -> None:
    rows = write_rows(tmp_path / "a.jsonl", run_a, {"0-0": 1.0}, extra={"0-0": {"task": "x" * 600}})
    result = CliRunner().invoke(main, ["diff", str(rows), str(rows), "--key", "task"])
    assert result.exit_code == 2 and "at most 512" in result.output
