"""The request-head guard works the same over uvicorn's h11 protocol as over httptools'."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import uvicorn

from llmtap.server.asgi import Receive, Scope, Send
from llmtap.server.header_guard import HeaderGuard, configure_header_guard
from tests.support.faults import send_head_slowly
from tests.support.servers import LOOPBACK, ServerThread


async def _ok(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def guarded() -> Iterator[list[str]]:
    saved = (HeaderGuard.timeout_s, HeaderGuard.max_head_bytes, HeaderGuard.on_refused)
    refused: list[str] = []
    configure_header_guard(1.5, 2048, refused.append)
    yield refused
    configure_header_guard(*saved)


@pytest.mark.parametrize("protocol", ["GuardedH11Protocol", "GuardedHttpToolsProtocol"])
def test_a_slow_head_is_cut_and_a_prompt_one_served(guarded: list[str], protocol: str) -> None:
    config = uvicorn.Config(_ok, http=f"llmtap.server.header_guard:{protocol}", log_level="warning", lifespan="off")
    with ServerThread(_ok, config=config).start() as server:
        sent, answer = send_head_slowly(server.port, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n", interval_s=1.0)
        with socket.create_connection((LOOPBACK, server.port), timeout=10) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            prompt = b""
            while piece := sock.recv(65536):
                prompt += piece
            with socket.create_connection((LOOPBACK, server.port), timeout=10) as big:
                big.sendall(b"GET / HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * 4096 + b"\r\n\r\n")
                too_large = big.recv(65536)
    assert answer.startswith(b"HTTP/1.1 408") and sent <= 3
    assert prompt.startswith(b"HTTP/1.1 200") and prompt.endswith(b"ok")
    assert too_large.startswith(b"HTTP/1.1 431")
    assert guarded == ["request_head_timeout", "request_head_too_large"]  # each refusal is counted
