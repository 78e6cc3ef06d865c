"""Records: raw lines from exchanges, error categories, normalization and metrics."""

from __future__ import annotations

import gzip
import json
import re

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import llmtap.records.content_coding as content_coding
import llmtap.records as records_module
from llmtap.dialects import get_dialect
from llmtap.exchange import Exchange
from llmtap.records import (
    ERROR_CATEGORIES,
    RECORD_FIELDS,
    ModelCallRecord,
    aggregate_metrics,
    category_for_exception,
    category_for_status,
    decode_raw_field,
    raw_line_from_exchange,
)
from tests.fixtures import RecordedExchange, all_fixtures, fixture

EXPECTED_STATUS_CATEGORY = {400: "client_error", 401: "auth", 404: "not_found"}


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


def test_status_categories() -> None:
    assert [category_for_status(s) for s in (200, 408, 504, 429, 401, 403, 404, 422, 400, 500, 503, None)] == [
        None, "timeout", "timeout", "rate_limit", "auth", "auth", "not_found",
        "client_error", "client_error", "upstream_error", "upstream_error", None,
    ]


def test_exception_categories_follow_the_exception_chain() -> None:
    class ReadTimeout(Exception): ...

    class RemoteProtocolError(Exception): ...

    wrapped = RuntimeError("outer")
    wrapped.__cause__ = ReadTimeout()
    assert category_for_exception(wrapped) == "timeout"
    assert category_for_exception(ConnectionResetError()) == "connection"
    assert category_for_exception(RemoteProtocolError()) == "connection"
    assert category_for_exception(ValueError()) == "exception"


def test_every_category_is_one_of_the_known_names() -> None:
    assert set(ERROR_CATEGORIES) >= {
        "timeout", "rate_limit", "auth", "not_found", "client_error", "upstream_error", "incomplete",
        "stream_truncated", "capture_parse_error", "connection", "exception", "cancelled",
    }


def _bare_exchange(path: str = "/v1/chat/completions") -> Exchange:
    return Exchange(method="POST", path=path, request_body=b'{"model": "m"}')


def test_exception_with_upstream_status_keeps_that_status_and_category() -> None:
    class UpstreamError(Exception):
        status_code = 403

    exchange = _bare_exchange()
    exchange.exception = UpstreamError("secret prompt text")
    line = raw_line_from_exchange(exchange)
    assert line["status_code"] == 403 and line["error_category"] == "auth"
    assert line["exception_type"] == "UpstreamError"
    assert "secret prompt text" not in orjson.dumps(line).decode()


def test_synthesized_status_lets_the_exception_decide() -> None:
    exchange = _bare_exchange()
    exchange.status_code = 502
    exchange.status_synthesized = True
    exchange.exception = ConnectionRefusedError()
    assert raw_line_from_exchange(exchange)["error_category"] == "connection"


def test_cancelled_call_is_categorized_cancelled_with_its_partial_kept() -> None:
    recorded = fixture("chat/text-stream-include-usage-gpt4")
    exchange = exchange_from(recorded, body=recorded.body_bytes[:400])
    exchange.cancelled = True
    line = raw_line_from_exchange(exchange)
    assert line["error_category"] == "cancelled" and line["stream_truncated"] is True
    assert decode_raw_field(line, "response_raw") == recorded.body_bytes[:400]


def test_non_json_success_body_is_a_parse_error_with_raw_kept() -> None:
    exchange = _bare_exchange()
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
    exchange = _bare_exchange()
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
    exchange = _bare_exchange()
    exchange.status_code = 200
    exchange.response_headers = {"content-type": "application/json", "content-encoding": coding}
    exchange.add_response_chunk(body)
    line = raw_line_from_exchange(exchange)
    assert line["response"] == json.loads(recorded.body_text) and line["error_category"] is None


def test_a_coding_that_cannot_be_decoded_keeps_the_raw_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(content_coding, "_optional_module", lambda name: None)  # brotli not installed
    exchange = _bare_exchange()
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


