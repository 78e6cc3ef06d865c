"""The socket watch and the MCP hook in-process: symmetric install, the registry's opt-out, and records under `llmtap.capture()`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from llmtap.errors import ConfigError
from llmtap.hooks.registry import registry_from_data
from llmtap.hooks.socket_watch import SocketWatchHook

from ..mcp.conftest import TOOL_SERVER


def _registry(watch: object = None) -> dict[str, object]:
    provider: dict[str, object] = {"provider": "p", "hosts": ["api.example:443"], "endpoints": [{"path": "/v1/x", "operation": "chat"}]}
    if watch is not None:
        provider["watch_connections"] = watch
    return {"schema_version": 1, "providers": [provider]}


def test_watch_connections_defaults_on_and_can_be_turned_off() -> None:
    assert registry_from_data(_registry(), source="t").provider_for_host("API.example.", 443) == "p"
    assert registry_from_data(_registry(), source="t").provider_for_host("api.example", 80) is None
    assert registry_from_data(_registry(False), source="t").provider_for_host("api.example", 443) is None
    with pytest.raises(ConfigError):
        registry_from_data(_registry("yes"), source="t")


def test_uninstall_restores_exactly_what_was_there() -> None:
    before = {name: socket.socket.__dict__.get(name) for name in ("connect", "connect_ex")}
    original = socket.getaddrinfo
    hook = SocketWatchHook()
    assert hook.install(socket)
    assert socket.socket.__dict__.get("connect") is not None and socket.getaddrinfo is not original
    hook.uninstall()
    assert {name: socket.socket.__dict__.get(name) for name in ("connect", "connect_ex")} == before
    assert socket.getaddrinfo is original


def test_the_sdk_hook_writes_beside_the_rollouts_model_calls_under_capture(tmp_path: Path) -> None:
    program = f"""
import asyncio, os, sys
import llmtap
from mcp import Client, StdioServerParameters

async def main():
    params = StdioServerParameters(command=sys.executable, args=[{TOOL_SERVER!r}, "stdio"], env=dict(os.environ))
    async with Client(params, mode="legacy") as client:
        with llmtap.rollout("task-7"):
            await client.call_tool("echo", {{"text": "in capture"}})

with llmtap.capture(capture_dir={str(tmp_path / "calls")!r}):
    asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    from llmtap.store.tool_calls import read_tool_calls

    records = read_tool_calls(tmp_path / "calls", "task-7").records
    [record] = [r for r in records if r.method == "tools/call"]  # the SDK may list the tools first, to check results
    assert record.name == "echo" and record.status == "completed" and record.rollout_id == "task-7"
    assert record.result is not None and record.result["content"][0]["text"] == "in capture"
