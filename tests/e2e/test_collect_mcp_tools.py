"""A real agent loop with its tool on an MCP server, under `llmtap collect`: the real local model behind
`llmtap serve`, the `add` tool behind `llmtap mcp-proxy --capture-dir`; the rollout's trajectory shows
each model call and the tool call between them, in order, with the timing the wire recorded."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from llmtap.mcp.demo_agent import McpAgentConfig, build_app
from llmtap.store.tool_calls import read_tool_calls
from tests.e2e.serve_harness import serving
from tests.mcp.conftest import free_port, proxy_command, stop, wait_for_port
from tests.support.servers import ServerThread

pytestmark = pytest.mark.slow

COLLECT_COMMAND = [sys.executable, "-c", "from llmtap.cli.collect import collect; collect(prog_name='llmtap collect')"]


@pytest.fixture
def tools_url() -> Iterator[str]:
    """The demo MCP server with the `add` tool, on streamable HTTP."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "llmtap.mcp.demo_agent", "server", str(port)], stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(process)


def test_the_trajectory_orders_model_calls_and_the_mcp_tool_call_between_them(
    local_model: Any, tools_url: str, tmp_path: Path
) -> None:
    calls_dir = tmp_path / "calls"
    proxy = subprocess.Popen(
        proxy_command("--capture-dir", str(calls_dir), "--upstream", tools_url, "--port", "0"), stderr=subprocess.PIPE
    )
    assert proxy.stderr is not None
    said = proxy.stderr.readline().decode()
    assert "listening on " in said, said
    proxy_url = said.split("listening on ", 1)[1].strip().rsplit("/", 1)[0] + "/mcp"
    try:
        with serving(local_model.base_url, calls_dir) as (model_proxy, _):
            agent = ServerThread(build_app(McpAgentConfig(model_proxy.base_url, proxy_url, max_turns=3, max_tokens=48)), graceful_timeout=60)
            agent._server.config.lifespan = "on"
            with agent.start():
                tasks = tmp_path / "tasks.jsonl"
                tasks.write_bytes(orjson.dumps({"question": "What is 17 + 25?", "expected": 42}) + b"\n")
                output = tmp_path / "out.jsonl"
                done = subprocess.run(
                    [*COLLECT_COMMAND, "--agent-url", agent.base_url, "--input", str(tasks), "--capture-dir", str(calls_dir),
                     "--output", str(output), "--no-progress"],
                    capture_output=True, text=True, timeout=900,
                )  # fmt: skip
                assert done.returncode == 0, done.stderr
    finally:
        stop(proxy)
        proxy.stderr.close()
    [row] = [orjson.loads(line) for line in output.read_bytes().splitlines()]
    rollout_id = row["ng_model_call_capture"]["rollout_id"]
    wire = read_tool_calls(calls_dir, rollout_id).records
    assert wire and all(record.rollout_id == rollout_id for record in wire)  # filed beside the rollout's model calls

    trajectory = row["ng_trajectory"]
    model_calls = trajectory["model_calls"]
    [tool] = [entry for entry in trajectory["tool_calls"] if entry["requested_by_model_call_id"] == model_calls[0]["model_call_id"]]
    assert len(model_calls) >= 2 and tool["tool_name"] == "add"
    # The small model's arguments may be cut short: then the server's validation error is the outcome.
    assert tool["timing_source"] == "mcp_wire" and tool["status"] in ("completed", "failed")
    [record] = [r for r in wire if r.call_id == tool["tool_execution"]["mcp_call_id"]]
    assert record.method == "tools/call" and tool["status"] == record.status
    assert tool["tool_execution"]["result_bytes"] == (record.result or {}).get("result_bytes")
    # In order, with timing: the first model call, then the tool call, then the model call that saw its result.
    assert model_calls[0]["completed_at"] <= tool["started_at"] + 0.05
    assert tool["started_at"] <= tool["completed_at"] <= model_calls[1]["started_at"] + 0.05
    assert tool["duration_ms"] == record.duration_ms and tool["duration_ms"] >= 0
    assert tool["output_model_call_id"] == model_calls[1]["model_call_id"]  # the tool result reached the next call
    assert not any(gap["code"] == "tool_timing_unavailable" for gap in trajectory["gaps"])
