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
