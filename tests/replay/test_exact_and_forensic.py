"""Exact replay re-sends deterministic recorded requests and says per call whether the answer reproduced; forensic lists calls."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

import llmtap
from llmtap.errors import ConfigError
from llmtap.replay.exact import exact_run
from llmtap.replay.modes import forensic_report
from tests.fixtures import fixture

SEEDED = fixture("chat/logprobs-stream-gpt54")  # a recorded request with a seed: eligible
UNSEEDED = fixture("chat/text-basic-gpt4o")  # default temperature, no seed: not eligible


@pytest.fixture
def recording(replay_upstream: Any, tmp_path: Path) -> Path:
    directory = tmp_path / "recording"
    with llmtap.capture(capture_dir=directory, durability="call"), httpx.Client(base_url=replay_upstream.base_url) as client:
        client.post("/v1/chat/completions", json=SEEDED.request_json).read()
        client.post("/v1/chat/completions", json=UNSEEDED.request_json).read()
    replay_upstream.reset()
    return directory


def test_a_deterministic_call_that_comes_back_the_same_is_reproduced(recording: Path, replay_upstream: Any) -> None:
    report = exact_run(recording, replay_upstream.base_url)
    seeded, unseeded = report["calls"]
    assert seeded["eligible"] is True and seeded["reproduced"] is True and seeded["differences"] == []
    assert unseeded["eligible"] is False and unseeded["reproduced"] is None
    assert "neither temperature 0 nor a seed" in unseeded["not_checked"]
    assert report["checked"] == 1 and report["ok"] is False  # one call could not be checked: no overall pass
    assert replay_upstream.request_count == 1  # the ineligible call was not sent


def test_a_different_answer_is_reported_with_what_differs(recording: Path, replay_upstream: Any) -> None:
    path = recording / "default.capture.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines[0]["response"]["choices"][0]["message"]["content"] = "an answer the model never gave"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    seeded = exact_run(recording, replay_upstream.base_url)["calls"][0]
    assert seeded["reproduced"] is False
    assert [difference["pointer"] for difference in seeded["differences"]] == ["/text"]


def test_without_an_endpoint_nothing_is_sent_and_nothing_is_claimed(recording: Path, replay_upstream: Any) -> None:
    report = exact_run(recording, None)
    assert all(call["reproduced"] is None for call in report["calls"]) and report["ok"] is False
    assert replay_upstream.request_count == 0
    with pytest.raises(ConfigError, match="--endpoint"):
        exact_run(recording, None, api_key_env="OPENAI_API_KEY")


def test_forensic_lists_the_calls_in_order_without_sending_anything(recording: Path, replay_upstream: Any) -> None:
    report = forensic_report(recording)
    assert [call["call_index"] for call in report["calls"]] == [0, 1]
    assert report["calls"][1]["answer_excerpt"] == "Oi!" and report["calls"][1]["status_code"] == 200
    assert replay_upstream.request_count == 0


def _run_cli(args: list[str]) -> Any:
    from click.testing import CliRunner

    from llmtap.cli import main

    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_an_exact_replay_writes_a_capsule_with_its_report_and_the_live_answers_diffable_with_the_recording(
    recording: Path, replay_upstream: Any, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    result = _run_cli(["replay", str(recording), "--mode", "exact", "--endpoint", replay_upstream.base_url,
                       "--capsule-dir", str(runs), "--json"])
    assert result.exit_code == 1  # one call could not be checked (no seed): never a pass
    report = json.loads(result.output)
    [capsule] = list(runs.iterdir())
    assert report["capsule"] == str(capsule)
    manifest = json.loads((capsule / "capsule.json").read_text())
    assert manifest["replay_of"] == str(recording.resolve()) and manifest["replay_mode"] == "exact"
    assert manifest["capture_mode"] == "replay-exact" and manifest["counts"]["model_calls"] == 1
    written = json.loads((capsule / "replay-report.json").read_text())
    assert written["mode"] == "exact" and written["reproduced"] == 1 and written["capsule"] == str(capsule)
    [line] = [json.loads(text) for text in (capsule / "calls" / "default.capture.jsonl").read_text().splitlines()]
    assert line["replayed_call"] == {"rollout_id": "default", "call_index": 0}
    assert line["response"] == json.loads(SEEDED.body_text) if not SEEDED.is_stream else line["stream"] is True
    # The recording and today's answers compare like any two runs: the re-run call pairs with its recording.
    diffed = _run_cli(["diff", str(recording), str(capsule), "--json"])
    [rollout] = json.loads(diffed.output)["rollouts"]
    assert rollout["counts"] == {"unchanged": 1, "changed": 0, "added": 0, "removed": 1}
    assert [(call["status"], call["call_index"]) for call in rollout["calls"]] == [("removed", 1)]  # the unseeded one


def test_a_forensic_replay_writes_its_report_into_a_new_capsule_and_runs_nothing(
    recording: Path, replay_upstream: Any, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    result = _run_cli(["replay", str(recording), "--mode", "forensic", "--capsule-dir", str(runs), "--json"])
    assert result.exit_code == 0, result.output
    [capsule] = list(runs.iterdir())
    written = json.loads((capsule / "replay-report.json").read_text())
    assert written["mode"] == "forensic" and [call["call_index"] for call in written["calls"]] == [0, 1]
    manifest = json.loads((capsule / "capsule.json").read_text())
    assert manifest["status"] == "success" and manifest["replay_mode"] == "forensic"
    assert manifest["counts"]["model_calls"] == 0 and replay_upstream.request_count == 0


def test_an_exact_replay_whose_key_is_missing_makes_no_capsule(recording: Path, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.delenv("LLMTAP_TEST_NO_SUCH_KEY", raising=False)
    runs = tmp_path / "runs"
    result = _run_cli(["replay", str(recording), "--mode", "exact", "--endpoint", "http://127.0.0.1:9",
                          "--api-key-env", "LLMTAP_TEST_NO_SUCH_KEY", "--capsule-dir", str(runs)])
    assert result.exit_code == 2 and "LLMTAP_TEST_NO_SUCH_KEY" in result.output
    assert not runs.exists() or list(runs.iterdir()) == []


def test_an_exact_replays_capsule_never_holds_the_api_key_it_sent(
    recording: Path, replay_upstream: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    key = "sk-exact-replay-key-never-written-0123456789"
    monkeypatch.setenv("LLMTAP_TEST_EXACT_KEY", key)
    runs = tmp_path / "runs"
    result = _run_cli(["replay", str(recording), "--mode", "exact", "--endpoint", replay_upstream.base_url,
                       "--api-key-env", "LLMTAP_TEST_EXACT_KEY", "--capsule-dir", str(runs), "--json"])
    assert result.exit_code == 1 and json.loads(result.output)["reproduced"] == 1
    assert replay_upstream.received[0].headers["authorization"] == f"Bearer {key}"  # sent to the endpoint named
    [capsule] = list(runs.iterdir())
    for path in capsule.rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path
