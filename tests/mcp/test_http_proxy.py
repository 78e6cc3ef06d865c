"""`llmtap mcp-proxy --upstream URL` with the real `mcp` SDK over streamable HTTP, through a loopback server."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import ElicitResult

from llmtap.mcp import parse_tool_call_line
from llmtap.mcp.http_proxy import forwarded_headers

from .conftest import TOOL_SERVER, HttpProxy, free_port, proxy_command, stop, wait_for_port

TOKEN = "Bearer sk-test-6f1c2d9e8b7a"
ELICITED = "correct-horse-battery"


async def _elicit(context: Any, params: Any) -> ElicitResult:
    return ElicitResult(action="accept", content={"code": ELICITED})


async def _session(url: str, mode: str) -> list[Any]:
    async with httpx2.AsyncClient(headers={"Authorization": TOKEN}) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode=mode, elicitation_callback=_elicit) as client:  # type: ignore[arg-type]
            return [
                await client.call_tool("echo", {"text": "héllo"}),
                await client.call_tool("fail", {"reason": "no"}),
                await client.call_tool("slow", {"seconds": 0.2}),
                await client.call_tool("big", {"size": 200_000}),
                await client.call_tool("whoami", {}),
                await client.call_tool("ask_secret", {}),
            ]


def _records(path: Path) -> list[dict[str, Any]]:
    lines = path.read_bytes().splitlines()
    for line in lines:
        parse_tool_call_line(line)
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_sdk_session_through_the_proxy_records_each_call_and_forwards_credentials(
    mode: str, http_proxy: HttpProxy
) -> None:
    results = await _session(http_proxy.url, mode)
    assert results[0].content[0].text == "héllo"
    assert results[1].is_error is True
    assert len(results[3].content[0].text) == 200_000
    # Authorization (and, on the handshake protocol, Mcp-Session-Id) reached the server.
    whoami = results[4].content[0].text
    assert f"authorization={hashlib.sha256(TOKEN.encode()).hexdigest()}" in whoami
    if mode == "legacy":
        assert "session=None" not in whoami
    http_proxy.close()

    records = _records(http_proxy.record)
    calls = [r for r in records if r["method"] == "tools/call" and r["status"] != "input_required"]
    assert [c["name"] for c in calls] == ["echo", "fail", "slow", "big", "whoami", "ask_secret"]
    echo, fail, slow, big, _, ask = calls
    assert echo["status"] == "completed" and echo["result"]["content"] == [{"type": "text", "text": "héllo"}]
    assert echo["transport"] == "streamable_http" and echo["http"]["status"] == 200
    assert fail["status"] == "failed" and fail["is_error"] is True
    assert slow["duration_ms"] >= 200
    assert big["result"]["content_truncated"] is True and big["result"]["result_bytes"] > 200_000
    assert ask["result"]["content"][0]["text"] == f"got {len(ELICITED)} characters"
    era = "handshake" if mode == "legacy" else "stateless"
    assert {r["protocol"]["era"] for r in calls} == {era}
    if mode == "legacy":
        assert len({r["http"]["session"] for r in calls}) == 1 and calls[0]["http"]["session"].startswith("hmac-")
        assert [r["result"]["action"] for r in records if r["method"] == "elicitation/create"] == ["accept"]
    else:
        (asked,) = [r for r in records if r["status"] == "input_required"]
        assert ask["retry"]["of"] == asked["call_id"] and ask["retry"]["linked_by"] == "request_state"
    # Nothing secret on disk: no credential, no session id, no elicited value.
    text = http_proxy.record.read_text()
    assert TOKEN.split()[1] not in text and ELICITED not in text


async def _initialize(client: httpx.AsyncClient, url: str) -> dict[str, str]:
    """A raw handshake-era initialize; returns the headers later requests need."""
    accept = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "authorization": TOKEN,
    }
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}},
    }
    response = await client.post(url, json=init, headers=accept)
    assert response.status_code == 200
    headers = {**accept, "mcp-session-id": response.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
    await client.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    return headers


async def test_an_sse_answer_is_streamed_event_by_event(http_proxy: HttpProxy, tmp_path: Path) -> None:
    release = tmp_path / "release"
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "wait_for_file", "arguments": {"path": str(release)}},
    }
    async with httpx.AsyncClient(timeout=60) as client:
        headers = await _initialize(client, http_proxy.url)
        async with client.stream("POST", http_proxy.url, json=call, headers=headers) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            events = response.aiter_lines()
            first = [line async for line in _until_blank(events)]
            # The log event arrived while the tool still waits: the proxy did not gather the answer first.
            assert any('"notifications/message"' in line for line in first)
            release.touch()
            rest = [line async for line in events]
    assert any('"done"' in line for line in rest)
    http_proxy.close()
    (record,) = [r for r in _records(http_proxy.record) if r["method"] == "tools/call"]
    assert record["status"] == "completed" and record["http"]["response_mode"] == "sse"
    text = http_proxy.record.read_text()
    assert headers["mcp-session-id"] not in text and TOKEN.split()[1] not in text


async def _until_blank(lines: Any) -> Any:
    async for line in lines:
        if not line:
            return
        yield line


async def test_the_rollout_prefix_sets_the_records_rollout_id(http_proxy: HttpProxy) -> None:
    await _session(http_proxy.base + "/ng-rollout/12-3/mcp", "auto")
    http_proxy.close()
    assert {r["rollout_id"] for r in _records(http_proxy.record)} == {"12-3"}


def _raw_status(base: str, target: str) -> int:
    """POST to `target` exactly as written (no client-side normalizing), return the status code."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(f"POST {target} HTTP/1.1\r\nhost: {host}\r\ncontent-length: 2\r\n\r\n{{}}".encode())
        head = connection.recv(4096)
    return int(head.split(b" ", 2)[1])


