"""`llmtap serve`'s bounds, seen by a client: a body over the limit gets a 413 and is recorded as
rejected, a request head that trickles in (slowloris) or never ends is cut off, a health document
answers at `/llmtap/health`, and credential-shaped headers are forwarded but never recorded."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from llmtap.health import CaptureHealth
from llmtap.server.config import load_serve_config
from llmtap.server.proxy import build_app
from llmtap.server.run import uvicorn_config
from llmtap.store import CaptureStore
from tests.e2e.serve_harness import serving
from tests.support.faults import FaultUpstream, send_head_slowly
from tests.support.servers import LOOPBACK, ServerThread

CHAT = {"model": "gpt-4", "messages": [{"role": "user", "content": "Say this is a test"}]}


@contextmanager
def real_serve(upstream: str, capture_dir: Path, **settings: Any) -> Iterator[tuple[ServerThread, CaptureHealth]]:
    """`llmtap serve` as `run_server` configures uvicorn (guarded protocol included), on loopback."""
    config = load_serve_config(
        settings={"upstreams": {"default": {"base_url": upstream}}, "observability_enabled": True,
                  "model_call_capture_dir": str(capture_dir), **settings}
    )
    health = CaptureHealth()
    store = CaptureStore(capture_dir)
    app = build_app(config, store=store, health=health)
    with ServerThread(app, config=uvicorn_config(config, app)).start() as server:
        yield server, health
    store.close()


def test_a_body_over_the_limit_gets_a_413_and_is_recorded_as_rejected(fault_upstream: FaultUpstream, tmp_path: Path) -> None:
    limit = 4096
    with serving(fault_upstream.url("ok"), tmp_path, max_request_body_bytes=limit) as (server, health):
        sdk = openai.OpenAI(base_url=f"{server.base_url}/ng-rollout/big/v1", api_key="sk-test", max_retries=0)
        with sdk, pytest.raises(openai.APIStatusError) as raised:
            sdk.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x" * (2 * limit)}])
        # A body just under the limit still goes through, on the same server.
        with httpx.Client(trust_env=False) as http:
            fine = http.post(f"{server.base_url}/ng-rollout/small/v1/chat/completions", json=CHAT)
            # Without a rollout prefix nothing is recorded, but the bound holds all the same.
            bare = http.post(f"{server.base_url}/v1/chat/completions", content=b"{" + b" " * limit + b"}")
    assert raised.value.status_code == 413
    assert raised.value.body["code"] == "request_body_too_large" and str(limit) in raised.value.body["message"]
    assert fine.status_code == 200 and bare.status_code == 413
    assert len(fault_upstream.received) == 1  # only the small one was forwarded
    [(_, line)] = CaptureStore(tmp_path).read("big").entries
    assert line["status_code"] == 413 and line["error_category"] == "client_error"
    assert line["rejected"]["reason"] == "request_body_too_large" and line["rejected"]["limit_bytes"] == limit
    assert line["request"] is None and "request_raw" not in line  # the refused body is not kept
    assert health.snapshot()["rejected_request_bodies"] == 1


def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_read(
    fault_upstream: FaultUpstream, tmp_path: Path
) -> None:
    with serving(fault_upstream.url("ok"), tmp_path, max_request_body_bytes=1000) as (server, _):
        with socket.create_connection((LOOPBACK, server.port), timeout=10) as sock:
            sock.sendall(b"POST /ng-rollout/declared/v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                         b"content-type: application/json\r\ncontent-length: 1000000000\r\n\r\n{")
            answer = b""
            while piece := sock.recv(65536):
                answer += piece
    assert answer.startswith(b"HTTP/1.1 413") and b"connection: close" in answer.lower()
    [(_, line)] = CaptureStore(tmp_path).read("declared").entries
    assert line["rejected"]["received_bytes"] == 1_000_000_000


def test_a_request_head_sent_one_byte_a_second_is_cut_off_with_a_408(fault_upstream: FaultUpstream, tmp_path: Path) -> None:
    head = b"POST /ng-rollout/slow/v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 2\r\n\r\n"
    with real_serve(fault_upstream.url("ok"), tmp_path, header_read_timeout_s=2.5) as (server, _):
        sent, answer = send_head_slowly(server.port, head, interval_s=1.0)
        # The server still serves everyone else.
        with httpx.Client(trust_env=False) as http:
            fine = http.post(f"{server.base_url}/ng-rollout/fast/v1/chat/completions", json=CHAT)
    assert answer.startswith(b"HTTP/1.1 408")
    assert sent < len(head) // 4, f"{sent} of {len(head)} bytes were taken before the cut"
    assert fine.status_code == 200
    assert CaptureStore(tmp_path).read("slow").entries == []


def test_a_kept_alive_connection_gets_the_same_deadline_for_its_next_head(
    fault_upstream: FaultUpstream, tmp_path: Path
) -> None:
    with real_serve(fault_upstream.url("ok"), tmp_path, header_read_timeout_s=1.0) as (server, _):
        with socket.create_connection((LOOPBACK, server.port), timeout=10) as sock:
            sock.sendall(b"GET /llmtap/health HTTP/1.1\r\nhost: x\r\n\r\n")
            first = sock.recv(65536)
            sock.sendall(b"GET /llmtap/hea")  # the next head never ends
            rest = b""
            while piece := sock.recv(65536):
                rest += piece
    whole = first + rest  # the health answer, then the 408 for the head that never ended
    assert whole.startswith(b"HTTP/1.1 200") and whole.count(b"HTTP/1.1 ") == 2
    assert whole.endswith(b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")


def test_a_request_head_over_the_size_bound_gets_a_431(fault_upstream: FaultUpstream, tmp_path: Path) -> None:
    with real_serve(fault_upstream.url("ok"), tmp_path, max_request_head_bytes=4096) as (server, _):
        with socket.create_connection((LOOPBACK, server.port), timeout=10) as sock:
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-padding: " + b"a" * 8192 + b"\r\n\r\n")
            answer = b""
            while piece := sock.recv(65536):
                answer += piece
    assert answer.startswith(b"HTTP/1.1 431")


def test_health_reports_capture_state_and_is_never_captured_or_forwarded(
    fault_upstream: FaultUpstream, tmp_path: Path
) -> None:
    with serving(fault_upstream.url("ok"), tmp_path) as (server, _), httpx.Client(trust_env=False) as http:
        before = http.get(f"{server.base_url}/llmtap/health").json()
        for rollout in ("h1", "h2"):
            assert http.post(f"{server.base_url}/ng-rollout/{rollout}/v1/chat/completions", json=CHAT).status_code == 200
        after = http.get(f"{server.base_url}/llmtap/health")
    assert before["sync_latency_ms"] == {"p50": None, "p99": None, "samples": 0}  # unknown, not zero
    report = after.json()
    assert after.headers["cache-control"] == "no-store"
    assert report["ready"] is True and report["in_flight"] == 0
    assert report["capture"] == {"enabled": True, "dir": str(tmp_path.resolve()), "dir_writable": True}
    assert report["records_written"] == 2 and report["capture_failures"] == {} and report["capture_failures_total"] == 0
    latency = report["sync_latency_ms"]
    assert latency["samples"] == 2 and 0 < latency["p50"] <= latency["p99"]
    assert len(fault_upstream.received) == 2  # health never went upstream
    assert sorted(path.name for path in tmp_path.iterdir() if path.name.endswith(".capture.jsonl")) == [
        "h1.capture.jsonl", "h2.capture.jsonl"]


def test_health_counts_capture_failures_by_kind_and_turns_unready_when_the_dir_goes(
    fault_upstream: FaultUpstream, tmp_path: Path
) -> None:
    capture_dir = tmp_path / "calls"
    with serving(fault_upstream.url("ok"), capture_dir) as (server, health), httpx.Client(trust_env=False) as http:
        health.failure("record_write_failed", "asgi", OSError("disk full"))
        capture_dir.rename(tmp_path / "moved")
        answer = http.get(f"{server.base_url}/llmtap/health")
    assert answer.status_code == 503
    report = answer.json()
    assert report["ready"] is False and report["capture"]["dir_writable"] is False
    assert report["capture_failures"] == {"record_write_failed": 1} and report["capture_failures_total"] == 1


def test_credential_shaped_headers_reach_the_upstream_but_never_the_record(
    fault_upstream: FaultUpstream, tmp_path: Path
) -> None:
    secrets = {"apikey": "s1", "x-auth": "s2", "x-session-id": "s3", "x-client-secret": "s4"}
    with serving(fault_upstream.url("ok"), tmp_path) as (server, _), httpx.Client(trust_env=False) as http:
        answer = http.post(f"{server.base_url}/ng-rollout/hdr/v1/chat/completions", json=CHAT,
                           headers={**secrets, "anthropic-version": "2023-06-01"})
    assert answer.status_code == 200
    [received] = fault_upstream.received
    assert all(received.headers[name] == value for name, value in secrets.items())
    text = (tmp_path / "hdr.capture.jsonl").read_text()
    assert not any(value in text for value in ('"s1"', '"s2"', '"s3"', '"s4"'))
    [(_, line)] = CaptureStore(tmp_path).read("hdr").entries
    assert line["http"]["request_headers"]["anthropic-version"] == "2023-06-01"
    assert not set(secrets) & set(line["http"]["request_headers"])
