"""Readers: records back from the store, strict and tolerant, with stable call_index."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmtap.errors import CaptureRecordError
from llmtap.store import CaptureStore
from llmtap.store.readers import aggregate_model_call_metrics, read_model_call_records, read_rollout_calls


def _line(i: int, tokens: int | None = None) -> dict[str, object]:
    response = {"id": f"chatcmpl-{i}", "choices": [], "usage": {"prompt_tokens": tokens, "completion_tokens": 1}}
    return {"model_call_id": f"c{i}", "dialect": "chat", "started_at": 1.0 + i, "completed_at": 2.0 + i,
            "latency_ms": 10.0, "status_code": 200, "error_category": None, "request": {}, "response": response}


def test_damaged_and_foreign_lines_keep_the_other_indices(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.append("r", _line(0, 5))
    with store.path_for("r").open("ab") as handle:
        handle.write(b"{not json\n\n")
    store.append("r", {"something": "else"})
    store.append("r", _line(3, 7))
    calls = read_rollout_calls(store, "r")
    assert [r.call_index for r in calls.records] == [0, 3]
    assert calls.unreadable_lines == [1, 2]
    assert aggregate_model_call_metrics(store, "r")["tokens_in"] == 12


def test_strict_read_names_the_damaged_line(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.append("r", _line(0))
    with store.path_for("r").open("ab") as handle:
        handle.write(b"\n{not json\n")
    with pytest.raises(CaptureRecordError, match="Line 3 of"):
        read_model_call_records(store, "r")


def test_strict_read_names_a_foreign_record_by_call_index(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.append("r", _line(0))
    store.append("r", {"not": "a capture record"})
    with pytest.raises(CaptureRecordError, match="call_index 1") as raised:
        read_model_call_records(store, "r")
    assert raised.value.call_index == 1 and raised.value.line_number is None
    assert [r.model_call_id for r in read_model_call_records(store, "r", strict=False)] == ["c0"]


def test_aggregate_needs_a_rollout_id_with_a_store(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="rollout id"):
        aggregate_model_call_metrics(CaptureStore(tmp_path))
