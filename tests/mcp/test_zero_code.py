"""Zero-code MCP capture: `llmtap run -- python agent.py` records the `mcp` SDK's calls, with no proxy configured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from llmtap.cli.runs import runs
from llmtap.mcp import parse_tool_call_line

from .conftest import TOOL_SERVER

AGENT = """
import asyncio, json, os, sys
from mcp import Client, StdioServerParameters

async def main():
    if sys.argv[1] == "stdio":
        target = StdioServerParameters(command=sys.executable, args=[{server!r}, "stdio"], env=dict(os.environ))
    else:
        target = sys.argv[2]
    said = []
    async with Client(target, mode="legacy") as client:
        await client.list_tools()
        said.append((await client.call_tool("echo", {{"text": "hi"}})).content[0].text)
        failed = await client.call_tool("fail", {{"reason": "no"}})
        said.append(failed.is_error)
        await client.call_tool("slow", {{"seconds": 0.2}})
        big = await client.call_tool("big", {{"size": 100000}})
        said.append(len(big.content[0].text))
    print(json.dumps(said))

asyncio.run(main())
"""


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    script = tmp_path / "agent.py"
    script.write_text(AGENT.format(server=TOOL_SERVER))
    command = [sys.executable, "-m", "llmtap.cli.run", "--capsule-dir", str(tmp_path / "runs"), "--", sys.executable, str(script), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=dict(os.environ), cwd=tmp_path)
    [capsule] = [path for path in (tmp_path / "runs").iterdir() if (path / "capsule.json").exists()]
    return done, capsule


def _check(done: subprocess.CompletedProcess[str], capsule: Path) -> list[dict[str, Any]]:
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == ["hi", True, 100000]  # the agent saw what it would see alone
    lines = (capsule / "tool-calls.jsonl").read_bytes().splitlines()
    records = [parse_tool_call_line(line).to_dict() for line in lines]
    # One record per recorded request, in order: initialize is not one of them.
    assert [(r["method"], r["name"]) for r in records] == [
        ("tools/list", None), ("tools/call", "echo"), ("tools/call", "fail"), ("tools/call", "slow"), ("tools/call", "big"),
    ]  # fmt: skip
    listing, echo, fail, slow, big = records
    assert listing["result"]["tools"] and "echo" in listing["result"]["tools"]
    assert echo["status"] == "completed" and echo["arguments"] == {"text": "hi"} and echo["is_error"] is False
    assert echo["result"]["content"][0]["text"] == "hi"
    assert fail["status"] == "failed" and fail["is_error"] is True and fail["error"] == {"category": "tool_error"}
    assert slow["duration_ms"] >= 200 and slow["completed_at"] >= slow["started_at"]
    assert big["result"]["content_bytes"] > 100000 and big["result"]["content_truncated"] is True
    assert len({r["session_id"] for r in records}) == 1 and all(r["transport"] == "sdk" for r in records)
    manifest = json.loads((capsule / "capsule.json").read_text())
    assert manifest["counts"]["tool_calls"] == 5 and manifest["files"]["tool_calls"] == "tool-calls.jsonl"
    proof = json.loads((capsule / "redaction-proof.json").read_text())
    assert "tool-calls.jsonl" in proof["files"]  # redacted at finalisation like every other file
    shown = CliRunner().invoke(runs, ["show", str(capsule)], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    timeline = shown.output.split("timeline", 1)[1].splitlines()
    assert "0 model call(s), 5 MCP request(s)" in timeline[0]
    assert [line.strip().split("  ")[0] for line in timeline[2:6]] == ["-> tool echo", "-> tool fail", "-> tool slow", "-> tool big"]
    return records


def test_the_sdk_stdio_client_is_recorded_under_llmtap_run(tmp_path: Path) -> None:
    done, capsule = _run(tmp_path, "stdio")
    _check(done, capsule)


def test_the_sdk_streamable_http_client_is_recorded_under_llmtap_run(http_server: str, tmp_path: Path) -> None:
    done, capsule = _run(tmp_path, "http", http_server)
    records = _check(done, capsule)
    # The HTTP requests to the MCP server are network events too (not model calls).
    events = [json.loads(line) for line in (capsule / "network_events.jsonl").read_bytes().splitlines()]
    assert events and all(e["host"] == "127.0.0.1" and e["path"] == "/mcp" for e in events)
    assert all("body" not in e and "headers" not in e for e in events)
    assert len(records) == 5


def test_a_proxy_started_by_the_agent_under_llmtap_run_spools_into_the_capsule(tmp_path: Path) -> None:
    proxied = [sys.executable, "-m", "llmtap", "mcp-proxy", "--", sys.executable, TOOL_SERVER, "stdio"]
    script = tmp_path / "agent.py"
    script.write_text(
        "import asyncio, os, sys\nfrom mcp import Client, StdioServerParameters\n"
        "async def main():\n"
        f"    params = StdioServerParameters(command={proxied[0]!r}, args={proxied[1:]!r}, env=dict(os.environ))\n"
        "    async with Client(params, mode='legacy') as client:\n"
        "        print((await client.call_tool('echo', {'text': 'via proxy'})).content[0].text)\n"
        "asyncio.run(main())\n"
    )
    command = [sys.executable, "-m", "llmtap.cli.run", "--capsule-dir", str(tmp_path / "runs"), "--", sys.executable, str(script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    [capsule] = [path for path in (tmp_path / "runs").iterdir() if (path / "capsule.json").exists()]
    records = [json.loads(line) for line in (capsule / "tool-calls.jsonl").read_bytes().splitlines()]
    # The agent's own SDK is hooked (transport "sdk") and the proxy records the same call on the wire (stdio).
    echo = [(r["transport"], r["result"]["content"][0]["text"]) for r in records if r["method"] == "tools/call"]
    assert sorted(echo) == [("sdk", "via proxy"), ("stdio", "via proxy")]


def test_the_stdio_proxy_files_records_under_its_rollout_in_a_capture_directory(tmp_path: Path) -> None:
    proxied = [sys.executable, "-m", "llmtap", "mcp-proxy", "--capture-dir", str(tmp_path / "calls"), "--rollout-id", "task-3",
               "--", sys.executable, TOOL_SERVER, "stdio"]  # fmt: skip
    program = (
        "import asyncio, os, sys\nfrom mcp import Client, StdioServerParameters\n"
        "async def main():\n"
        f"    params = StdioServerParameters(command={proxied[0]!r}, args={proxied[1:]!r}, env=dict(os.environ))\n"
        "    async with Client(params, mode='legacy') as client:\n"
        "        print((await client.call_tool('echo', {'text': 'filed'})).content[0].text)\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "filed", done.stderr
    from llmtap.store.tool_calls import read_tool_calls

    records = read_tool_calls(tmp_path / "calls", "task-3").records
    assert [(r.method, r.name, r.rollout_id) for r in records if r.method == "tools/call"] == [("tools/call", "echo", "task-3")]
    assert (tmp_path / "calls" / "task-3.capture.lock").exists()


def test_a_server_that_crashes_mid_call_leaves_the_call_recorded_as_failed(tmp_path: Path) -> None:
    script = tmp_path / "agent.py"
    script.write_text(
        "import asyncio, os, sys\nfrom mcp import Client, StdioServerParameters\n"
        "async def main():\n"
        f"    params = StdioServerParameters(command=sys.executable, args=[{TOOL_SERVER!r}, 'stdio'], env=dict(os.environ))\n"
        "    try:\n"
        "        async with Client(params, mode='legacy') as client:\n"
        "            await client.call_tool('crash', {})\n"
        "    except BaseException as exc:\n"
        "        print('raised', type(exc).__name__)\n"
        "asyncio.run(main())\n"
    )
    command = [sys.executable, "-m", "llmtap.cli.run", "--capsule-dir", str(tmp_path / "runs"), "--", sys.executable, str(script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("raised"), done.stderr
    [capsule] = [path for path in (tmp_path / "runs").iterdir() if (path / "capsule.json").exists()]
    records = [json.loads(line) for line in (capsule / "tool-calls.jsonl").read_bytes().splitlines()]
    [crashed] = [r for r in records if r["name"] == "crash"]
    assert crashed["status"] == "failed" and crashed["error"]["category"] in ("jsonrpc_error", "client_error")
    assert crashed["completed_at"] is not None and crashed["result"] is None
