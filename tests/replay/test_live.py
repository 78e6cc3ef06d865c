"""In-process replay: the hooks answer from a real recording, misses raise, passthrough goes live, interventions replace.

Each test first records real calls (the real openai and anthropic SDKs against the replay
upstream, captured by `llmtap.capture`), then replays them with a `Replayer` set for the process
and clients pointed at a port nobody listens on: an answer can only come from the recording.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

import llmtap
from llmtap.errors import LlmtapError
from llmtap.replay.intervention import MAX_OVERRIDE_BYTES, InterventionError, load_override
from llmtap.replay.live import Replayer, ReplayMissError, set_replayer
from llmtap.replay.matching import RecordingIndex
from llmtap.replay.report import mocked_report, read_events
from tests.fixtures import fixture

CHAT = fixture("chat/text-basic-gpt4o")
STREAM = fixture("chat/text-stream-include-usage-gpt4")
MESSAGES = fixture("messages/text-basic-sonnet4")
NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing answers there


def _lines(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (directory / "default.capture.jsonl").read_text().splitlines()]


@pytest.fixture
def recording(replay_upstream: Any, tmp_path: Path) -> Path:
    """A capture directory holding a chat call, a chat stream and a Messages call, recorded for real."""
    directory = tmp_path / "recording"
    with llmtap.capture(capture_dir=directory, durability="call"):
        with openai.OpenAI(base_url=replay_upstream.base_url + "/v1", api_key="sk-test", max_retries=0) as client:
            client.chat.completions.create(**CHAT.request_json)
            for _ in client.chat.completions.create(**STREAM.request_json):
                pass
        with anthropic.Anthropic(base_url=replay_upstream.base_url, api_key="sk-ant-test", max_retries=0) as client:
            client.messages.create(**MESSAGES.request_json)
    assert replay_upstream.request_count == 3
    replay_upstream.reset()
    return directory


@pytest.fixture
def replaying(tmp_path: Path) -> Iterator[Any]:
    """Start a replayer for this process (and remove it afterwards)."""

    def start(source: Path, **options: Any) -> Replayer:
        replayer = Replayer(RecordingIndex.from_path(source), events_path=tmp_path / "events.jsonl", **options)
        set_replayer(replayer)
        return replayer

    yield start
    set_replayer(None)


def test_the_recording_answers_every_call_and_the_replayed_run_is_captured_the_same(
    recording: Path, replaying: Any, tmp_path: Path
) -> None:
    replayer = replaying(recording)
    new = tmp_path / "replayed"
    with llmtap.capture(capture_dir=new, durability="call"):
        with openai.OpenAI(base_url=NOWHERE + "/v1", api_key="sk-test", max_retries=0) as client:
            answer = client.chat.completions.create(**CHAT.request_json)
            text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**STREAM.request_json) if c.choices)
        with anthropic.Anthropic(base_url=NOWHERE, api_key="sk-ant-test", max_retries=0) as client:
            message = client.messages.create(**MESSAGES.request_json)
    assert answer.id == json.loads(CHAT.body_text)["id"]
    assert text == '"This is a test."'
    assert message.id == json.loads(MESSAGES.body_text)["id"]
    assert replayer.served == 3 and replayer.misses == []
    before, after = _lines(recording), _lines(new)
    assert [line.get("response_raw") or line["response"] for line in after] == [
        line.get("response_raw") or line["response"] for line in before
    ]
    assert after[1]["response_raw"] == STREAM.body_text  # the stream, byte for byte as the provider sent it
    events = read_events(tmp_path / "events.jsonl")
    report = mocked_report("mocked", recording, replayer.index, events, 0)
    assert report["ok"] is True and report["served"] == 3 and report["unserved"] == []


def test_a_changed_prompt_raises_the_miss_through_the_sdk_unwrapped_and_unretried(
    recording: Path, replaying: Any, tmp_path: Path
) -> None:
    replaying(recording)
    body = json.loads(json.dumps(CHAT.request_json))
    body["messages"][-1]["content"] = "something else entirely"
    with (
        llmtap.capture(capture_dir=tmp_path / "replayed", durability="call"),
        openai.OpenAI(base_url=NOWHERE + "/v1", api_key="sk-test", max_retries=2) as client,
        pytest.raises(ReplayMissError) as raised,
    ):
        client.chat.completions.create(**body)
    assert isinstance(raised.value, LlmtapError)
    message = str(raised.value)
    assert "/request/messages/" in message and "something else entirely" in message
    assert "Closest recorded call: rollout 'default' call 0" in message
    misses = [event for event in read_events(tmp_path / "events.jsonl") if event["event"] == "miss"]
    assert len(misses) == 1  # openai does not retry it: asked once
    assert misses[0]["differences"][0]["pointer"].startswith("/request/messages/")
    [line] = _lines(tmp_path / "replayed")
    assert line["exception_type"] == "ReplayMissError" and line["status_code"] is None


def test_passthrough_sends_a_miss_to_the_real_endpoint_and_records_it(
    recording: Path, replaying: Any, replay_upstream: Any, tmp_path: Path
) -> None:
    replaying(recording, on_miss="passthrough")
    with (
        llmtap.capture(capture_dir=tmp_path / "replayed", durability="call"),
        httpx.Client(base_url=replay_upstream.base_url) as client,
    ):
        client.post("/v1/chat/completions", json=CHAT.request_json)  # in the recording: answered from it
        live = client.post("/v1/chat/completions", json=fixture("chat/tool-call-gpt4o").request_json)
    assert live.status_code == 200
    assert replay_upstream.request_count == 1  # only the miss went out
    events = [event["event"] for event in read_events(tmp_path / "events.jsonl")]
    assert events == ["served", "miss", "passthrough"]
    assert len(_lines(tmp_path / "replayed")) == 2


def test_an_intervention_answers_one_recorded_call_with_the_replacement(
    recording: Path, replaying: Any, tmp_path: Path
) -> None:
    replacement = json.loads(CHAT.body_text)
    replacement["choices"][0]["message"]["content"] = "What if the model had said this?"
    override_file = tmp_path / "override.json"
    override_file.write_text(json.dumps({"rollout_id": "default", "call_index": 0, "response": replacement}))
    replaying(recording, override=load_override(override_file))
    with (
        llmtap.capture(capture_dir=tmp_path / "replayed", durability="call"),
        openai.OpenAI(base_url=NOWHERE + "/v1", api_key="sk-test", max_retries=0) as client,
    ):
        answer = client.chat.completions.create(**CHAT.request_json)
    assert answer.choices[0].message.content == "What if the model had said this?"
    [served] = [event for event in read_events(tmp_path / "events.jsonl") if event["event"] == "served"]
    assert served["replaced"] is True and served["call_index"] == 0


def test_an_intervention_file_is_checked_before_use(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"rollout_id": "r1", "call_index": 2, "response_raw": "data: x\n\n", "status_code": 200}))
    assert load_override(good) == ("r1", 2, {"response_raw": "data: x\n\n", "response": None, "status_code": 200})
    link = tmp_path / "link.json"
    os.symlink(good, link)
    with pytest.raises(InterventionError, match="link"):
        load_override(link)
    large = tmp_path / "large.json"
    large.write_bytes(b" " * (MAX_OVERRIDE_BYTES + 1))
    with pytest.raises(InterventionError, match="bytes is over"):
        load_override(large)
    for text in ("not json", "[1]", '{"call_index": "3", "response": {}}', '{"call_index": 1}'):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(InterventionError):
            load_override(bad)


def test_a_tool_result_intervention_file_is_read_and_checked(tmp_path: Path) -> None:
    from llmtap.replay.intervention import ToolResultOverride

    path = tmp_path / "tool.json"
    path.write_text(json.dumps({"tool": "search", "text": "no results", "is_error": True}))
    assert load_override(path) == ToolResultOverride(
        "search", 0, {"content": [{"type": "text", "text": "no results"}], "structuredContent": {"result": "no results"}, "isError": True}
    )
    given = {"content": [{"type": "image", "data": "AA==", "mimeType": "image/png"}], "isError": False}
    path.write_text(json.dumps({"tool": "draw", "occurrence": 2, "result": given}))
    assert load_override(path) == ToolResultOverride("draw", 2, given)
    for bad in (
        {"tool": "", "text": "x"},
        {"tool": "search", "occurrence": -1, "text": "x"},
        {"tool": "search", "occurrence": True, "text": "x"},
        {"tool": "search"},
        {"tool": "search", "result": {"content": "text"}},
        {"tool": "search", "result": {"content": [{"text": "no type"}]}},
    ):
        path.write_text(json.dumps(bad))
        with pytest.raises(InterventionError):
            load_override(path)


def test_the_replayer_replaces_only_the_named_occurrence_of_the_named_tool(recording: Path, tmp_path: Path) -> None:
    from llmtap.replay.intervention import ToolResultOverride

    result = {"content": [{"type": "text", "text": "X"}], "isError": False}
    replayer = Replayer(RecordingIndex.from_path(recording), override=ToolResultOverride("search", 1, result), events_path=tmp_path / "e.jsonl")
    assert replayer.override is None
    assert [replayer.tool_result(name) for name in ("search", "other", "search", "search")] == [None, None, result, None]
    assert [event for event in read_events(tmp_path / "e.jsonl") if event["event"] == "tool_result_replaced"][0]["occurrence"] == 1