@pytest.mark.parametrize(
    "target", ["/other", "/mcp/", "/mcp/../mcp", "/x/../mcp", "/%6Dcp", "//mcp", "/ng-rollout/1-1/other", "/mcp?x=1"]
)
def test_only_the_configured_endpoint_path_is_served(http_proxy: HttpProxy, target: str) -> None:
    assert _raw_status(http_proxy.base, target) == 404


async def test_an_invalid_rollout_id_is_a_400(http_proxy: HttpProxy) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(http_proxy.base + "/ng-rollout/bad%20id/mcp", content=b"{}")
    assert response.status_code == 400 and "not valid" in response.text


async def test_a_body_over_the_limit_is_refused_and_not_sent(http_server: str, tmp_path: Path) -> None:
    proxy = HttpProxy(http_server, tmp_path / "calls.jsonl", "--max-body-bytes", "2048")
    try:
        async with httpx.AsyncClient() as client:
            declared = await client.post(proxy.url, content=b"x" * 4096)
            streamed = await client.post(proxy.url, content=_chunks(b"x" * 1024, 4))
        assert declared.status_code == 413 and streamed.status_code == 413
    finally:
        proxy.close()


async def _chunks(chunk: bytes, count: int) -> Any:
    for _ in range(count):
        yield chunk


async def test_an_unreachable_upstream_is_a_502_and_the_call_is_recorded(tmp_path: Path) -> None:
    proxy = HttpProxy(f"http://127.0.0.1:{free_port()}/mcp", tmp_path / "calls.jsonl")
    call = {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "echo", "arguments": {}}}
    try:
        async with httpx.AsyncClient() as client:
            response = await client.post(proxy.url, json=call, headers={"authorization": TOKEN})
        assert response.status_code == 502
    finally:
        proxy.close()
    (record,) = _records(proxy.record)
    assert record["status"] == "failed" and record["error"] == {"category": "upstream_unreachable"}


def test_hop_by_hop_headers_are_dropped_and_end_to_end_ones_kept_in_order() -> None:
    headers = [
        (b"authorization", b"Bearer a"),
        (b"connection", b"keep-alive, x-private"),
        (b"x-private", b"1"),
        (b"mcp-session-id", b"abc"),
        (b"transfer-encoding", b"chunked"),
        (b"MCP-Protocol-Version", b"2025-11-25"),
        (b"keep-alive", b"timeout=5"),
        (b"host", b"client"),
        (b"x-b", b"1"),
        (b"x-b", b"2"),
    ]
    kept = forwarded_headers(headers, frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"host"}))
    assert kept == [
        (b"authorization", b"Bearer a"),
        (b"mcp-session-id", b"abc"),
        (b"MCP-Protocol-Version", b"2025-11-25"),
        (b"x-b", b"1"),
        (b"x-b", b"2"),
    ]


