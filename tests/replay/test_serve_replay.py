"""`llmtap serve --replay`: the proxy answers from a recording per /ng-rollout/ id, and a miss is a clear 404 error.

Calls are first recorded through the real proxy in front of the replay upstream, under two
rollouts; then a replaying proxy (the same app with `ReplayTransport` as its upstream seam)
answers them with no upstream at all.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from llmtap.replay.serve import build_replay_app
from llmtap.server.config import load_serve_config
from tests.e2e.serve_harness import serving
from tests.fixtures import fixture
from tests.support.servers import ServerThread

CHAT = fixture("chat/text-basic-gpt4o")
STREAM = fixture("chat/text-stream-include-usage-gpt4")


@pytest.fixture
def recording(replay_upstream: Any, tmp_path: Path) -> Path:
    directory = tmp_path / "calls"
    with serving(replay_upstream.base_url, directory) as (server, _health), httpx.Client(base_url=server.base_url) as client:
        assert client.post("/ng-rollout/r1/v1/chat/completions", json=CHAT.request_json).status_code == 200
        assert client.post("/ng-rollout/r2/v1/chat/completions", json=STREAM.request_json).status_code == 200
    replay_upstream.reset()
    return directory


@pytest.fixture
def replaying(recording: Path) -> Iterator[str]:
    config = load_serve_config(settings={"upstreams": {"default": {"base_url": "http://127.0.0.1:9"}}})
    with ServerThread(build_replay_app(config, recording), lifespan="on").start() as server:
        yield server.base_url


def test_each_rollout_is_answered_from_its_recording_byte_for_byte(replaying: str, replay_upstream: Any) -> None:
    with openai.OpenAI(base_url=replaying + "/ng-rollout/r1/v1", api_key="unused", max_retries=0) as client:
        assert client.chat.completions.create(**CHAT.request_json).id == json.loads(CHAT.body_text)["id"]
    with (
        httpx.Client(base_url=replaying) as client,
        client.stream("POST", "/ng-rollout/r2/v1/chat/completions", json=STREAM.request_json) as response,
    ):
        body = b"".join(response.iter_raw())
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    assert body == STREAM.body_text.encode()
    assert replay_upstream.request_count == 0


def test_a_request_of_another_rollout_is_a_miss_answered_as_a_clear_error(replaying: str) -> None:
    with (
        openai.OpenAI(base_url=replaying + "/ng-rollout/r1/v1", api_key="unused", max_retries=2) as client,
        pytest.raises(openai.NotFoundError) as raised,
    ):
        client.chat.completions.create(**STREAM.request_json)
    error = raised.value
    assert error.response.headers["x-should-retry"] == "false"
    body = error.response.json()["error"]
    assert body["type"] == "replay_miss"
    assert "Closest recorded call: rollout 'r1' call 0" in body["message"]
    assert {difference["pointer"] for difference in body["miss"]["differences"]} >= {"/request/stream"}
    with httpx.Client(base_url=replaying) as client:
        unknown = client.post("/ng-rollout/r9/v1/chat/completions", json=CHAT.request_json)
    assert unknown.status_code == 404 and unknown.json()["error"]["miss"]["reason"] == "unknown_rollout"


def test_the_serve_command_replays_without_an_upstream(recording: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "llmtap", "serve", "--replay", str(recording), "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        answer = None
        for _ in range(200):
            try:
                answer = httpx.post(f"http://127.0.0.1:{port}/ng-rollout/r1/v1/chat/completions", json=CHAT.request_json)
                break
            except httpx.ConnectError:
                time.sleep(0.05)
        assert answer is not None and answer.status_code == 200
        assert answer.json() == json.loads(CHAT.body_text)
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=30)
    assert "replaying:" in stderr and "nothing is sent upstream" in stderr
