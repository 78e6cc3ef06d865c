"""`llmtap serve` holds a stream from the chunk that completes the answer until the record is
durable (principle 2): a client that has the answer has its call on disk, even while the upstream
has not yet sent the stream's end."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from llmtap.store import CaptureStore
from tests.e2e.serve_harness import serving
from tests.support.faults import FAULT_FIXTURE_HEADER, FaultUpstream

CHAT = {"model": "gpt-4", "stream": True, "messages": [{"role": "user", "content": "Say this is a test"}]}
MESSAGES = {"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}


@pytest.mark.parametrize(
    ("path", "body", "fixture_id", "answer_marker"),
    [
        ("/v1/chat/completions", CHAT, "chat/text-stream-include-usage-gpt4", b'"finish_reason":"stop"'),
        ("/v1/messages", MESSAGES, "messages/text-stream-sonnet45", b'"stop_reason":"end_turn"'),
    ],
)
def test_the_chunk_completing_the_answer_reaches_the_client_only_once_the_record_is_on_disk(
    fault_upstream: FaultUpstream, tmp_path: Path, path: str, body: dict[str, object], fixture_id: str,
    answer_marker: bytes,
) -> None:
    store = CaptureStore(tmp_path)
    rollout = "hold-" + path.rsplit("/", 1)[-1]
    records_when_first_chunk = records_when_answered = None
    received = b""
    # The upstream pauses between events (so none share a chunk): when the answer is complete, the
    # stream's end has not been sent yet, so no record can be durable before the pause is over.
    with serving(fault_upstream.base_url, tmp_path) as (server, _), httpx.Client(trust_env=False, timeout=30) as http:
        with http.stream(
            "POST", f"{server.base_url}/ng-rollout/{rollout}{path}", json=body,
            headers={"x-fault": "stall-between-0.15", FAULT_FIXTURE_HEADER: fixture_id},
        ) as response:
            for chunk in response.iter_raw():
                received += chunk
                on_disk = len(store.read(rollout).entries)
                if records_when_first_chunk is None:
                    records_when_first_chunk = on_disk
                if records_when_answered is None and answer_marker in received:
                    records_when_answered = on_disk
    assert response.status_code == 200
    assert records_when_first_chunk == 0, "chunks before the answer flow at once, before any record"
    assert records_when_answered == 1, "the answer arrived before its record was durable"
    [(_, line)] = store.read(rollout).entries
    assert line["stream"] is True and line["stream_truncated"] is False and line["error_category"] is None
    assert line["response_raw"].encode() == received  # usage and the end marker are in the record too
