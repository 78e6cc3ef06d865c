"""The raw line built from an exchange: every recorded exchange, streams cut anywhere, bodies kept."""

from __future__ import annotations

import gzip
import json
import re

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import llmtap.records.content_coding as content_coding
from llmtap.exchange import Exchange
from llmtap.records import (
    ModelCallRecord,
    decode_raw_field,
    raw_line_from_exchange,
)
from llmtap.records.json_layout import body_check, encode_as_recorded
from tests.fixtures import RecordedExchange, all_fixtures, fixture

EXPECTED_STATUS_CATEGORY = {400: "client_error", 401: "auth", 404: "not_found"}


def bare_exchange(path: str = "/v1/chat/completions") -> Exchange:
    return Exchange(method="POST", path=path, request_body=b'{"model": "m"}')


def exchange_from(recorded: RecordedExchange, *, pieces: int = 3, body: bytes | None = None) -> Exchange:
    body = recorded.body_bytes if body is None else body
    exchange = Exchange(
        method="POST",
        path=recorded.request_path,
        request_body=json.dumps(recorded.request_json).encode(),
        model_call_id="call-1",
        rollout_id="r-1",
    )
    exchange.status_code = recorded.status
    exchange.response_headers = {"content-type": recorded.content_type}
    step = max(1, len(body) // pieces)
    for start in range(0, len(body), step):
        exchange.add_response_chunk(body[start : start + step])
    exchange.finish()
    return exchange


@pytest.mark.parametrize("recorded", all_fixtures(), ids=lambda f: f.id)
def test_every_recorded_exchange_becomes_a_complete_line_and_record(recorded: RecordedExchange) -> None:
    line = raw_line_from_exchange(exchange_from(recorded))
    assert line["dialect"] == recorded.dialect
    assert line["status_code"] == recorded.status
    assert line["request"] == recorded.request_json
    expected = EXPECTED_STATUS_CATEGORY.get(recorded.status)
    if recorded.is_stream and "incomplete" in recorded.name:
        expected = "incomplete"
    assert line["error_category"] == expected
    assert line["response"] is not None
    if recorded.is_stream:
        assert line["stream"] is True and line["stream_truncated"] is False
        assert decode_raw_field(line, "response_raw") == recorded.body_bytes
    else:
        assert line["response"] == json.loads(recorded.body_text)
        assert "response_raw" not in line
        # The line's check of the bytes lets a replay send exactly these bytes again.
        assert line["response_body_crc32"] == body_check(recorded.body_bytes)
        assert encode_as_recorded(line["response"], line["response_body_crc32"]) == (recorded.body_bytes, True)
    # The line survives the JSONL round trip and normalizes without loss of identity.
    stored = orjson.loads(orjson.dumps(line))
    record = ModelCallRecord.from_raw_line(stored, 4)
    assert record.call_index == 4 and record.model_call_id == "call-1"
    assert record.latency_total_ms == line["latency_ms"]
    if recorded.status == 200:
        assert record.response_id == _first_id_in_body(recorded)
        assert record.finish_reason_normalized in ("stop", "length", "tool_calls", "content_filter")
    else:
        assert record.error == json.loads(recorded.body_text)["error"]


def _first_id_in_body(recorded: RecordedExchange) -> str:
    """The response id as the recorded body carries it: its `id`, or a stream's first response-shaped id."""
    if not recorded.is_stream:
        return str(json.loads(recorded.body_text)["id"])
    match = re.search(r'"id": ?"((?:chatcmpl-|msg_|resp_)[^"]+)"', recorded.body_text)
    assert match is not None, recorded.id
    return match.group(1)


@pytest.mark.parametrize("recorded", [f for f in all_fixtures() if f.is_stream], ids=lambda f: f.id)
def test_a_stream_cut_at_any_point_is_recorded_truncated_with_its_partial(recorded: RecordedExchange) -> None:
    body = recorded.body_bytes
    full = raw_line_from_exchange(exchange_from(recorded))
    for cut in sorted({len(body) // 7, len(body) // 3, len(body) // 2, (len(body) * 9) // 10}):
        line = raw_line_from_exchange(exchange_from(recorded, body=body[:cut]))
        assert line["stream_truncated"] is True
        assert line["error_category"] == "stream_truncated"
        assert decode_raw_field(line, "response_raw") == body[:cut]
        if line["response"] is not None:
            record = ModelCallRecord.from_raw_line(line, 0)
            full_record = ModelCallRecord.from_raw_line(full, 0)
            assert record.response_id in (None, full_record.response_id)


_streams = [f for f in all_fixtures() if f.is_stream]


@settings(max_examples=150, deadline=None)
@given(recorded=st.sampled_from(_streams), fraction=st.floats(min_value=0.0, max_value=1.0), pieces=st.integers(1, 40))
def test_cutting_any_stream_at_any_byte_never_raises(recorded: RecordedExchange, fraction: float, pieces: int) -> None:
    body = recorded.body_bytes
    cut = int(len(body) * fraction)
    line = raw_line_from_exchange(exchange_from(recorded, body=body[:cut], pieces=pieces))
    assert line["stream"] is True
    if line["stream_truncated"]:
        assert line["error_category"] == "stream_truncated"
    else:
        assert line["error_category"] in (None, "upstream_error", "incomplete")
    ModelCallRecord.from_raw_line(line, 0)


@settings(max_examples=100, deadline=None)
@given(recorded=st.sampled_from(_streams), pieces=st.integers(1, 200))
def test_any_chunking_of_a_stream_gives_an_identical_line(recorded: RecordedExchange, pieces: int) -> None:
    one = raw_line_from_exchange(exchange_from(recorded, pieces=1))
    many = raw_line_from_exchange(exchange_from(recorded, pieces=pieces))
    for key in ("response", "error_category", "stream_truncated", "response_raw"):
        assert one[key] == many[key]


def test_cancelled_call_is_categorized_cancelled_with_its_partial_kept() -> None:
    recorded = fixture("chat/text-stream-include-usage-gpt4")
    exchange = exchange_from(recorded, body=recorded.body_bytes[:400])
    exchange.cancelled = True
    line = raw_line_from_exchange(exchange)
    assert line["error_category"] == "cancelled" and line["stream_truncated"] is True
    assert decode_raw_field(line, "response_raw") == recorded.body_bytes[:400]


def test_non_json_success_body_is_a_parse_error_with_raw_kept() -> None:
    exchange = bare_exchange()
    exchange.status_code = 200
    exchange.response_headers = {"content-type": "text/plain"}
    exchange.add_response_chunk(b"<html>gateway</html>")
    line = raw_line_from_exchange(exchange)
    assert line["error_category"] == "capture_parse_error"
    assert line["response"] is None and line["response_raw"] == "<html>gateway</html>"


def test_request_that_is_not_a_json_object_is_kept_raw() -> None:
    exchange = Exchange(method="POST", path="/v1/responses", request_body=b"[1, 2]")
    exchange.status_code = 422
    line = raw_line_from_exchange(exchange)
    assert line["request"] is None and line["request_raw"] == "[1, 2]"
    assert line["error_category"] == "client_error"


def test_binary_bodies_are_kept_as_base64_not_lost() -> None:
    exchange = Exchange(method="POST", path="/v1/responses", request_body=b"\xff\x00")
    exchange.status_code = 200
    exchange.add_response_chunk(b"\xfe\xff")
    line = raw_line_from_exchange(exchange)
    assert decode_raw_field(line, "request_raw") == b"\xff\x00"
    assert decode_raw_field(line, "response_raw") == b"\xfe\xff"


def test_gzip_encoded_response_is_decoded_for_the_record() -> None:
    recorded = fixture("chat/text-basic-gpt4o")
    exchange = bare_exchange()
    exchange.status_code = 200
    exchange.response_headers = {"content-type": "application/json", "content-encoding": "gzip"}
    exchange.add_response_chunk(gzip.compress(recorded.body_bytes))
    line = raw_line_from_exchange(exchange)
    assert line["response"] == json.loads(recorded.body_text)
    assert line["error_category"] is None


def _compressed(coding: str, body: bytes) -> bytes:
    if coding == "br":
        return bytes(pytest.importorskip("brotli").compress(body))
    if coding == "zstd":
        return bytes(pytest.importorskip("zstandard").ZstdCompressor().compress(body))
    return gzip.compress(body)


@pytest.mark.parametrize("coding", ["br", "zstd", "gzip, br"])
def test_brotli_and_zstd_responses_are_decoded_for_the_record(coding: str) -> None:
    """httpx and aiohttp ask for br and zstd once brotli or zstandard is installed."""
    recorded = fixture("chat/text-basic-gpt4o")
    body = recorded.body_bytes
    for part in [part.strip() for part in coding.split(",")]:
        body = _compressed(part, body)
    exchange = bare_exchange()
    exchange.status_code = 200
    exchange.response_headers = {"content-type": "application/json", "content-encoding": coding}
    exchange.add_response_chunk(body)
    line = raw_line_from_exchange(exchange)
    assert line["response"] == json.loads(recorded.body_text) and line["error_category"] is None


def test_a_coding_that_cannot_be_decoded_keeps_the_raw_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(content_coding, "_optional_module", lambda name: None)  # brotli not installed
    exchange = bare_exchange()
    exchange.status_code = 200
    exchange.response_headers = {"content-type": "application/json", "content-encoding": "br"}
    exchange.add_response_chunk(b"\x8b\x02\x80{}\x03")
    line = raw_line_from_exchange(exchange)
    assert decode_raw_field(line, "response_raw") == b"\x8b\x02\x80{}\x03"
    assert line["error_category"] == "capture_parse_error"
    assert line["response_decoding"]["reason"] == "undecodable" and line["response_decoding"]["decoded"] is False
    exchange.response_headers["content-encoding"] = "zstd"
    monkeypatch.undo()
    assert raw_line_from_exchange(exchange)["error_category"] == "capture_parse_error"  # corrupt: not raised


def test_request_bytes_received_in_pieces_are_joined_once_at_finish() -> None:
    exchange = Exchange(method="POST", path="/v1/chat/completions")
    for piece in (b'{"model": ', b'"m", "messages"', b": []}"):
        exchange.add_request_bytes(piece)
    exchange.status_code = 200
    line = raw_line_from_exchange(exchange)
    assert exchange.request_body == b'{"model": "m", "messages": []}'
    assert line["request"] == {"model": "m", "messages": []}
