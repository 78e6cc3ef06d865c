"""`llmtap serve` in front of the replay upstream: real SDKs, exact bytes, one durable record per call.

One suite, many entrances: each client style performs the same recorded call through the proxy
under a rollout prefix; the store must hold exactly one correct record when the call returns.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from pathlib import Path
from typing import Any, Callable, Iterator

import anthropic
import httpx
import openai
import pytest

from llmtap.store import CaptureStore
from llmtap.store.readers import read_model_call_records
from tests.e2e.serve_harness import serving
from tests.fixtures import RecordedExchange, fixture
from tests.support.replay import FIXTURE_HEADER, ReplayUpstream


@pytest.fixture
def proxy(replay_upstream: ReplayUpstream, tmp_path: Path) -> Iterator[tuple[str, CaptureStore]]:
    with serving(replay_upstream.base_url, tmp_path / "calls") as (server, _health):
        yield server.base_url, CaptureStore(tmp_path / "calls")


def _headers(name: str) -> dict[str, str]:
    return {FIXTURE_HEADER: name}


def _openai_kwargs(recorded: RecordedExchange) -> dict[str, Any]:
    return {k: v for k, v in recorded.request_json.items()}


def _stream_kwargs(method: Callable[..., Any], recorded: RecordedExchange) -> dict[str, Any]:
    """Split a recorded request into the parameters `method` takes and `extra_body` for the rest."""
    accepted = set(inspect.signature(method).parameters)
    request = {k: v for k, v in recorded.request_json.items() if k != "stream"}
    kwargs = {k: v for k, v in request.items() if k in accepted}
    extra = {k: v for k, v in request.items() if k not in accepted}
    return {**kwargs, "extra_body": extra} if extra else kwargs


# Each client style: (fixture, function(base_url_with_prefix) -> text or object the client saw).
def openai_chat_sync(base: str, name: str) -> Any:
    with openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0, default_headers=_headers(name)) as client:
        return client.chat.completions.create(**_openai_kwargs(fixture(name))).model_dump()


def openai_chat_stream(base: str, name: str) -> Any:
    with openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0, default_headers=_headers(name)) as client:
        return [chunk.model_dump() for chunk in client.chat.completions.create(**_openai_kwargs(fixture(name)))]


def openai_chat_async_stream(base: str, name: str) -> Any:
    async def go() -> Any:
        async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0,
                                      default_headers=_headers(name)) as client:
            stream = await client.chat.completions.create(**_openai_kwargs(fixture(name)))
            return [chunk.model_dump() async for chunk in stream]

    return asyncio.run(go())


def openai_responses_sync(base: str, name: str) -> Any:
    with openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0, default_headers=_headers(name)) as client:
        return client.responses.create(**_openai_kwargs(fixture(name))).model_dump()


def openai_responses_stream(base: str, name: str) -> Any:
    with openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0, default_headers=_headers(name)) as client:
        return [event.model_dump() for event in client.responses.create(**_openai_kwargs(fixture(name)))]


def openai_responses_async(base: str, name: str) -> Any:
    async def go() -> Any:
        async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0,
                                      default_headers=_headers(name)) as client:
            return (await client.responses.create(**_openai_kwargs(fixture(name)))).model_dump()

    return asyncio.run(go())


def anthropic_sync(base: str, name: str) -> Any:
    with anthropic.Anthropic(base_url=base, api_key="sk-ant-test", max_retries=0, default_headers=_headers(name)) as client:
        return client.messages.create(**fixture(name).request_json).model_dump()


def anthropic_stream(base: str, name: str) -> Any:
    with anthropic.Anthropic(base_url=base, api_key="sk-ant-test", max_retries=0, default_headers=_headers(name)) as client:
        with client.messages.stream(**_stream_kwargs(client.messages.stream, fixture(name))) as stream:
            return stream.get_final_message().model_dump()


def anthropic_async_stream(base: str, name: str) -> Any:
    async def go() -> Any:
        async with anthropic.AsyncAnthropic(base_url=base, api_key="sk-ant-test", max_retries=0,
                                            default_headers=_headers(name)) as client:
            async with client.messages.stream(**_stream_kwargs(client.messages.stream, fixture(name))) as stream:
                return (await stream.get_final_message()).model_dump()

    return asyncio.run(go())


CASES: list[tuple[Callable[[str, str], Any], str]] = [
    (openai_chat_sync, "chat/parallel-tool-calls-gpt41-nano"),
    (openai_chat_stream, "chat/parallel-tool-calls-stream-gpt4o-mini"),
    (openai_chat_async_stream, "chat/text-stream-include-usage-gpt4"),
    (openai_responses_sync, "responses/function-call-gpt55"),
    (openai_responses_stream, "responses/reasoning-summary-function-call-stream-gpt5"),
    (openai_responses_async, "responses/cached-tokens-gpt4o"),
    (anthropic_sync, "messages/tool-use-sonnet4"),
    (anthropic_stream, "messages/thinking-tool-use-stream-sonnet4"),
    (anthropic_async_stream, "messages/text-stream-sonnet45"),
]

# Read off each recorded body by hand: its response id, and the output tokens of its final usage.
RECORDED_ID_AND_TOKENS_OUT: dict[str, tuple[str, int]] = {
    "chat/parallel-tool-calls-gpt41-nano": ("chatcmpl-BWksGmkBZRsvsGK2EVzzmjTI7wn6P", 47),
    "chat/parallel-tool-calls-stream-gpt4o-mini": ("chatcmpl-ASYMdbuQwnGMCODejEnbp2ufs6WgR", 51),
    "chat/text-stream-include-usage-gpt4": ("chatcmpl-ASYMZ4oSykiIFK4lXLReDiKyAjsQl", 5),
    "responses/function-call-gpt55": ("resp_05c01d5dceb461c50169fab1bb5ec08196b7e38f8207aae2dd", 23),
    "responses/reasoning-summary-function-call-stream-gpt5": ("resp_017e85da2ae23b69016a3c12518cc0819da56cbbdd33f128f3", 121),
    "responses/cached-tokens-gpt4o": ("resp_6866ce1f61ec819c93434cbeced9b5550e67800fb44be4fd", 8),
    "messages/tool-use-sonnet4": ("msg_01Pgx1ep9weiiD4acPmkJCeK", 66),
    "messages/thinking-tool-use-stream-sonnet4": ("msg_01KTBB57LAzaSZs8kMNvfnsY", 119),
    "messages/text-stream-sonnet45": ("msg_017A4s3HAsrqf5d2WvBmrpLr", 10),
}


@pytest.mark.parametrize(("perform", "name"), CASES, ids=[f"{p.__name__}-{n.split('/')[1]}" for p, n in CASES])
def test_sdk_call_through_serve_is_recorded_once_and_durably(
    proxy: tuple[str, CaptureStore], replay_upstream: ReplayUpstream, perform: Callable[[str, str], Any], name: str
) -> None:
    base, store = proxy
    perform(f"{base}/ng-rollout/r-{perform.__name__}", name)
    # Read at once: the record must already be on disk when the client's call returns.
    records = read_model_call_records(store, f"r-{perform.__name__}")
    assert len(replay_upstream.received) == 1
    assert len(records) == 1
    record = records[0]
    recorded = fixture(name)
    assert record.status_code == 200 and record.error_category is None
    assert record.model_ref == {"type": "responses_api_models", "name": "policy"}
    assert record.stream == recorded.is_stream and not record.stream_truncated
    if recorded.is_stream:
        assert record.response_raw == recorded.body_text
    else:
        assert record.response == json.loads(recorded.body_text)
    assert (record.response_id, record.tokens_out) == RECORDED_ID_AND_TOKENS_OUT[name]
    if "tool" in name or "function" in name:
        assert record.tool_calls


@pytest.mark.parametrize("name", ["chat/text-stream-include-usage-gpt4", "responses/function-call-stream-gpt55",
                                  "messages/web-search-stream-opus41", "chat/error-404-model-not-found",
                                  "messages/error-400-invalid-request"])
def test_client_receives_exactly_the_upstream_bytes(proxy: tuple[str, CaptureStore], name: str) -> None:
    base, store = proxy
    recorded = fixture(name)
    with httpx.Client(trust_env=False) as client:
        response = client.post(f"{base}/ng-rollout/bytes{recorded.request_path}", json=recorded.request_json,
                               headers=_headers(name))
    assert response.status_code == recorded.status
    assert response.content == recorded.body_bytes
    assert response.headers["content-type"] == recorded.content_type
    [record] = read_model_call_records(store, "bytes")
    assert record.status_code == recorded.status


def test_unprefixed_calls_pass_through_uncaptured(proxy: tuple[str, CaptureStore]) -> None:
    base, store = proxy
    name = "chat/text-basic-gpt4o"
    openai_chat_sync(base, name)
    assert store.rollouts() == []


def test_capture_off_still_strips_the_prefix(replay_upstream: ReplayUpstream) -> None:
    with serving(replay_upstream.base_url, None) as (server, _):
        result = openai_chat_sync(f"{server.base_url}/ng-rollout/x", "chat/text-basic-gpt4o")
    assert result["id"] == json.loads(fixture("chat/text-basic-gpt4o").body_text)["id"]
    assert replay_upstream.received[0].path == "/v1/chat/completions"


def test_concurrent_rollouts_land_in_their_own_files(proxy: tuple[str, CaptureStore]) -> None:
    base, store = proxy
    name = "chat/text-stream-include-usage-gpt4"

    async def one(i: int) -> None:
        async with openai.AsyncOpenAI(base_url=f"{base}/ng-rollout/c-{i % 4}/v1", api_key="k", max_retries=0,
                                      default_headers=_headers(name)) as client:
            stream = await client.chat.completions.create(**fixture(name).request_json)
            async for _ in stream:
                pass

    async def all_of_them() -> None:
        await asyncio.gather(*(one(i) for i in range(24)))

    asyncio.run(all_of_them())
    assert sorted(store.rollouts()) == ["c-0", "c-1", "c-2", "c-3"]
    for rollout in store.rollouts():
        records = read_model_call_records(store, rollout)
        assert len(records) == 6 and all(r.error_category is None for r in records)


def test_configured_key_is_sent_upstream_and_never_stored(
    replay_upstream: ReplayUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMTAP_TEST_UPSTREAM_KEY", "sk-ant-configured-secret")
    name = "messages/text-basic-sonnet4"
    with serving(replay_upstream.base_url, tmp_path,
                 upstream={"api_key_env": "LLMTAP_TEST_UPSTREAM_KEY", "auth": "x-api-key"}) as (server, _):
        anthropic_sync(f"{server.base_url}/ng-rollout/key", name)
    [received] = replay_upstream.received
    assert received.headers["x-api-key"] == "sk-ant-configured-secret"
    stored = CaptureStore(tmp_path).path_for("key").read_text()
    assert "sk-ant-configured-secret" not in stored and "sk-ant-test" not in stored


def test_upstreams_are_chosen_by_dialect(replay_upstream: ReplayUpstream, tmp_path: Path) -> None:
    with serving("http://127.0.0.1:9", tmp_path, upstreams={
        "default": {"base_url": "http://127.0.0.1:9", "model_ref": {"type": "x", "name": "unreachable"}},
        "claude": {"base_url": replay_upstream.base_url, "dialects": ["messages"],
                   "model_ref": {"type": "responses_api_models", "name": "claude"}},
    }) as (server, _):
        anthropic_sync(f"{server.base_url}/ng-rollout/route", "messages/tool-use-sonnet4")
    [record] = read_model_call_records(CaptureStore(tmp_path), "route")
    assert record.status_code == 200 and record.model_ref == {"type": "responses_api_models", "name": "claude"}


def test_two_serve_instances_share_one_capture_directory(replay_upstream: ReplayUpstream, tmp_path: Path) -> None:
    name = "chat/text-stream-include-usage-gpt4"
    with serving(replay_upstream.base_url, tmp_path) as (first, _), serving(replay_upstream.base_url, tmp_path) as (second, _):

        async def one(i: int) -> None:
            base = (first if i % 2 else second).base_url
            async with openai.AsyncOpenAI(base_url=f"{base}/ng-rollout/shared/v1", api_key="k", max_retries=0,
                                          default_headers=_headers(name)) as client:
                async for _ in await client.chat.completions.create(**fixture(name).request_json):
                    pass

        async def all_of_them() -> None:
            await asyncio.gather(*(one(i) for i in range(20)))

        asyncio.run(all_of_them())
    records = read_model_call_records(CaptureStore(tmp_path), "shared")
    assert len(records) == 20 and len({r.model_call_id for r in records}) == 20
    assert [r.call_index for r in records] == list(range(20))
    assert all(r.error_category is None and not r.stream_truncated for r in records)


def test_the_client_gets_the_upstreams_headers_and_no_others_from_the_server_llmtap_runs_on(
    replay_upstream: ReplayUpstream, tmp_path: Path
) -> None:
    """uvicorn would add its own `date` and `server: uvicorn` in front of the upstream's."""
    from llmtap.server.config import load_serve_config
    from llmtap.server.run import uvicorn_config
    from tests.support.servers import ServerThread

    config = load_serve_config(settings={"upstreams": {"default": {"base_url": replay_upstream.base_url}},
                                         "observability_enabled": True, "model_call_capture_dir": str(tmp_path / "calls")})
    recorded = fixture("chat/text-basic-gpt4o")
    request = {"json": recorded.request_json, "headers": _headers("chat/text-basic-gpt4o")}
    with ServerThread(None, config=uvicorn_config(config)) as server:  # type: ignore[arg-type]
        server.start()
        direct = httpx.post(replay_upstream.base_url + "/v1/chat/completions", **request)
        proxied = httpx.post(server.base_url + "/ng-rollout/h/v1/chat/completions", **request)
    hop_by_hop = {"connection", "keep-alive", "transfer-encoding"}

    def names(response: httpx.Response) -> list[str]:
        return sorted(name.decode().lower() for name, _ in response.headers.raw if name.decode().lower() not in hop_by_hop)

    assert proxied.content == direct.content
    assert names(proxied) == names(direct)
    assert {k: v for k, v in proxied.headers.items() if k != "date"} == {k: v for k, v in direct.headers.items() if k != "date"}
