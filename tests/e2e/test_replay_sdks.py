"""`llmtap replay` over a program using the real openai and anthropic SDKs (sync, async, streams), httpx, requests and aiohttp.

The program is recorded under `llmtap run` against the replay upstream; the upstream is then
stopped and the program replayed from its capsule: its output must be identical, every response
body the same bytes (streams compared whole; JSON bodies, which the line keeps parsed, by the
CRC-32 both captures took of the bytes the client received), and the network guard must have refused nothing (no connection was attempted). A program whose
prompt changed fails with the miss error naming the field.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.fixtures import fixture
from tests.support.replay import ReplayUpstream

FIXTURES = {
    "CHAT": "chat/text-basic-gpt4o",
    "CHAT_STREAM": "chat/text-stream-include-usage-gpt4",
    "MESSAGES": "messages/text-basic-sonnet4",
    "MESSAGES_STREAM": "messages/tool-use-stream-sonnet4",
    "RESPONSES": "responses/text-basic-gpt55",
}

WORKLOAD = '''
import asyncio, json, os, sys
import aiohttp, anthropic, httpx, openai, requests

BASE = os.environ["REPLAY_BASE"]
REQ = json.loads(os.environ["REPLAY_REQUESTS"])
if os.environ.get("CHANGE_PROMPT"):
    REQ["CHAT"]["messages"][-1]["content"] = "a different question"
out = []

with openai.OpenAI(base_url=BASE + "/v1", api_key="sk-test", max_retries=0) as client:
    out.append(client.chat.completions.create(**REQ["CHAT"]).choices[0].message.content)
    out.append("".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**REQ["CHAT_STREAM"]) if c.choices))
    raw = client.chat.completions.with_raw_response.create(**REQ["CHAT"])
    out.append([raw.status_code, raw.headers.get("content-type"), raw.parse().id])

with anthropic.Anthropic(base_url=BASE, api_key="sk-ant-test", max_retries=0) as client:
    out.append(client.messages.create(**REQ["MESSAGES"]).content[0].text)
    arguments = {k: v for k, v in REQ["MESSAGES_STREAM"].items() if k != "stream"}
    with client.messages.stream(**arguments) as stream:
        out.append([block.type for block in stream.get_final_message().content])

async def async_calls():
    async with openai.AsyncOpenAI(base_url=BASE + "/v1", api_key="sk-test", max_retries=0) as client:
        out.append((await client.chat.completions.create(**REQ["CHAT"])).usage.prompt_tokens)
        stream = await client.chat.completions.create(**REQ["CHAT_STREAM"])
        out.append("".join([c.choices[0].delta.content or "" async for c in stream if c.choices]))
    async with anthropic.AsyncAnthropic(base_url=BASE, api_key="sk-ant-test", max_retries=0) as client:
        out.append((await client.messages.create(**REQ["MESSAGES"])).usage.output_tokens)
    async with aiohttp.ClientSession() as session:
        async with session.post(BASE + "/v1/responses", json=REQ["RESPONSES"]) as response:
            out.append([response.status, (await response.json())["status"]])
        async with session.post(BASE + "/v1/chat/completions", json=REQ["CHAT_STREAM"]) as response:
            out.append(sum([1 async for line in response.content if line.startswith(b"data:")]))

asyncio.run(async_calls())
out.append(requests.post(BASE + "/v1/chat/completions", json=REQ["CHAT"]).json()["id"])
with requests.post(BASE + "/v1/chat/completions", json=REQ["CHAT_STREAM"], stream=True) as response:
    out.append(sum(1 for line in response.iter_lines() if line.startswith(b"data:")))
with httpx.Client() as client:
    out.append(client.post(BASE + "/v1/messages", json=REQ["MESSAGES"]).json()["id"])
    out.append(client.post(BASE + "/v1/responses", json=REQ["RESPONSES"]).json()["status"])
print(json.dumps(out))
'''
EXPECTED_CALLS = 14


def _llmtap(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "llmtap", *args]
    return subprocess.run(command, check=False, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def _capsules(directory: Path) -> list[Path]:
    return sorted(path for path in directory.iterdir() if (path / "capsule.json").exists())


def _lines(capsule: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (capsule / "calls" / "default.capture.jsonl").read_text().splitlines()]


def _body(line: dict[str, Any]) -> Any:
    return line.get("response_raw") if line.get("stream") else line.get("response")


def _record(tmp_path: Path) -> tuple[Path, str, dict[str, str]]:
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    with ReplayUpstream().start() as upstream:
        env = dict(
            os.environ,
            REPLAY_BASE=upstream.base_url,
            REPLAY_REQUESTS=json.dumps({key: fixture(name).request_json for key, name in FIXTURES.items()}),
        )
        recorded = _llmtap(["run", "--capsule-dir", str(tmp_path / "recorded"), "--", sys.executable, str(script)], env, tmp_path)
        assert recorded.returncode == 0, recorded.stderr
        assert upstream.request_count == EXPECTED_CALLS
    [capsule] = _capsules(tmp_path / "recorded")
    return capsule, recorded.stdout, env


def test_a_replayed_program_gets_every_response_from_the_recording_with_the_upstream_stopped(tmp_path: Path) -> None:
    capsule, output, env = _record(tmp_path)
    replayed = _llmtap(
        ["replay", str(capsule), "--capsule-dir", str(tmp_path / "replayed"), "--json", "--", sys.executable, str(tmp_path / "workload.py")],
        env,
        tmp_path,
    )
    assert replayed.returncode == 0, replayed.stderr
    report = json.loads(replayed.stdout[replayed.stdout.index("\n{") + 1 :])
    assert replayed.stdout[: len(output)] == output
    assert report["ok"] is True and report["served"] == EXPECTED_CALLS and report["misses"] == []
    assert report["network_refused"] == [] and report["unserved"] == [] and report["reencoded"] == []
    [new] = _capsules(tmp_path / "replayed")
    manifest = json.loads((new / "capsule.json").read_text())
    assert manifest["replay_of"] == str(capsule) and manifest["replay_mode"] == "mocked"
    assert json.loads((new / "replay-report.json").read_text())["served"] == EXPECTED_CALLS
    before, after = _lines(capsule), _lines(new)
    assert len(after) == EXPECTED_CALLS
    for old, fresh in zip(before, after):
        assert fresh["status_code"] == old["status_code"]
        assert _body(fresh) == _body(old)  # streams: the same bytes; JSON: the same value, ids included
        if not old.get("stream"):  # and the same bytes: each capture checked what its client received
            assert fresh["response_body_crc32"] == old["response_body_crc32"]
        recorded_headers = {k: v for k, v in old["http"]["response_headers"].items() if k not in ("content-length", "date", "server", "transfer-encoding")}
        assert {k: fresh["http"]["response_headers"].get(k) for k in recorded_headers} == recorded_headers


def test_a_changed_prompt_fails_with_the_miss_naming_the_field(tmp_path: Path) -> None:
    capsule, _, env = _record(tmp_path)
    env = dict(env, CHANGE_PROMPT="1")
    replayed = _llmtap(
        ["replay", str(capsule), "--capsule-dir", str(tmp_path / "replayed"), "--", sys.executable, str(tmp_path / "workload.py")],
        env,
        tmp_path,
    )
    assert replayed.returncode != 0
    assert "ReplayMissError" in replayed.stderr
    assert "/request/messages/" in replayed.stderr and "a different question" in replayed.stderr
    assert "MISS" in replayed.stderr


def test_the_guard_refuses_a_connection_to_the_recorded_server_and_the_replay_fails(tmp_path: Path) -> None:
    capsule, _, env = _record(tmp_path)
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text(  # importing httpx starts the replay's hooks and guard; then a raw socket to the recorded server
        "import httpx, os, socket\nfrom urllib.parse import urlsplit\nparts = urlsplit(os.environ['REPLAY_BASE'])\n"
        "try:\n    socket.create_connection((parts.hostname, parts.port), timeout=2)\n"
        "except ConnectionRefusedError as exc:\n    print(type(exc).__name__)\n"
    )
    replayed = _llmtap(
        ["replay", str(capsule), "--capsule-dir", str(tmp_path / "replayed"), "--json", "--", sys.executable, str(sneaky)],
        env,
        tmp_path,
    )
    assert replayed.returncode == 1
    assert replayed.stdout.startswith("ReplayNetworkBlocked")
    report = json.loads(replayed.stdout[replayed.stdout.index("\n{") + 1 :])
    assert report["ok"] is False and len(report["network_refused"]) == 1
    assert len(report["unserved"]) == EXPECTED_CALLS


def test_forensic_lists_the_recorded_calls_without_running_anything(tmp_path: Path) -> None:
    capsule, _, env = _record(tmp_path)
    shown = _llmtap(["replay", str(capsule), "--mode", "forensic", "--json"], env, tmp_path)
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["mode"] == "forensic" and report["recorded_calls"] == EXPECTED_CALLS
    assert [call["call_index"] for call in report["calls"]] == list(range(EXPECTED_CALLS))
    assert report["calls"][0]["answer_excerpt"] == "Oi!" and all(call["reproduced"] is None for call in report["calls"])
    exact = _llmtap(["replay", str(capsule), "--mode", "exact", "--json"], env, tmp_path)
    assert exact.returncode == 1  # these recordings use the default temperature and no seed: not eligible
    assert all(call["eligible"] is False for call in json.loads(exact.stdout)["calls"])


def test_an_intervention_changes_one_answer_and_the_report_says_which(tmp_path: Path) -> None:
    capsule, output, env = _record(tmp_path)
    replacement = json.loads(fixture(FIXTURES["CHAT"]).body_text)
    replacement["choices"][0]["message"]["content"] = "What if?"
    override = tmp_path / "override.json"
    override.write_text(json.dumps({"rollout_id": "default", "call_index": 0, "response": replacement}))
    replayed = _llmtap(
        ["replay", str(capsule), "--replace", str(override), "--capsule-dir", str(tmp_path / "replayed"), "--json", "--",
         sys.executable, str(tmp_path / "workload.py")],
        env,
        tmp_path,
    )
    assert replayed.returncode == 0, replayed.stderr
    program = json.loads(replayed.stdout.splitlines()[0])
    assert program[0] == "What if?" and program[1:] == json.loads(output)[1:]
    report = json.loads(replayed.stdout[replayed.stdout.index("\n{") + 1 :])
    assert report["mode"] == "intervention" and report["replaced"] == [{"rollout_id": "default", "call_index": 0}]
