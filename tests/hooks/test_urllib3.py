"""urllib3: PoolManager requests, preloaded and streamed, through the shared suite; its own cases."""

from __future__ import annotations

import gc
import json
import weakref
from collections.abc import Mapping
from typing import Any

import orjson
import urllib3

from llmtap.hooks.session import CaptureSession
from tests.fixtures import fixture
from tests.hooks.conftest import recorded_lines
from tests.hooks.suite import HookSuite, Reply, StreamedHookSuite, reply

JSON_FIXTURE = fixture("messages/text-basic-sonnet4")
STREAM_FIXTURE = fixture("messages/text-stream-sonnet45")


def _json_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {**headers, "content-type": "application/json"}


# --- the shared suite, one class per call style ------------------------------------------------


class TestUrllib3PoolManager(HookSuite):
    """`PoolManager.request`, the body preloaded before it returns (urllib3's default)."""

    library = "urllib3"
    connection_error = "exceptions.MaxRetryError"  # urllib3 retries a refused connection, then gives up with this
    recording = JSON_FIXTURE.id
    lower_layers = ("http.client",)

    def perform(self, url: str, request_json: Any, headers: Mapping[str, str]) -> Reply:
        with self.lib.PoolManager() as pool:
            response = pool.request("POST", url, body=orjson.dumps(request_json), headers=_json_headers(headers))
        return reply(response.status, response.data, response.headers)


class TestUrllib3PoolManagerStream(StreamedHookSuite):
    """`PoolManager.request(preload_content=False)`, the body read with `stream()`."""

    library = "urllib3"
    connection_error = "exceptions.MaxRetryError"
    recording = STREAM_FIXTURE.id
    lower_layers = ("http.client",)
    stream_output_tokens = 10
    first_piece_end = frozenset({"release_conn"})
    unread_end = frozenset({"release_conn"})
    stream_break_errors = frozenset({"ProtocolError"})

    def _open(self, pool: Any, url: str, request_json: Any, headers: Mapping[str, str]) -> Any:
        body = orjson.dumps(request_json)
        return pool.request("POST", url, body=body, headers=_json_headers(headers), preload_content=False)

    def perform(self, url: str, request_json: Any, headers: Mapping[str, str]) -> Reply:
        with self.lib.PoolManager() as pool:
            response = self._open(pool, url, request_json, headers)
            try:
                body = b"".join(response.stream(100))
            finally:
                response.release_conn()  # also after a reset: the pool then closes the broken connection
        return reply(response.status, body, response.headers)

    def perform_and_stop_after_first_piece(self, url: str, request_json: Any, headers: Mapping[str, str]) -> bytes:
        with self.lib.PoolManager() as pool:
            response = self._open(pool, url, request_json, headers)
            chunks = response.stream(100)
            piece = bytes(next(chunks))
            response.release_conn()
            return piece

    def perform_and_close_unread(self, url: str, request_json: Any, headers: Mapping[str, str]) -> int:
        with self.lib.PoolManager() as pool:
            response = self._open(pool, url, request_json, headers)
            response.release_conn()
            return int(response.status)


# --- urllib3's own cases -----------------------------------------------------------------------


def _url(upstream: Any) -> str:
    return str(upstream.base_url) + "/v1/messages"


def test_urllib3_read_in_pieces_as_botocore_does_is_recorded_whole(capture_session: CaptureSession, replay_upstream: Any) -> None:
    with urllib3.PoolManager() as pool:
        response = pool.urlopen(
            "POST",
            _url(replay_upstream),
            body=json.dumps(JSON_FIXTURE.request_json).encode(),
            preload_content=False,
            decode_content=False,
        )
        pieces = []
        while piece := response.read(97):
            pieces.append(piece)
    assert b"".join(pieces) == JSON_FIXTURE.body_bytes
    [line] = recorded_lines(capture_session)
    assert line["response"] == orjson.loads(JSON_FIXTURE.body_bytes)


def test_a_teed_response_released_unread_is_freed_without_waiting_for_the_collector(
    capture_session: CaptureSession, replay_upstream: Any
) -> None:
    # A response kept alive by a cycle through the tee's wrappers is freed only by a collection,
    # which may finalize its socket before the file object closes it (ResourceWarning, fd held).
    gc.disable()
    try:
        with urllib3.PoolManager() as pool:
            body = json.dumps(STREAM_FIXTURE.request_json).encode()
            response = pool.request("POST", _url(replay_upstream), body=body, preload_content=False)
            freed = weakref.ref(response)
            response.release_conn()
            del response
            assert freed() is None
    finally:
        gc.enable()
    [line] = recorded_lines(capture_session)
    assert line["capture"]["end"] == "release_conn" and line["stream_truncated"] is True
