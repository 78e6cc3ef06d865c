"""httpx and httpx2 clients: every call style through the shared suite, and httpx's own edge cases."""

from __future__ import annotations

import gc
import importlib
from collections.abc import Mapping
from typing import Any

import orjson
import pytest

from llmtap.hooks.session import CaptureSession
from tests.fixtures import fixture
from tests.hooks.conftest import recorded_lines
from tests.hooks.suite import HookSuite, Reply, StreamedHookSuite, reply, run

JSON_FIXTURE = fixture("chat/text-basic-gpt4o")
STREAM_FIXTURE = fixture("chat/text-stream-include-usage-gpt4")
LIBRARIES = ["httpx", "httpx2"]


# --- the shared suite, one class per call style ------------------------------------------------


class TestHttpxClient(HookSuite):
    """`Client.post`: the whole body read before it returns."""

    library = "httpx"
    connection_error = "ConnectError"

    def perform(self, url: str, request_json: Any, headers: Mapping[str, str]) -> Reply:
        with self.lib.Client() as client:
            response = client.post(url, json=request_json, headers=dict(headers))
        return reply(response.status_code, response.content, response.headers)


class TestHttpxTopLevelPost(HookSuite):
    """The module-level `httpx.post`, which builds a client for the one call."""

    library = "httpx"
    connection_error = "ConnectError"

    def perform(self, url: str, request_json: Any, headers: Mapping[str, str]) -> Reply:
        response = self.lib.post(url, json=request_json, headers=dict(headers))
        return reply(response.status_code, response.content, response.headers)


class TestHttpxClientStream(StreamedHookSuite):
    """`Client.stream`, the body read piece by piece."""

    library = "httpx"
    connection_error = "ConnectError"
    first_piece_end = frozenset({"closed"})
    unread_end = frozenset({"closed"})
    stream_break_errors = frozenset({"RemoteProtocolError", "ReadError"})

    def perform(self, url: str, request_json: Any, headers: Mapping[str, str]) -> Reply:
        with (
            self.lib.Client() as client,
            client.stream("POST", url, json=request_json, headers=dict(headers)) as response,
        ):
            return reply(response.status_code, b"".join(response.iter_bytes()), response.headers)

    def perform_and_stop_after_first_piece(self, url: str, request_json: Any, headers: Mapping[str, str]) -> bytes:
        with (
            self.lib.Client() as client,
            client.stream("POST", url, json=request_json, headers=dict(headers)) as response,
        ):
            chunks = response.iter_raw()  # held, so leaving the block closes the response first
            return bytes(next(chunks))

    def perform_and_close_unread(self, url: str, request_json: Any, headers: Mapping[str, str]) -> int:
        with self.lib.Client() as client:
            request = client.build_request("POST", url, json=request_json, headers=dict(headers))
            response = client.send(request, stream=True)
            response.close()
            return int(response.status_code)


class TestHttpxAsyncClient(HookSuite):
    """`AsyncClient.post`."""

    library = "httpx"
    connection_error = "ConnectError"

    def perform(self, url: str, request_json: Any, headers: Mapping[str, str]) -> Reply:
        async def post() -> Reply:
            async with self.lib.AsyncClient() as client:
                response = await client.post(url, json=request_json, headers=dict(headers))
            return reply(response.status_code, response.content, response.headers)

        return run(post())


class TestHttpxAsyncClientStream(StreamedHookSuite):
    """`AsyncClient.stream`, the body read piece by piece."""

    library = "httpx"
    connection_error = "ConnectError"
    first_piece_end = frozenset({"closed"})
    unread_end = frozenset({"closed"})
    stream_break_errors = frozenset({"RemoteProtocolError", "ReadError"})

    def perform(self, url: str, request_json: Any, headers: Mapping[str, str]) -> Reply:
        async def stream() -> Reply:
            async with (
                self.lib.AsyncClient() as client,
                client.stream("POST", url, json=request_json, headers=dict(headers)) as response,
            ):
                body = b"".join([chunk async for chunk in response.aiter_bytes()])
                return reply(response.status_code, body, response.headers)

        return run(stream())

    def perform_and_stop_after_first_piece(self, url: str, request_json: Any, headers: Mapping[str, str]) -> bytes:
        async def first_piece() -> bytes:
            async with (
                self.lib.AsyncClient() as client,
                client.stream("POST", url, json=request_json, headers=dict(headers)) as response,
            ):
                chunks = response.aiter_raw()  # held, so leaving the block closes the response first
                return bytes(await chunks.__anext__())

        return run(first_piece())

    def perform_and_close_unread(self, url: str, request_json: Any, headers: Mapping[str, str]) -> int:
        async def close_unread() -> int:
            async with self.lib.AsyncClient() as client:
                request = client.build_request("POST", url, json=request_json, headers=dict(headers))
                response = await client.send(request, stream=True)
                await response.aclose()
                return int(response.status_code)

        return run(close_unread())


class TestHttpx2Client(TestHttpxClient):
    library = "httpx2"


class TestHttpx2TopLevelPost(TestHttpxTopLevelPost):
    library = "httpx2"


class TestHttpx2ClientStream(TestHttpxClientStream):
    library = "httpx2"


class TestHttpx2AsyncClient(TestHttpxAsyncClient):
    library = "httpx2"


class TestHttpx2AsyncClientStream(TestHttpxAsyncClientStream):
    library = "httpx2"


# --- httpx's own cases -------------------------------------------------------------------------


@pytest.fixture(params=LIBRARIES)
def lib(request: pytest.FixtureRequest) -> Any:
    return importlib.import_module(request.param)


def _url(replay_upstream: Any) -> str:
    return str(replay_upstream.base_url) + "/v1/chat/completions"


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


def test_a_response_a_mock_transport_built_whole_is_recorded_at_once(lib: Any, capture_session: CaptureSession) -> None:
    def answer(request: Any) -> Any:
        return lib.Response(200, headers={"content-type": "application/json"}, content=JSON_FIXTURE.body_bytes)

    with lib.Client(transport=lib.MockTransport(answer)) as client:
        response = client.post("https://api.openai.com/v1/chat/completions", json=JSON_FIXTURE.request_json)
    assert response.content == JSON_FIXTURE.body_bytes
    [line] = recorded_lines(capture_session)
    assert line["provider"] == "openai" and line["capture"]["end"] == "eof"
    assert line["response"] == orjson.loads(JSON_FIXTURE.body_bytes)
