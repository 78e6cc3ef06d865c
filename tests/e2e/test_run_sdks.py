"""`llmtap run` over a program using the real openai and anthropic SDKs, requests, httpx and aiohttp.

The program runs twice against the replay upstream, once plainly and once under `llmtap run`:
its output and exit code must be identical, and the capsule must hold every call once, whole,
with its usage.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.fixtures import fixture

FIXTURES = {
    "CHAT": "chat/text-basic-gpt4o",
    "CHAT_STREAM": "chat/text-stream-include-usage-gpt4",
    "MESSAGES": "messages/text-basic-sonnet4",
    "MESSAGES_STREAM": "messages/tool-use-stream-sonnet4",
    "RESPONSES": "responses/text-basic-gpt55",
}

WORKLOAD = '''
import asyncio, json, os
import aiohttp, anthropic, httpx, openai, requests

BASE = os.environ["REPLAY_BASE"]
REQ = json.loads(os.environ["REPLAY_REQUESTS"])
out = []

with openai.OpenAI(base_url=BASE + "/v1", api_key="sk-test", max_retries=0) as client:
    out.append(client.chat.completions.create(**REQ["CHAT"]).choices[0].message.content)
    out.append("".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**REQ["CHAT_STREAM"]) if c.choices))
    raw = client.chat.completions.with_raw_response.create(**REQ["CHAT"])
    out.append([raw.status_code, raw.parse().usage.total_tokens])

with anthropic.Anthropic(base_url=BASE, api_key="sk-ant-test", max_retries=0) as client:
    out.append(client.messages.create(**REQ["MESSAGES"]).content[0].text)
    arguments = {k: v for k, v in REQ["MESSAGES_STREAM"].items() if k != "stream"}
    with client.messages.stream(**arguments) as stream:
        out.append([block.type for block in stream.get_final_message().content])

async def async_calls():
    async with openai.AsyncOpenAI(base_url=BASE + "/v1", api_key="sk-test", max_retries=0) as client:
        out.append((await client.chat.completions.create(**REQ["CHAT"])).usage.prompt_tokens)
    async with anthropic.AsyncAnthropic(base_url=BASE, api_key="sk-ant-test", max_retries=0) as client:
        out.append((await client.messages.create(**REQ["MESSAGES"])).usage.output_tokens)
    async with aiohttp.ClientSession() as session:
        async with session.post(BASE + "/v1/responses", json=REQ["RESPONSES"]) as response:
            out.append((await response.json())["status"])

asyncio.run(async_calls())
out.append(requests.post(BASE + "/v1/chat/completions", json=REQ["CHAT"]).json()["id"])
with httpx.Client() as client:
    out.append(client.post(BASE + "/v1/messages", json=REQ["MESSAGES"]).json()["id"])
print(json.dumps(out))
'''
EXPECTED_CALLS = 10


def llmtap_run(args: list[str], env: dict[str, str], cwd: Path, **options: Any) -> subprocess.CompletedProcess[str]:
    """Run `llmtap run ARGS` as a user would (a separate process), capturing its output."""
    command = [sys.executable, "-m", "llmtap.cli.run", "--capsule-dir", str(cwd / "runs"), *args]
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=300, **options)


def only_capsule(cwd: Path) -> Path:
    [capsule] = [path for path in (cwd / "runs").iterdir() if (path / "capsule.json").exists()]
    return capsule


def test_every_sdk_call_is_recorded_once_and_the_program_output_is_unchanged(replay_upstream: Any, tmp_path: Path) -> None:
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    env = dict(
        os.environ,
        REPLAY_BASE=replay_upstream.base_url,
        REPLAY_REQUESTS=json.dumps({key: fixture(name).request_json for key, name in FIXTURES.items()}),
    )
    plain = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    assert replay_upstream.request_count == EXPECTED_CALLS
    replay_upstream.reset()

    captured = llmtap_run(["--", sys.executable, str(script)], env, tmp_path)
    assert captured.returncode == 0, captured.stderr
    assert captured.stdout == plain.stdout
    assert replay_upstream.request_count == EXPECTED_CALLS

    capsule = only_capsule(tmp_path)
    manifest = json.loads((capsule / "capsule.json").read_text())
    assert manifest["status"] == "success" and manifest["exit_code"] == 0
    assert manifest["counts"]["model_calls"] == EXPECTED_CALLS
    lines = [json.loads(line) for line in (capsule / "calls" / "default.capture.jsonl").read_text().splitlines()]
    assert len({line["model_call_id"] for line in lines}) == EXPECTED_CALLS
    assert all(line["response"] is not None and line["error_category"] is None for line in lines)
    assert sorted(line["capture"]["hook"] for line in lines) == sorted(["httpx2"] * 7 + ["aiohttp", "requests", "httpx"])
    model_calls = [json.loads(line) for line in (capsule / "model-calls.jsonl").read_text().splitlines()]
    assert all(call["attributes"].get("gen_ai.usage.output_tokens") for call in model_calls)
    assert (capsule / "outputs" / "stdout.txt").read_text() == plain.stdout
    health = json.loads((capsule / "capture-health.json").read_text())
    assert health["ok"] is True and health["records"]["written"] == EXPECTED_CALLS
    assert "sk-test" not in (capsule / "calls" / "default.capture.jsonl").read_text()
    env_lock = json.loads((capsule / "env.lock").read_text())
    assert env_lock["python"]["executable"] == sys.executable
    assert {"openai", "anthropic"} <= {package["name"] for package in env_lock["packages"]}
