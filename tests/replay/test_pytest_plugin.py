"""The pytest plugin, run with pytester: record then replay, each record mode, a miss failing its test, the network blocked.

Each inner test session talks to the replay upstream over loopback with the real openai SDK;
the upstream's request log tells what went to the network and what the cassette answered.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures import fixture

pytest_plugins = ["pytester"]

CHAT = fixture("chat/text-basic-gpt4o").request_json
TOOL = fixture("chat/tool-call-gpt4o").request_json

TEST_MODULE = '''
import json, os
import openai, pytest

BASE = os.environ["REPLAY_BASE"]
CHAT = json.loads(os.environ["CHAT_REQUEST"])
TOOL = json.loads(os.environ["TOOL_REQUEST"])

@pytest.mark.llmtap
def test_chat():
    with openai.OpenAI(base_url=BASE + "/v1", api_key="sk-secret-test-key", max_retries=0) as client:
        answer = client.chat.completions.create(**CHAT)
        if os.environ.get("ALSO_TOOL"):
            client.chat.completions.create(**TOOL)
    assert answer.choices[0].message.content == "Oi!"

def test_untouched():
    assert True
'''


@pytest.fixture
def inner(pytester: pytest.Pytester, replay_upstream: Any, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("REPLAY_BASE", replay_upstream.base_url)
    monkeypatch.setenv("CHAT_REQUEST", json.dumps(CHAT))
    monkeypatch.setenv("TOOL_REQUEST", json.dumps(TOOL))
    pytester.makepyfile(test_agent=TEST_MODULE)
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """Run the inner session as a user's would: the plugin loads through its installed entry point."""
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


def test_the_plugin_is_registered_by_its_entry_point() -> None:
    """`pip install llmtap` is enough: pytest finds the plugin in the pytest11 entry points."""
    from importlib.metadata import entry_points

    assert [(point.name, point.value) for point in entry_points(group="pytest11") if point.name == "llmtap"] == [
        ("llmtap", "llmtap.replay.pytest_plugin")
    ]


def cassette(pytester: pytest.Pytester) -> Path:
    return pytester.path / "tests" / "cassettes" / "test_agent" / "test_chat"


def calls_in(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (path / "calls" / "default.capture.jsonl").read_text().splitlines()]


def test_none_without_a_cassette_fails_and_sends_nothing(inner: pytest.Pytester, replay_upstream: Any) -> None:
    result = run(inner)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*does not exist and the record mode is 'none'*"])
    assert replay_upstream.request_count == 0


def test_once_records_then_none_replays_with_the_network_blocked(inner: pytest.Pytester, replay_upstream: Any) -> None:
    run(inner, "--llmtap-record-mode=once").assert_outcomes(passed=2)
    assert replay_upstream.request_count == 1
    lines = calls_in(cassette(inner))
    assert len(lines) == 1 and lines[0]["response"]["choices"][0]["message"]["content"] == "Oi!"
    assert "sk-secret-test-key" not in (cassette(inner) / "calls" / "default.capture.jsonl").read_text()
    replay_upstream.reset()
    run(inner).assert_outcomes(passed=2)  # none (the default): answered from the cassette
    assert replay_upstream.request_count == 0
    run(inner, "--llmtap-record-mode=once").assert_outcomes(passed=2)  # once with a cassette: replays
    assert replay_upstream.request_count == 0


def test_a_miss_fails_the_test_with_the_differing_field(inner: pytest.Pytester, replay_upstream: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    run(inner, "--llmtap-record-mode=once").assert_outcomes(passed=2)
    replay_upstream.reset()
    monkeypatch.setenv("ALSO_TOOL", "1")
    result = run(inner)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*ReplayMissError*", "*Closest recorded call*", "*/request/*"])
    assert replay_upstream.request_count == 0  # the miss never reached the network


def test_the_network_to_model_apis_is_blocked_in_none(inner: pytest.Pytester, replay_upstream: Any) -> None:
    run(inner, "--llmtap-record-mode=once").assert_outcomes(passed=2)
    replay_upstream.reset()
    inner.makepyfile(
        test_raw='''
import os, socket, pytest
from urllib.parse import urlsplit
from llmtap.replay.guard import ReplayNetworkBlocked

@pytest.mark.llmtap(cassette="test_chat")
def test_raw_socket():
    parts = urlsplit(os.environ["REPLAY_BASE"])
    with pytest.raises(ReplayNetworkBlocked):
        socket.create_connection((parts.hostname, parts.port), timeout=2)
    with pytest.raises(ReplayNetworkBlocked):
        socket.getaddrinfo("api.openai.com", 443)
'''
    )
    (inner.path / "tests" / "cassettes" / "test_raw").mkdir(parents=True)
    cassette(inner).rename(inner.path / "tests" / "cassettes" / "test_raw" / "test_chat")
    run(inner, "test_raw.py").assert_outcomes(passed=1)
    assert replay_upstream.request_count == 0


def test_new_episodes_replays_what_it_has_and_records_the_rest(
    inner: pytest.Pytester, replay_upstream: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run(inner, "--llmtap-record-mode=once").assert_outcomes(passed=2)
    replay_upstream.reset()
    monkeypatch.setenv("ALSO_TOOL", "1")
    run(inner, "--llmtap-record-mode=new_episodes").assert_outcomes(passed=2)
    assert replay_upstream.request_count == 1  # only the new call went out
    assert [line["request"]["messages"] == TOOL["messages"] for line in calls_in(cassette(inner))] == [False, True]
    replay_upstream.reset()
    run(inner).assert_outcomes(passed=2)  # both now replay
    assert replay_upstream.request_count == 0


def test_all_records_every_call_and_keeps_the_old_cassette_when_the_test_fails(
    inner: pytest.Pytester, replay_upstream: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run(inner, "--llmtap-record-mode=once").assert_outcomes(passed=2)
    first = json.loads((cassette(inner) / "capsule.json").read_text())["run_id"]
    replay_upstream.reset()
    run(inner, "--llmtap-record-mode=all").assert_outcomes(passed=2)
    assert replay_upstream.request_count == 1  # live although the cassette held the call
    second = json.loads((cassette(inner) / "capsule.json").read_text())["run_id"]
    assert second != first
    monkeypatch.setenv("CHAT_REQUEST", json.dumps({**CHAT, "messages": [{"role": "user", "content": "nope"}]}))
    run(inner, "--llmtap-record-mode=all").assert_outcomes(passed=1, failed=1)  # the upstream has no answer: 404
    assert json.loads((cassette(inner) / "capsule.json").read_text())["run_id"] == second


def test_rewrite_deletes_the_cassette_first(inner: pytest.Pytester, replay_upstream: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    run(inner, "--llmtap-record-mode=once").assert_outcomes(passed=2)
    monkeypatch.setenv("CHAT_REQUEST", json.dumps({**CHAT, "messages": [{"role": "user", "content": "nope"}]}))
    run(inner, "--llmtap-record-mode=rewrite").assert_outcomes(passed=1, failed=1)
    assert not cassette(inner).exists()  # deleted, and a failing test records nothing


def test_the_plugin_leaves_tests_without_the_marker_alone(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_plain="import _socket, socket, sys\n"
        "def test_plain():\n"
        "    assert socket.socket.connect is _socket.socket.connect and socket.getaddrinfo.__module__ == 'socket'\n"
        "    assert 'llmtap.replay.live' not in sys.modules and 'llmtap.capture' not in sys.modules\n"
    )
    result = run(pytester, "--llmtap-record-mode=none")
    result.assert_outcomes(passed=1)
    assert not (pytester.path / "tests").exists()
