"""The real local model (Gemma 3 270M on llama.cpp) behind `llmtap serve`, and llama.cpp's own app
wrapped in the capture middleware in-process: real SDK calls, correct records, nothing invented."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any, Iterator

import httpx
import openai
import pytest

from llmtap.demo.localmodel import LocalModelServer
from llmtap.store import CaptureStore
from llmtap.store.readers import read_model_call_records
from tests.e2e.serve_harness import serving
from tests.support.servers import ServerThread

pytestmark = pytest.mark.slow

ASK = {"model": "gemma", "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8}


@pytest.fixture
def proxied(local_model: LocalModelServer, tmp_path: Path) -> Iterator[tuple[str, CaptureStore]]:
    with serving(local_model.base_url, tmp_path) as (server, _):
        yield server.base_url, CaptureStore(tmp_path)


def test_sync_call_is_recorded_with_usage_and_finish(proxied: tuple[str, CaptureStore]) -> None:
    base, store = proxied
    with openai.OpenAI(base_url=f"{base}/ng-rollout/m-sync/v1", api_key="unused", max_retries=0) as client:
        completion = client.chat.completions.create(**ASK)
    [record] = read_model_call_records(store, "m-sync")
    assert record.response_id == completion.id
    assert record.tokens_in == completion.usage.prompt_tokens and record.tokens_out == completion.usage.completion_tokens
    assert record.finish_reason == completion.choices[0].finish_reason
    assert record.latency_total_ms is not None and record.latency_total_ms > 0


def test_stream_without_usage_records_null_usage_never_zero(proxied: tuple[str, CaptureStore]) -> None:
    base, store = proxied
    with openai.OpenAI(base_url=f"{base}/ng-rollout/m-stream/v1", api_key="unused", max_retries=0) as client:
        chunks = list(client.chat.completions.create(**ASK, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    [record] = read_model_call_records(store, "m-stream")
    assert record.stream and not record.stream_truncated and record.error_category is None
    assert record.tokens_in is None and record.tokens_out is None and record.tokens_total is None
    assert record.response is not None
    assert record.response["choices"][0]["message"]["content"] == text
    assert record.latency_ttft_ms is not None and record.latency_ttft_ms <= record.latency_total_ms  # type: ignore[operator]


def test_async_calls_of_two_rollouts_do_not_mix(proxied: tuple[str, CaptureStore]) -> None:
    base, store = proxied

    async def call(rollout: str) -> str:
        async with openai.AsyncOpenAI(base_url=f"{base}/ng-rollout/{rollout}/v1", api_key="u", max_retries=0) as client:
            completion = await client.chat.completions.create(**ASK)
            return completion.id

    async def both() -> list[str]:
        return list(await asyncio.gather(call("m-a"), call("m-b"), call("m-a")))

    ids = asyncio.run(both())
    assert sorted(r.response_id for r in read_model_call_records(store, "m-a")) == sorted([ids[0], ids[2]])
    assert [r.response_id for r in read_model_call_records(store, "m-b")] == [ids[1]]


def test_client_bytes_equal_the_direct_call_shape(local_model: LocalModelServer, proxied: tuple[str, CaptureStore]) -> None:
    base, store = proxied
    body: dict[str, Any] = {**ASK, "stream": True}
    with httpx.Client(trust_env=False, timeout=60) as http:
        proxied_response = http.post(f"{base}/ng-rollout/m-bytes/v1/chat/completions", json=body)
    [record] = read_model_call_records(store, "m-bytes")
    assert record.response_raw == proxied_response.text  # what the client got is what was recorded
    assert proxied_response.text.rstrip().endswith("data: [DONE]")


def _load_example() -> Any:
    path = Path(__file__).resolve().parents[2] / "examples" / "wrap_llama_cpp.py"
    spec = importlib.util.spec_from_file_location("wrap_llama_cpp", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_llama_cpp_app_wrapped_in_process_captures_the_same_way(local_model: LocalModelServer, tmp_path: Path) -> None:
    app = _load_example().build_app(str(local_model.model_path), str(tmp_path))
    server = ServerThread(app, lifespan="on")
    with server.start():
        with openai.OpenAI(base_url=f"{server.base_url}/ng-rollout/inproc/v1", api_key="u", max_retries=0) as client:
            completion = client.chat.completions.create(**ASK)
            streamed = list(client.chat.completions.create(**ASK, stream=True))
    records = read_model_call_records(CaptureStore(tmp_path), "inproc")
    assert [r.stream for r in records] == [False, True]
    assert records[0].response_id == completion.id and records[0].tokens_out == completion.usage.completion_tokens
    assert records[1].response_id == streamed[0].id and not records[1].stream_truncated
    assert all(r.model_ref == {"type": "responses_api_models", "name": "policy_model"} for r in records)
