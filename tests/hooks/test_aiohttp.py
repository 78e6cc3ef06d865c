"""aiohttp client sessions, whole and streamed, through the shared suite; aiohttp's own cases."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Mapping
from typing import Any

import aiohttp

from llmtap.hooks.session import CaptureSession
from tests.fixtures import fixture
from tests.hooks.conftest import recorded_lines
from tests.hooks.suite import HookSuite, Reply, StreamedHookSuite, reply, run

JSON_FIXTURE = fixture("responses/text-basic-gpt55")
STREAM_FIXTURE = fixture("responses/text-basic-stream-gpt55")


# --- the shared suite, one class per call style ------------------------------------------------


class TestAiohttpClientSession(HookSuite):
    """`async with session.post(...)`, the body read with `read()`."""

    library = "aiohttp"
    connection_error = "ClientConnectorError"
    recording = JSON_FIXTURE.id

    def perform(self, url: str, request_json: Any, headers: Mapping[str, str]) -> Reply:
        async def post() -> Reply:
            async with (
                self.lib.ClientSession() as session,
                session.post(url, json=request_json, headers=dict(headers)) as response,
            ):
                return reply(response.status, await response.read(), response.headers)

        return run(post())


class TestAiohttpClientSessionStream(StreamedHookSuite):
    """`async for line in response.content`: the body read line by line as it arrives."""

    library = "aiohttp"
    connection_error = "ClientConnectorError"
    recording = STREAM_FIXTURE.id
    stream_output_tokens = 5
    first_piece_end = frozenset({"release"})
    unread_end = frozenset({"close"})
    stream_break_errors = frozenset({"ClientPayloadError"})

    def assert_recorded_whole(self, line: dict[str, Any], session: CaptureSession) -> None:
        super().assert_recorded_whole(line, session)
        assert line["response"]["status"] == "completed"

    def perform(self, url: str, request_json: Any, headers: Mapping[str, str]) -> Reply:
        async def stream() -> Reply:
            async with (
                self.lib.ClientSession() as session,
                session.post(url, json=request_json, headers=dict(headers)) as response,
            ):
                return reply(response.status, b"".join([line async for line in response.content]), response.headers)

        return run(stream())

    def perform_and_stop_after_first_piece(self, url: str, request_json: Any, headers: Mapping[str, str]) -> bytes:
        async def first_piece() -> bytes:
            async with self.lib.ClientSession() as session:
                response = await session.post(url, json=request_json, headers=dict(headers))
                piece = bytes(await response.content.readline())
                response.release()
                return piece

        return run(first_piece())

    def perform_and_close_unread(self, url: str, request_json: Any, headers: Mapping[str, str]) -> int:
        async def close_unread() -> int:
            async with self.lib.ClientSession() as session:
                response = await session.post(url, json=request_json, headers=dict(headers))
                response.close()
                return int(response.status)

        return run(close_unread())


# --- aiohttp's own cases -----------------------------------------------------------------------


def _url(upstream: Any) -> str:
    return str(upstream.base_url) + "/v1/responses"


async def test_a_response_dropped_without_release_is_recorded_once_it_is_collected(
    capture_session: CaptureSession, replay_upstream: Any
) -> None:
    async with aiohttp.ClientSession() as session:
        response = await session.post(_url(replay_upstream), json=JSON_FIXTURE.request_json)
        assert response.status == 200
        del response
        gc.collect()
    for _ in range(100):  # the closed connection is processed on a later loop turn, then collected
        gc.collect()
        if recorded_lines(capture_session):
            break
        await asyncio.sleep(0.02)
    lines = recorded_lines(capture_session)
    assert len(lines) == 1, capture_session.health.snapshot()
    assert lines[0]["status_code"] == 200
