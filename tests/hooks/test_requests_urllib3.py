"""requests and urllib3: one record per call whatever the stack, whole bodies, unchanged responses."""

from __future__ import annotations

import gzip
import json
from typing import Any

import orjson
import pytest
import requests
import urllib3

from llmtap.hooks.session import CaptureSession
from tests.fixtures import fixture
from tests.hooks.conftest import recorded_lines

JSON_FIXTURE = fixture("messages/text-basic-sonnet4")
STREAM_FIXTURE = fixture("messages/text-stream-sonnet45")


def _url(upstream: Any) -> str:
    return str(upstream.base_url) + "/v1/messages"


def test_requests_post_is_recorded_once_not_again_by_urllib3(capture_session: CaptureSession, replay_upstream: Any) -> None:
    response = requests.post(_url(replay_upstream), json=JSON_FIXTURE.request_json, headers={"x-api-key": "sk-ant-secret"})
    assert response.content == JSON_FIXTURE.body_bytes
    [line] = recorded_lines(capture_session)
    assert line["capture"]["hook"] == "requests"
    assert line["response"] == orjson.loads(JSON_FIXTURE.body_bytes)
    assert line["dialect"] == "messages"
    assert "x-api-key" not in line["http"]["request_headers"]


def test_a_requests_stream_is_recorded_when_its_lines_are_read(capture_session: CaptureSession, replay_upstream: Any) -> None:
    with requests.post(_url(replay_upstream), json=STREAM_FIXTURE.request_json, stream=True) as response:
        lines = list(response.iter_lines())
    assert b"\n".join(lines).strip() == b"\n".join(STREAM_FIXTURE.body_bytes.splitlines()).strip()
    [line] = recorded_lines(capture_session)
    assert line["stream"] is True and line["stream_truncated"] is False
    assert line["response"]["usage"]["output_tokens"] > 0


def test_a_requests_session_stream_closed_early_is_recorded(capture_session: CaptureSession, replay_upstream: Any) -> None:
    with requests.Session() as session:
        response = session.post(_url(replay_upstream), json=STREAM_FIXTURE.request_json, stream=True)
        chunks = response.iter_content(64)
        next(chunks)
        response.close()
    [line] = recorded_lines(capture_session)
    assert line["capture"]["end"] in ("close", "release_conn")
    assert line["error_category"] == "stream_truncated"


def test_requests_to_other_urls_are_not_recorded(capture_session: CaptureSession, replay_upstream: Any) -> None:
    assert requests.get(replay_upstream.base_url + "/v1/models").status_code == 404
    assert recorded_lines(capture_session) == []


def test_a_requests_connection_error_is_re_raised_and_recorded(capture_session: CaptureSession) -> None:
    from tests.support.faults import refused_port

    with pytest.raises(requests.ConnectionError):
        requests.post(f"http://127.0.0.1:{refused_port()}/v1/messages", json={}, timeout=5)
    [line] = recorded_lines(capture_session)
    assert line["error_category"] == "connection" and line["exception_type"] == "ConnectionError"


def test_a_server_error_status_is_recorded_with_its_category(capture_session: CaptureSession, fault_upstream: Any) -> None:
    response = requests.post(fault_upstream.url("status-500") + "/v1/messages", json={"model": "m"})
    assert response.status_code == 500
    [line] = recorded_lines(capture_session)
    assert line["status_code"] == 500 and line["error_category"] == "upstream_error"


def test_urllib3_preloaded_and_streamed_responses_are_recorded(capture_session: CaptureSession, replay_upstream: Any) -> None:
    with urllib3.PoolManager() as pool:
        whole = pool.request("POST", _url(replay_upstream), body=json.dumps(JSON_FIXTURE.request_json).encode())
        streamed = pool.request(
            "POST", _url(replay_upstream), body=json.dumps(STREAM_FIXTURE.request_json).encode(), preload_content=False
        )
        body = b"".join(streamed.stream(100))
        streamed.release_conn()
    assert whole.data == JSON_FIXTURE.body_bytes
    assert body == STREAM_FIXTURE.body_bytes
    lines = recorded_lines(capture_session)
    assert [line["capture"]["hook"] for line in lines] == ["urllib3", "urllib3"]
    assert lines[0]["response"] == orjson.loads(JSON_FIXTURE.body_bytes)
    assert lines[1]["stream"] is True and lines[1]["stream_truncated"] is False


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
