"""ModelCallRecord: the normalized record read from a raw line."""

from __future__ import annotations

import pytest

from llmtap.records import (
    RECORD_FIELDS,
    ModelCallRecord,
)


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