def test_an_upstream_url_that_is_not_http_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        proxy_command("--upstream", "file:///etc/passwd", "--port", "0"), capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 1 and b"is not an http:// or https:// URL" in done.stderr


HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding"}


def _end_to_end(headers: httpx.Headers) -> list[str]:
    return [name for name, _ in headers.multi_items() if name not in HOP_BY_HOP]


async def _raw_exchange(url: str) -> list[tuple[int, list[str], bytes]]:
    """A scripted handshake-era session in raw HTTP; each answer's status, end-to-end header names and body."""
    answers = []
    async with httpx.AsyncClient(timeout=60) as client:
        headers = await _initialize(client, url)
        for index, (name, arguments) in enumerate(
            [("echo", {"text": "héllo"}), ("fail", {"reason": "x"}), ("big", {"size": 50_000})]
        ):
            call = {
                "jsonrpc": "2.0",
                "id": 10 + index,
                "method": "tools/call",
                "params": {"name": name, "arguments": arguments},
            }
            async with client.stream("POST", url, json=call, headers=headers) as response:
                body = b"".join([chunk async for chunk in response.aiter_raw()])
                answers.append((response.status_code, _end_to_end(response.headers), body))
        deleted = await client.delete(url, headers=headers)
        answers.append((deleted.status_code, _end_to_end(deleted.headers), deleted.content))
    return answers


async def test_http_answers_are_byte_identical_to_a_direct_session(http_server: str, http_proxy: HttpProxy) -> None:
    direct = await _raw_exchange(http_server)
    proxied = await _raw_exchange(http_proxy.url)
    assert proxied == direct
    assert [answer[0] for answer in direct] == [200, 200, 200, 200]
    assert "content-type" in direct[0][1] and len(direct[2][2]) > 50_000


@pytest.fixture
def own_server() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A test server of this test's own (it will be crashed): its URL and process."""
    port = free_port()
    server = subprocess.Popen([sys.executable, TOOL_SERVER, "http", str(port)], stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, server)
        yield f"http://127.0.0.1:{port}/mcp", server
    finally:
        stop(server)


async def test_a_server_that_dies_mid_answer_leaves_the_call_recorded_as_failed(
    own_server: tuple[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    url, server = own_server
    proxy = HttpProxy(url, tmp_path / "calls.jsonl")
    try:
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "crash", "arguments": {}}}
        async with httpx.AsyncClient(timeout=60) as client:
            headers = await _initialize(client, proxy.url)
            with pytest.raises(httpx.RemoteProtocolError):  # the client sees the answer cut off, not ended
                async with client.stream("POST", proxy.url, json=call, headers=headers) as response:
                    async for _ in response.aiter_raw():
                        pass
        assert await asyncio.to_thread(server.wait, 60) == 3
    finally:
        proxy.close()
    (record,) = [r for r in _records(proxy.record) if r["method"] == "tools/call"]
    assert record["name"] == "crash" and record["status"] == "failed"
    assert record["error"] == {"category": "upstream_closed", "http_status": 200}
    assert "Traceback" not in proxy.said and "closed a response before its end" in proxy.said


def test_sessions_are_bounded_and_an_evicted_sessions_open_calls_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    import llmtap.mcp.http_proxy as http_proxy_module
    from llmtap.mcp.pairing import SERVER_TO_CLIENT
    from llmtap.mcp.recorder import Recorder

    monkeypatch.setattr(http_proxy_module, "MAX_SESSIONS", 2)
    proxy = http_proxy_module.McpHttpProxy("http://127.0.0.1:9/mcp", recorder=Recorder(None))
    elicit = {"jsonrpc": "2.0", "id": 1, "method": "elicitation/create", "params": {}}
    proxy._session("a").pairing.observe(SERVER_TO_CLIENT, elicit, 10)
    proxy._session("b")
    proxy._session("c")  # "a" is the least recently used: dropped, its open call closed
    assert list(proxy._sessions) == ["b", "c"]
    (evicted,) = proxy.evicted
    assert evicted.method == "elicitation/create" and evicted.error == {"category": "session_evicted"}
