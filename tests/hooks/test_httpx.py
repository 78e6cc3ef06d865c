"""httpx and httpx2 clients: every model call recorded once, whole, and the response unchanged."""

from __future__ import annotations

import gc
import importlib
from typing import Any

import orjson
import pytest

from llmtap.hooks.session import CaptureSession
from tests.fixtures import fixture
from tests.hooks.conftest import recorded_lines

JSON_FIXTURE = fixture("chat/text-basic-gpt4o")
STREAM_FIXTURE = fixture("chat/text-stream-include-usage-gpt4")
LIBRARIES = ["httpx", "httpx2"]


@pytest.fixture(params=LIBRARIES)
def lib(request: pytest.FixtureRequest) -> Any:
    return importlib.import_module(request.param)


def _url(replay_upstream: Any) -> str:
    return str(replay_upstream.base_url) + "/v1/chat/completions"


def test_a_json_call_is_recorded_once_with_its_response_and_usage(lib: Any, capture_session: CaptureSession, replay_upstream: Any) -> None:
    with lib.Client() as client:
        response = client.post(_url(replay_upstream), json=JSON_FIXTURE.request_json, headers={"authorization": "Bearer sk-secret"})
    assert response.content == JSON_FIXTURE.body_bytes
    [line] = recorded_lines(capture_session)
    assert line["response"] == orjson.loads(JSON_FIXTURE.body_bytes)
    assert line["request"] == JSON_FIXTURE.request_json
    assert line["provider"] == "local" and line["capture"]["hook"] == lib.__name__
    assert line["capture"]["end"] == "eof"
    assert "authorization" not in line["http"]["request_headers"]
    assert line["latency_ttft_ms"] is not None
    assert replay_upstream.request_count == 1


def test_a_stream_is_recorded_when_fully_read(lib: Any, capture_session: CaptureSession, replay_upstream: Any) -> None:
    with lib.Client() as client:
        with client.stream("POST", _url(replay_upstream), json=STREAM_FIXTURE.request_json) as response:
            body = b"".join(response.iter_bytes())
    assert body == STREAM_FIXTURE.body_bytes
    [line] = recorded_lines(capture_session)
    assert line["stream"] is True and line["stream_truncated"] is False
    assert line["response"]["usage"]["completion_tokens"] == 5
    assert line["response_raw"] == STREAM_FIXTURE.body_text


def test_a_stream_closed_early_is_recorded_as_truncated(lib: Any, capture_session: CaptureSession, replay_upstream: Any) -> None:
    with lib.Client() as client:
        with client.stream("POST", _url(replay_upstream), json=STREAM_FIXTURE.request_json) as response:
            chunks = response.iter_raw()
            next(chunks)
    [line] = recorded_lines(capture_session)
    assert line["capture"]["end"] == "closed"
    assert line["stream_truncated"] is True
    assert line["error_category"] == "stream_truncated"


def test_a_stream_never_read_is_recorded_when_collected(lib: Any, capture_session: CaptureSession, replay_upstream: Any) -> None:
    client = lib.Client()
    request = client.build_request("POST", _url(replay_upstream), json=STREAM_FIXTURE.request_json)
    response = client.send(request, stream=True)
    assert response.status_code == 200
    del response
    gc.collect()
    [line] = recorded_lines(capture_session)
    assert line["capture"]["end"] == "collected"
    client.close()


def test_calls_outside_the_registry_pass_through_unrecorded(lib: Any, capture_session: CaptureSession, replay_upstream: Any) -> None:
    with lib.Client() as client:
        response = client.get(replay_upstream.base_url + "/health")
    assert response.status_code == 404
    assert recorded_lines(capture_session) == []


def test_a_failed_connection_raises_the_same_exception_and_is_recorded(lib: Any, capture_session: CaptureSession) -> None:
    from tests.support.faults import refused_port

    with lib.Client() as client:
        with pytest.raises(lib.ConnectError):
            client.post(f"http://127.0.0.1:{refused_port()}/v1/chat/completions", json={"model": "m"})
    [line] = recorded_lines(capture_session)
    assert line["error_category"] == "connection"
    assert line["exception_type"] == "ConnectError"
    assert line["status_code"] is None


def test_a_connection_reset_mid_stream_is_recorded_as_an_error(lib: Any, capture_session: CaptureSession, fault_upstream: Any) -> None:
    with lib.Client() as client:
        with pytest.raises(lib.HTTPError):
            with client.stream("POST", fault_upstream.url("reset-after-2") + "/v1/chat/completions", json={"stream": True}) as response:
                for _ in response.iter_bytes():
                    pass
    [line] = recorded_lines(capture_session)
    assert line["capture"]["end"] == "error"
    assert line["error_category"] in ("connection", "stream_truncated")


async def test_async_json_and_stream_calls_are_recorded_once_each(lib: Any, capture_session: CaptureSession, replay_upstream: Any) -> None:
    async with lib.AsyncClient() as client:
        response = await client.post(_url(replay_upstream), json=JSON_FIXTURE.request_json)
        chunks = []
        async with client.stream("POST", _url(replay_upstream), json=STREAM_FIXTURE.request_json) as streamed:
            async for chunk in streamed.aiter_bytes():
                chunks.append(chunk)
    assert response.json() == orjson.loads(JSON_FIXTURE.body_bytes)
    assert b"".join(chunks) == STREAM_FIXTURE.body_bytes
    lines = recorded_lines(capture_session)
    assert [line.get("stream", False) for line in lines] == [False, True]
    assert all(line["capture"]["end"] == "eof" for line in lines)
    assert replay_upstream.request_count == 2


def test_nothing_is_recorded_after_the_hooks_are_removed(lib: Any, tmp_path: Any, replay_upstream: Any) -> None:
    from llmtap.hooks.install import installed_hooks

    assert lib.__name__ not in installed_hooks()
    with lib.Client() as client:
        response = client.post(_url(replay_upstream), json=JSON_FIXTURE.request_json)
    assert response.status_code == 200
    assert not hasattr(lib.Client.send, "__llmtap_original__")


def test_a_response_a_mock_transport_built_whole_is_recorded_at_once(lib: Any, capture_session: CaptureSession) -> None:
    def answer(request: Any) -> Any:
        return lib.Response(200, headers={"content-type": "application/json"}, content=JSON_FIXTURE.body_bytes)

    with lib.Client(transport=lib.MockTransport(answer)) as client:
        response = client.post("https://api.openai.com/v1/chat/completions", json=JSON_FIXTURE.request_json)
    assert response.content == JSON_FIXTURE.body_bytes
    [line] = recorded_lines(capture_session)
    assert line["provider"] == "openai" and line["capture"]["end"] == "eof"
    assert line["response"] == orjson.loads(JSON_FIXTURE.body_bytes)
