"""Intervention on a tool result: "what if the tool had returned X", with the real `mcp` SDK over stdio.

The agent asks the model, calls the MCP tool `echo`, and asks the model again with what the tool
said. Recorded under `llmtap run` against the replay upstream, then replayed with the echo's
result replaced: the agent sees the replacement (the server is not asked), its next request
carries it, so that call leaves the recording: with `--on-miss passthrough` it goes to the live
endpoint and the intervention passes; without, the replay fails naming the field that changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.mcp.conftest import TOOL_SERVER
from tests.support.replay import FIXTURE_HEADER, ReplayUpstream

AGENT = f"""
import asyncio, json, os, sys
import httpx
from mcp import Client, StdioServerParameters

def ask(text):
    body = {{"model": "gpt-4o", "messages": [{{"role": "user", "content": text}}]}}
    headers = {{"{FIXTURE_HEADER}": "chat/text-basic-gpt4o"}}
    answer = httpx.post(os.environ["REPLAY_BASE"] + "/v1/chat/completions", json=body, headers=headers, timeout=30)
    return answer.json()["choices"][0]["message"]["content"]

async def main():
    first = ask("Say hi, then I will echo it")
    target = StdioServerParameters(command=sys.executable, args=[{TOOL_SERVER!r}, "stdio"], env=dict(os.environ))
    async with Client(target, mode="legacy") as client:
        echoed = (await client.call_tool("echo", {{"text": first}})).content[0].text
    second = ask("The tool said: " + echoed)
    print(json.dumps([first, echoed, second]))

asyncio.run(main())
"""


def _llmtap(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmtap", *args], check=False, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def _capsule(directory: Path) -> Path:
    [capsule] = [path for path in directory.iterdir() if (path / "capsule.json").exists()]
    return capsule


def _report(stdout: str) -> dict[str, Any]:
    return json.loads(stdout[stdout.index("\n{") + 1 :])


def _record(tmp_path: Path, upstream: ReplayUpstream, override: dict[str, Any]) -> tuple[Path, Path, Path, dict[str, str]]:
    """Record the agent under `llmtap run`; return (its script, its capsule, the override file, the environment)."""
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    override_file = tmp_path / "tool.json"
    override_file.write_text(json.dumps(override))
    env = dict(os.environ, REPLAY_BASE=upstream.base_url)
    recorded = _llmtap(["run", "--capsule-dir", str(tmp_path / "recorded"), "--", sys.executable, str(script)], env, tmp_path)
    assert recorded.returncode == 0, recorded.stderr
    assert json.loads(recorded.stdout.splitlines()[0]) == ["Oi!", "Oi!", "Oi!"]
    upstream.reset()
    return script, _capsule(tmp_path / "recorded"), override_file, env


def test_a_replaced_tool_result_reaches_the_agent_and_the_next_call_goes_live(tmp_path: Path) -> None:
    with ReplayUpstream().start() as upstream:
        script, capsule, override, env = _record(tmp_path, upstream, {"tool": "echo", "occurrence": 0, "text": "what if"})

        # Without a live endpoint for what follows, the replay fails at the call the replacement changed.
        strict = _llmtap(
            ["replay", str(capsule), "--replace", str(override), "--capsule-dir", str(tmp_path / "strict"), "--json", "--",
             sys.executable, str(script)],
            env,
            tmp_path,
        )
        assert strict.returncode != 0
        assert "/request/messages/0/content" in strict.stderr and "what if" in strict.stderr
        assert upstream.request_count == 0

        replayed = _llmtap(
            ["replay", str(capsule), "--replace", str(override), "--on-miss", "passthrough",
             "--capsule-dir", str(tmp_path / "replayed"), "--json", "--", sys.executable, str(script)],
            env,
            tmp_path,
        )
        assert replayed.returncode == 0, replayed.stderr
        assert upstream.request_count == 1  # only the call after the replacement went live
    said = json.loads(replayed.stdout.splitlines()[0])
    assert said == ["Oi!", "what if", "Oi!"]  # the agent saw the replaced result
    report = _report(replayed.stdout)
    assert report["mode"] == "intervention" and report["intervention_applied"] is True and report["ok"] is True
    assert report["replaced_tool_results"] == [{"tool": "echo", "occurrence": 0}]
    assert report["served"] == 1 and report["passthrough"] == 1 and len(report["misses"]) == 1
    records = [json.loads(line) for line in (_capsule(tmp_path / "replayed") / "tool-calls.jsonl").read_text().splitlines()]
    [tool_call] = [record for record in records if record["method"] == "tools/call"]
    assert tool_call["name"] == "echo" and tool_call["protocol"]["replay"] == "replaced"
    assert tool_call["result"]["content"][0]["text"] == "what if"


def test_a_tool_intervention_that_never_applies_fails_the_replay(tmp_path: Path) -> None:
    with ReplayUpstream().start() as upstream:
        script, capsule, override, env = _record(tmp_path, upstream, {"tool": "echo", "occurrence": 5, "text": "never used"})
    replayed = _llmtap(
        ["replay", str(capsule), "--replace", str(override), "--capsule-dir", str(tmp_path / "replayed"),
         "--json", "--", sys.executable, str(script)],
        env,
        tmp_path,
    )
    assert replayed.returncode == 1
    report = _report(replayed.stdout)
    assert report["intervention_applied"] is False and report["ok"] is False and report["misses"] == []