def test_record_has_every_reference_field() -> None:
    reference = {
        "model_call_id", "response_id", "call_index", "model_ref", "model", "dialect", "status_code",
        "response_status", "finish_reason", "error_category", "started_at", "completed_at",
        "latency_total_ms", "latency_ttft_ms", "tokens_in", "tokens_out", "tokens_reasoning", "tokens_total",
        "cache_hit", "cached_tokens", "cache_creation_tokens", "request", "response", "request_raw",
        "response_raw", "tool_calls", "reasoning_content",
    }
    assert reference <= set(RECORD_FIELDS)
    assert len(reference) == 27


def test_a_line_without_model_call_id_is_not_a_record() -> None:
    with pytest.raises(ValueError):
        ModelCallRecord.from_raw_line({"dialect": "chat"}, 0)


@pytest.mark.parametrize("junk", [[], "x", 3, {"choices": "no"}, {"usage": {"prompt_tokens": True}}, {"output": [None, 1]}])
def test_malformed_responses_normalize_without_raising(junk: object) -> None:
    for dialect in ("chat", "responses", "messages"):
        record = ModelCallRecord.from_raw_line({"model_call_id": "x", "dialect": dialect, "response": junk}, 0)
        assert record.tokens_in is None


def test_payloads_can_be_left_out() -> None:
    record = ModelCallRecord.from_raw_line({"model_call_id": "x", "request": {"a": 1}, "response_raw": "r"}, 0)
    data = record.to_dict(include_payloads=False)
    assert not {"request", "response", "request_raw", "response_raw"} & set(data)
    assert record.to_dict()["request"] == {"a": 1}


def _record(**fields: object) -> ModelCallRecord:
    return ModelCallRecord(model_call_id="x", call_index=0, **fields)  # type: ignore[arg-type]


def test_metrics_sum_known_values_and_keep_unknown_as_null() -> None:
    metrics = aggregate_metrics(
        [
            _record(tokens_in=10, tokens_out=5, latency_total_ms=100.0, latency_ttft_ms=20.0, started_at=10.0, completed_at=10.1),
            _record(tokens_in=4, tokens_out=None, latency_total_ms=50.0, error_category="rate_limit", started_at=10.05, completed_at=10.3),
            _record(error_category="cancelled"),
        ]
    )
    assert metrics["tokens_in"] == 14 and metrics["tokens_out"] == 5
    assert metrics["tokens_reasoning"] is None and metrics["cached_tokens"] is None
    assert metrics["num_calls"] == 3 and metrics["num_errors"] == 2
    assert metrics["errors_by_category"] == {"cancelled": 1, "rate_limit": 1}
    assert metrics["latency_total_ms"] == 150.0
    assert metrics["wall_clock_ms"] == pytest.approx(300.0)
    assert metrics["latency_ttft_ms_p50"] == 20.0


def test_metrics_of_no_calls_are_all_null_with_zero_calls() -> None:
    metrics = aggregate_metrics([])
    assert metrics["num_calls"] == 0 and metrics["num_errors"] == 0
    assert all(metrics[k] is None for k in ("tokens_in", "tokens_out", "tokens_total", "latency_total_ms", "wall_clock_ms"))


def test_ttft_percentiles_use_nearest_rank() -> None:
    metrics = aggregate_metrics([_record(latency_ttft_ms=float(v)) for v in range(1, 101)])
    assert (metrics["latency_ttft_ms_p50"], metrics["latency_ttft_ms_p90"], metrics["latency_ttft_ms_p99"]) == (50.0, 90.0, 99.0)


def test_dialect_registry_finds_paths() -> None:
    from llmtap.dialects import dialect_for_path

    assert dialect_for_path("/v1/chat/completions") is get_dialect("chat")
    assert dialect_for_path("/v1/responses?x=1") is get_dialect("responses")
    assert dialect_for_path("/openai/deployments/gpt/chat/completions") is None
    assert dialect_for_path("/openai/deployments/gpt/chat/completions", exact=False) is get_dialect("chat")
    assert dialect_for_path("/v1/models") is None


def test_request_bytes_received_in_pieces_are_joined_once_at_finish() -> None:
    exchange = Exchange(method="POST", path="/v1/chat/completions")
    for piece in (b'{"model": ', b'"m", "messages"', b": []}"):
        exchange.add_request_bytes(piece)
    exchange.status_code = 200
    line = raw_line_from_exchange(exchange)
    assert exchange.request_body == b'{"model": "m", "messages": []}'
    assert line["request"] == {"model": "m", "messages": []}
