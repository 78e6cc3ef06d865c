"""requests: the top-level functions and Session, whole and streamed, through the shared suite; its own cases."""

from __future__ import annotations

import gzip
from collections.abc import Mapping
from typing import Any

import orjson
import pytest
import requests

from llmtap.hooks.session import CaptureSession
from tests.fixtures import fixture
from tests.hooks.conftest import recorded_lines
from tests.hooks.suite import HookSuite, Reply, StreamedHookSuite, reply

JSON_FIXTURE = fixture("messages/text-basic-sonnet4")
STREAM_FIXTURE = fixture("messages/text-stream-sonnet45")


# --- the shared suite, one class per call style ------------------------------------------------


class TestRequestsPost(HookSuite):
    """The top-level `requests.post`, which makes a Session for the one call; urllib3 below stays silent."""

    library = "requests"
    connection_error = "ConnectionError"
    recording = JSON_FIXTURE.id
    lower_layers = ("urllib3", "http.client")

    def perform(self, url: str, request_json: Any, headers: Mapping[str, str]) -> Reply:
        response = self.lib.post(url, json=request_json, headers=dict(headers), timeout=10)
        return reply(response.status_code, response.content, response.headers)


class TestRequestsSession(HookSuite):
    """`Session.post`, the body sent as bytes the caller serialized."""

    library = "requests"
    connection_error = "ConnectionError"
    recording = JSON_FIXTURE.id
    lower_layers = ("urllib3", "http.client")

    def perform(self, url: str, request_json: Any, headers: Mapping[str, str]) -> Reply:
        with self.lib.Session() as session:
            sent = {**headers, "content-type": "application/json"}
            response = session.post(url, data=orjson.dumps(request_json), headers=sent, timeout=10)
        return reply(response.status_code, response.content, response.headers)


class TestRequestsSessionStream(StreamedHookSuite):
    """`Session.post(stream=True)`, the body read with `iter_content`."""

    library = "requests"
    connection_error = "ConnectionError"
    recording = STREAM_FIXTURE.id
    stream_output_tokens = 10
    lower_layers = ("urllib3", "http.client")
    first_piece_end = frozenset({"close"})  # Response.close closes the raw response first
    unread_end = frozenset({"close"})
    stream_break_errors = frozenset({"ChunkedEncodingError", "ConnectionError"})

    def perform(self, url: str, request_json: Any, headers: Mapping[str, str]) -> Reply:
        with (
            self.lib.Session() as session,
            session.post(url, json=request_json, headers=dict(headers), stream=True, timeout=10) as response,
        ):
            return reply(response.status_code, b"".join(response.iter_content(64)), response.headers)

    def perform_and_stop_after_first_piece(self, url: str, request_json: Any, headers: Mapping[str, str]) -> bytes:
        with self.lib.Session() as session:
            response = session.post(url, json=request_json, headers=dict(headers), stream=True, timeout=10)
            chunks = response.iter_content(64)
            piece = bytes(next(chunks))
            response.close()
            return piece

    def perform_and_close_unread(self, url: str, request_json: Any, headers: Mapping[str, str]) -> int:
        with self.lib.Session() as session:
            response = session.post(url, json=request_json, headers=dict(headers), stream=True, timeout=10)
            response.close()
            return int(response.status_code)


# --- requests' own cases -----------------------------------------------------------------------


def _url(upstream: Any) -> str:
    return str(upstream.base_url) + "/v1/messages"


def test_a_requests_stream_is_recorded_when_its_lines_are_read(capture_session: CaptureSession, replay_upstream: Any) -> None:
    with requests.post(_url(replay_upstream), json=STREAM_FIXTURE.request_json, stream=True) as response:
        lines = list(response.iter_lines())
    assert b"\n".join(lines).strip() == b"\n".join(STREAM_FIXTURE.body_bytes.splitlines()).strip()
    [line] = recorded_lines(capture_session)
    assert line["stream"] is True and line["stream_truncated"] is False
    assert line["response"]["usage"]["output_tokens"] > 0


def test_a_gzip_body_read_decoded_by_requests_is_recorded_decoded(capture_session: CaptureSession, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    payload = gzip.compress(JSON_FIXTURE.body_bytes)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["content-length"]))
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-encoding", "gzip")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        response = requests.post(f"http://127.0.0.1:{server.server_port}/v1/messages", json=JSON_FIXTURE.request_json)
    finally:
        server.shutdown()
        server.server_close()
    assert response.content == JSON_FIXTURE.body_bytes
    [line] = recorded_lines(capture_session)
    assert line["response"] == orjson.loads(JSON_FIXTURE.body_bytes)
    assert "content-encoding" not in line["http"]["response_headers"]
    assert line["capture"]["content_encoding_removed"] == "gzip"
