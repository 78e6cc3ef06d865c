"""Shared helpers for the MCP proxy tests: the test server's command, the proxy's, and an HTTP server fixture."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TOOL_SERVER = str(HERE / "tool_server.py")
TEE = str(HERE / "tee.py")


def server_command(*extra: str) -> list[str]:
    """The test MCP server on stdio."""
    return [sys.executable, TOOL_SERVER, "stdio", *extra]


def proxy_command(*args: str) -> list[str]:
    """`llmtap mcp-proxy ARGS` as run by a user (the tree under test is first on PYTHONPATH)."""
    return [sys.executable, "-m", "llmtap", "mcp-proxy", *args]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before listening")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listened on port {port}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def http_server() -> Iterator[str]:
    """The test MCP server on streamable HTTP; yields its endpoint URL."""
    port = free_port()
    process = subprocess.Popen([sys.executable, TOOL_SERVER, "http", str(port)], stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(process)


class HttpProxy:
    """`llmtap mcp-proxy --upstream` run as a subprocess; `url` is where clients connect."""

    def __init__(self, upstream: str, record: Path, *extra: str) -> None:
        self.record = record
        self.process = subprocess.Popen(
            proxy_command("--record", str(record), "--upstream", upstream, "--port", "0", *extra),
            stderr=subprocess.PIPE,
        )
        assert self.process.stderr is not None
        line = self.process.stderr.readline().decode()
        assert "listening on " in line, line
        self.base = line.split("listening on ", 1)[1].strip().rsplit("/", 1)[0]
        self.url = self.base + "/mcp"
        self.said = ""

    def close(self) -> str:
        """Stop the proxy (idempotent); return what it said on stderr."""
        stop(self.process)
        assert self.process.stderr is not None
        if not self.process.stderr.closed:
            self.said = self.process.stderr.read().decode()
            self.process.stderr.close()
        return self.said


@pytest.fixture
def http_proxy(http_server: str, tmp_path: Path) -> Iterator[HttpProxy]:
    proxy = HttpProxy(http_server, tmp_path / "tool-calls.jsonl")
    try:
        yield proxy
    finally:
        proxy.close()
