"""Decompression bombs from an upstream: `llmtap serve` forwards them untouched, records the raw
bytes with a gap saying why they were not decoded, and never decodes past its limit or on its loop."""

from __future__ import annotations

import threading
import tracemalloc
from pathlib import Path
from typing import Any

import httpx
import pytest

import llmtap.server.record_commit as record_commit_module
from llmtap.records import decode_raw_field
from llmtap.store import CaptureStore
from tests.e2e.serve_harness import serving
from tests.support.faults import FaultUpstream, bomb

CHAT = {"model": "gpt-4", "messages": [{"role": "user", "content": "Say this is a test"}]}
LIMIT = 4 * 1024 * 1024
BOMB_MIB = 128  # decodes to 32 times the limit


def _raw_lines(capture_dir: Path, rollout_id: str) -> list[dict[str, Any]]:
    return [line for _, line in CaptureStore(capture_dir).read(rollout_id).entries]


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
def test_a_bomb_is_forwarded_whole_and_recorded_raw_within_bounded_memory(
    coding: str, fault_upstream: FaultUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compressed = bomb(coding, BOMB_MIB)  # built before measuring
    builders: list[tuple[str, int]] = []
    build = record_commit_module.raw_line_from_exchange

    def spied_build(*args: Any, **kwargs: Any) -> dict[str, Any]:
        builders.append((threading.current_thread().name, kwargs["max_decoded_bytes"]))
        return build(*args, **kwargs)

    monkeypatch.setattr(record_commit_module, "raw_line_from_exchange", spied_build)
    with serving(fault_upstream.base_url, tmp_path, max_decoded_body_bytes=LIMIT) as (server, health):
        tracemalloc.start()
        try:
            with httpx.Client(trust_env=False, timeout=30) as http, http.stream(
                "POST", f"{server.base_url}/ng-rollout/bomb-{coding}/v1/chat/completions", json=CHAT,
                headers={"x-fault": f"bomb-{coding}-{BOMB_MIB}"},
            ) as response:
                forwarded = b"".join(response.iter_raw())  # undecoded, as the upstream sent it
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert response.status_code == 200 and response.headers["content-encoding"] == coding
    assert forwarded == compressed
    [line] = _raw_lines(tmp_path, f"bomb-{coding}")
    assert decode_raw_field(line, "response_raw") == compressed
    assert line["response"] is None and line["error_category"] == "capture_parse_error"
    assert line["response_decoding"] == {
        "content_encoding": coding, "decoded": False, "reason": "decoded_size_limit", "limit_bytes": LIMIT,
    }
    # Decoding stopped just past the limit: nowhere near the 128 MiB the body inflates to.
    assert peak < 3 * LIMIT + 4 * 1024 * 1024, f"peak {peak} bytes"
    # The loop decodes a compressed body only a little way (a MiB); the full attempt, up to the
    # limit, runs on a record-builder thread, never on the event loop that serves the other calls.
    on_loop = [limit for name, limit in builders if not name.startswith("llmtap-record")]
    off_loop = [limit for name, limit in builders if name.startswith("llmtap-record")]
    assert off_loop == [LIMIT] and all(limit <= 1024 * 1024 for limit in on_loop)
    assert health.snapshot()["records_written"] == 1


def test_other_rollouts_stream_on_while_bombs_are_recorded(fault_upstream: FaultUpstream, tmp_path: Path) -> None:
    for coding in ("gzip", "zstd"):
        bomb(coding, BOMB_MIB)
    results: dict[str, bytes] = {}

    def call(url: str, name: str, fault: str, body: dict[str, Any]) -> None:
        with httpx.Client(trust_env=False, timeout=60) as http, http.stream(
            "POST", url, json=body, headers={"x-fault": fault}
        ) as response:
            results[name] = b"".join(response.iter_raw())

    with serving(fault_upstream.base_url, tmp_path, max_decoded_body_bytes=LIMIT) as (server, _):
        base = f"{server.base_url}/ng-rollout"
        threads = [
            threading.Thread(target=call, args=(f"{base}/calm/v1/chat/completions", "calm", "stall-between-0.02",
                                                {**CHAT, "stream": True})),
            *[threading.Thread(target=call, args=(f"{base}/bomb-{c}/v1/chat/completions", c, f"bomb-{c}-{BOMB_MIB}", CHAT))
              for c in ("gzip", "zstd")],
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert results["calm"].endswith(b"data: [DONE]\n\n")
    [calm] = _raw_lines(tmp_path, "calm")
    assert calm["stream"] is True and calm["stream_truncated"] is False and calm["error_category"] is None
    for coding in ("gzip", "zstd"):
        [line] = _raw_lines(tmp_path, f"bomb-{coding}")
        assert line["response_decoding"]["reason"] == "decoded_size_limit"


def test_a_compressed_body_under_the_limit_is_decoded_for_the_record(fault_upstream: FaultUpstream, tmp_path: Path) -> None:
    with serving(fault_upstream.base_url, tmp_path, max_decoded_body_bytes=LIMIT) as (server, _):
        with httpx.Client(trust_env=False, timeout=30) as http, http.stream(
            "POST", f"{server.base_url}/ng-rollout/small/v1/chat/completions", json=CHAT,
            headers={"x-fault": "bomb-gzip-2"},
        ) as response:
            forwarded = b"".join(response.iter_raw())
    assert forwarded == bomb("gzip", 2)
    [line] = _raw_lines(tmp_path, "small")
    # Zeros are no JSON: the decoded bytes are what the record keeps, with no decoding gap.
    assert "response_decoding" not in line
    assert decode_raw_field(line, "response_raw") == bytes(2 * 1024 * 1024)
