"""aiohttp client sessions: JSON and streamed bodies recorded once, responses unchanged."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import aiohttp
import orjson
import pytest

from llmtap.hooks.session import CaptureSession
from tests.fixtures import fixture
from tests.hooks.conftest import recorded_lines

JSON_FIXTURE = fixture("responses/text-basic-gpt55")
STREAM_FIXTURE = fixture("responses/text-basic-stream-gpt55")


def _url(upstream: Any) -> str:
    return str(upstream.base_url) + "/v1/responses"


async def test_a_json_call_is_recorded_once(capture_session: CaptureSession, replay_upstream: Any) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(_url(replay_upstream), json=JSON_FIXTURE.request_json) as response:
            body = await response.read()
    assert body == JSON_FIXTURE.body_bytes
    [line] = recorded_lines(capture_session)
    assert line["capture"]["hook"] == "aiohttp"
    assert line["request"] == JSON_FIXTURE.request_json
    assert line["response"] == orjson.loads(JSON_FIXTURE.body_bytes)
    assert line["dialect"] == "responses"


async def test_a_stream_read_line_by_line_is_recorded_whole(capture_session: CaptureSession, replay_upstream: Any) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(_url(replay_upstream), json=STREAM_FIXTURE.request_json) as response:
            lines = [line async for line in response.content]
    assert b"".join(lines) == STREAM_FIXTURE.body_bytes
    [line] = recorded_lines(capture_session)
    assert line["stream"] is True and line["stream_truncated"] is False
    assert line["response"]["status"] == "completed"


async def test_a_response_released_unread_is_recorded_as_truncated(capture_session: CaptureSession, fault_upstream: Any) -> None:
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            fault_upstream.url("stall-between-0.2") + "/v1/responses", json={"stream": True, "model": "m"}
        )
        await response.content.readline()
        response.release()
    [line] = recorded_lines(capture_session)
    assert line["capture"]["end"] == "release"
    assert line["stream_truncated"] is True


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


async def test_other_urls_are_not_recorded_and_errors_are_re_raised(capture_session: CaptureSession, replay_upstream: Any) -> None:
    from tests.support.faults import refused_port

    async with aiohttp.ClientSession() as session:
        async with session.get(replay_upstream.base_url + "/other") as response:
            assert response.status == 404
        with pytest.raises(aiohttp.ClientConnectorError):
            await session.post(f"http://127.0.0.1:{refused_port()}/v1/responses", json={})
    [line] = recorded_lines(capture_session)
    assert line["error_category"] == "connection"
