"""`llmtap serve` in front of a failing upstream: the client sees what the upstream did, and every
call leaves a record (or a counted, marked failure)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest

from llmtap.records import ModelCallRecord
from llmtap.store import CaptureStore
from llmtap.store.readers import read_rollout_calls
from tests.e2e.serve_harness import serving
from tests.support.faults import SET_COOKIE, FaultUpstream, refused_port

CHAT = {"model": "gpt-4", "messages": [{"role": "user", "content": "Say this is a test"}]}


def wait_for_records(store: CaptureStore, rollout_id: str, count: int = 1, timeout: float = 10.0) -> list[ModelCallRecord]:
    """Poll for records written after the client already gave up (no durability promise to a gone client)."""
    deadline = time.monotonic() + timeout
    while True:
        records = read_rollout_calls(store, rollout_id).records
        if len(records) >= count or time.monotonic() > deadline:
            return records
        time.sleep(0.02)


def client(base: str, rollout: str, **options: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/ng-rollout/{rollout}/v1", api_key="sk-test", max_retries=0, **options)  # type: ignore[arg-type]


def test_refused_upstream_is_a_502_recorded_as_connection(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    with serving(f"http://127.0.0.1:{refused_port()}", tmp_path) as (server, _):
        with client(server.base_url, "refused") as sdk, pytest.raises(openai.APIStatusError) as raised:
            sdk.chat.completions.create(**CHAT)
    assert raised.value.status_code == 502
    [record] = read_rollout_calls(store, "refused").records
    assert record.status_code == 502 and record.error_category == "connection"


def test_upstream_500_reaches_the_client_unchanged_and_is_recorded(fault_upstream: FaultUpstream, tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    with serving(fault_upstream.url("status-500"), tmp_path) as (server, _):
        with httpx.Client(trust_env=False) as http:
            direct = http.post(fault_upstream.url("status-500") + "/v1/chat/completions", json=CHAT)
            proxied = http.post(f"{server.base_url}/ng-rollout/e500/v1/chat/completions", json=CHAT)
    assert proxied.status_code == direct.status_code == 500
    assert proxied.content == direct.content
    [record] = read_rollout_calls(store, "e500").records
    assert record.error_category == "upstream_error"
    assert record.error == direct.json()["error"]


@pytest.mark.parametrize("fault", ["reset-after-3", "close-after-3"])
def test_upstream_dying_mid_stream_breaks_the_client_stream_and_is_recorded(
    fault_upstream: FaultUpstream, tmp_path: Path, fault: str
) -> None:
    store = CaptureStore(tmp_path)
    received = []
    with serving(fault_upstream.url(fault), tmp_path) as (server, _):
        with client(server.base_url, "cut") as sdk, pytest.raises(openai.APIError):
            for chunk in sdk.chat.completions.create(**CHAT, stream=True):
                received.append(chunk)
        [record] = wait_for_records(store, "cut")
    assert received, "the chunks before the failure reach the client"
    assert record.status_code == 200 and record.stream_truncated
    assert record.error_category == "connection"
    assert record.response_raw  # the partial stream is kept


def test_stall_past_the_client_timeout_is_recorded_cancelled(fault_upstream: FaultUpstream, tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    with serving(fault_upstream.url("stall-first-3"), tmp_path) as (server, _):
        with client(server.base_url, "stall", timeout=0.5) as sdk, pytest.raises(openai.APITimeoutError):
            sdk.chat.completions.create(**CHAT)
        [record] = wait_for_records(store, "stall")
    assert record.error_category == "cancelled" and record.status_code is None


def test_client_disconnect_mid_stream_is_recorded_cancelled_with_partial(
    fault_upstream: FaultUpstream, tmp_path: Path
) -> None:
    store = CaptureStore(tmp_path)
    with serving(fault_upstream.url("stall-between-0.3"), tmp_path) as (server, _):
        with httpx.Client(trust_env=False) as http:
            url = f"{server.base_url}/ng-rollout/gone/v1/chat/completions"
            with http.stream("POST", url, json={**CHAT, "stream": True}) as response:
                first = next(response.iter_raw())
        [record] = wait_for_records(store, "gone")
    assert first
    assert record.error_category == "cancelled" and record.stream_truncated
    assert record.response_raw is not None and record.response_raw.encode().startswith(first[:20])


def test_stream_without_terminal_is_passed_through_and_recorded_truncated(
    fault_upstream: FaultUpstream, tmp_path: Path
) -> None:
    store = CaptureStore(tmp_path)
    with serving(fault_upstream.url("no-terminal"), tmp_path) as (server, _):
        with httpx.Client(trust_env=False) as http:
            direct = http.post(fault_upstream.url("no-terminal") + "/v1/chat/completions", json={**CHAT, "stream": True})
            proxied = http.post(f"{server.base_url}/ng-rollout/nt/v1/chat/completions", json={**CHAT, "stream": True})
    assert proxied.content == direct.content
    [record] = read_rollout_calls(store, "nt").records
    assert record.error_category == "stream_truncated" and record.response is not None
    # chat/text-stream-no-usage-gpt4 without its `[DONE]`: every delta arrived, so the partial holds them all.
    assert record.response["id"] == "chatcmpl-ASYMZbRqo8Bkz53FVzaTj7W7feOn4"
    assert record.response["choices"][0]["message"]["content"] == "This is a test."


def test_non_json_success_is_recorded_as_parse_error(fault_upstream: FaultUpstream, tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    with serving(fault_upstream.url("not-json"), tmp_path) as (server, _):
        with httpx.Client(trust_env=False) as http:
            proxied = http.post(f"{server.base_url}/ng-rollout/nj/v1/chat/completions", json=CHAT)
    assert proxied.status_code == 200
    [record] = read_rollout_calls(store, "nj").records
    assert record.error_category == "capture_parse_error" and record.response_raw == proxied.text


def test_unwritable_capture_is_counted_marked_and_invisible_to_the_client(
    fault_upstream: FaultUpstream, tmp_path: Path
) -> None:
    store = CaptureStore(tmp_path)
    store.path_for("blocked").mkdir()  # the data file's place is taken: every append fails
    with serving(fault_upstream.url("ok"), tmp_path) as (server, health):
        with client(server.base_url, "blocked") as sdk:
            completion = sdk.chat.completions.create(**CHAT)
    assert completion.choices[0].message.content
    assert health.snapshot()["record_write_failed"] == 1
    assert store.marker_path_for("blocked").exists()


def test_a_cookie_the_upstream_sets_goes_to_its_client_and_never_to_the_next_caller(
    fault_upstream: FaultUpstream, tmp_path: Path
) -> None:
    """The proxy's upstream pool is shared by every client: it must not keep cookies between calls.

    The upstream is named by host name: a cookie jar drops cookies of bare IP addresses anyway.
    """
    upstream = fault_upstream.url("set-cookie").replace("://127.0.0.1:", "://localhost:")
    with serving(upstream, tmp_path) as (server, _):
        with httpx.Client(trust_env=False) as first, httpx.Client(trust_env=False) as second:
            answered = first.post(f"{server.base_url}/ng-rollout/cookie-a/v1/chat/completions", json=CHAT)
            second.post(f"{server.base_url}/ng-rollout/cookie-b/v1/chat/completions", json=CHAT)
    assert answered.status_code == 200 and answered.headers["set-cookie"] == SET_COOKIE
    assert [request.headers.get("cookie") for request in fault_upstream.received] == [None, None]


def test_the_upstream_gets_the_path_and_query_exactly_as_the_client_encoded_them(
    fault_upstream: FaultUpstream, tmp_path: Path
) -> None:
    """Nothing is decoded or re-encoded on the way: an encoded slash in a deployment name stays one
    segment, `%7E` and `%2C` stay as sent. (The deployment path is no dialect path: forwarded, not captured.)"""
    targets = [
        "/v1/chat/completions?api-version=2024-02-01&tags=a%2Cb&q=x+y",
        "/v1/deployments/team%2Fgpt%7E4/chat/completions?api-version=2024-02-01",
    ]
    store = CaptureStore(tmp_path)
    with serving(fault_upstream.url("ok"), tmp_path) as (server, _):
        with httpx.Client(trust_env=False) as http:
            answers = [http.post(f"{server.base_url}/ng-rollout/encoded{target}", json=CHAT) for target in targets]
    assert [answer.status_code for answer in answers] == [200, 200]
    assert [request.path for request in fault_upstream.received] == ["/fault/ok" + target for target in targets]
    [record] = read_rollout_calls(store, "encoded").records
    assert record.status_code == 200


def test_a_client_expecting_100_continue_is_answered_by_the_proxy_not_stalled(
    fault_upstream: FaultUpstream, tmp_path: Path
) -> None:
    """curl and others send `Expect: 100-continue` with large bodies. The proxy has the body once
    uvicorn answered it; forwarding the header made the upstream client wait for a 100 the
    upstream never sent, until the client timed out."""
    large = {**CHAT, "messages": [{"role": "user", "content": "x" * 4096}]}
    with serving(fault_upstream.url("ok"), tmp_path) as (server, _):
        with httpx.Client(trust_env=False, timeout=10) as http:
            answered = http.post(
                f"{server.base_url}/ng-rollout/expect/v1/chat/completions", json=large, headers={"expect": "100-continue"}
            )
    assert answered.status_code == 200
    assert [request.headers.get("expect") for request in fault_upstream.received] == [None]


def test_a_pooled_connection_the_upstream_dropped_while_idle_is_retried_not_a_502(
    fault_upstream: FaultUpstream, tmp_path: Path
) -> None:
    """uvicorn (vLLM, llama.cpp's server) closes idle connections after 5 s. A call sent just as
    that happens meets a reset before any answer: the request never ran, so the proxy sends it
    again on a new connection instead of answering 502."""
    store = CaptureStore(tmp_path)
    with serving(fault_upstream.url("stale-keep-alive"), tmp_path) as (server, _):
        with httpx.Client(trust_env=False, timeout=10) as http:
            answers = [http.post(f"{server.base_url}/ng-rollout/stale/v1/chat/completions", json=CHAT) for _ in range(2)]
    assert [answer.status_code for answer in answers] == [200, 200]
    assert len(fault_upstream.received) == 3  # the second call reached the dropped connection, then a new one
    records = read_rollout_calls(store, "stale").records
    assert [record.status_code for record in records] == [200, 200] and all(r.error_category is None for r in records)
