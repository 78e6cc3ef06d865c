"""Every bound of the exports, and the parsers of what they read back, under hostile input."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtap.export import parquet as parquet_module
from llmtap.export import parquet_files
from llmtap.export.otlp import export_otlp
from llmtap.export.parquet import export_parquet
from llmtap.export.parquet_files import STATE_NAME, open_export_dir
from llmtap.export.sources import ExportError
from llmtap.export.spans import default_resource, span_attributes, span_for_record
from llmtap.export.tables import attached_rollout, call_row
from llmtap.records import ModelCallRecord

Store = tuple[Path, dict[str, list[str]]]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)


def test_a_state_file_over_the_bound_is_refused(fixture_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    export_parquet(fixture_store[0], out)
    monkeypatch.setattr(parquet_files, "MAX_STATE_BYTES", 100)
    with pytest.raises(ExportError, match="not a regular file under"):
        export_parquet(fixture_store[0], out)


def test_a_state_file_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / STATE_NAME)
    with pytest.raises(ExportError, match="not a regular file"):
        open_export_dir(out)


def test_an_attached_line_over_the_bound_is_skipped_whole(
    fixture_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = fixture_store
    monkeypatch.setattr(parquet_module, "MAX_ATTACHED_LINE_BYTES", 200)
    rows = tmp_path / "attached.jsonl"
    small = {"reward": 1.0, "ng_model_call_capture": {"rollout_id": "chat-0", "attribution": {}}}
    large = {"reward": 0.5, "ng_model_call_capture": {"rollout_id": "chat-1", "padding": "x" * 5000}}
    rows.write_text(json.dumps(small) + "\n" + json.dumps(large) + "\n" + json.dumps(small) + "\n")
    report = export_parquet(root, tmp_path / "out", rollouts_file=rows)
    assert (report.attached_rows, report.attached_bad_lines) == (1, 1)


def test_a_rollouts_file_that_is_a_fifo_or_link_is_refused(fixture_store: Store, tmp_path: Path) -> None:
    fifo = tmp_path / "rows.fifo"
    os.mkfifo(fifo)
    with pytest.raises(ExportError, match="not a regular file"):
        export_parquet(fixture_store[0], tmp_path / "out", rollouts_file=fifo)
    (tmp_path / "rows.link").symlink_to(tmp_path / "real.jsonl")
    (tmp_path / "real.jsonl").write_text("")
    with pytest.raises(ExportError, match="link"):
        export_parquet(fixture_store[0], tmp_path / "out2", rollouts_file=tmp_path / "rows.link")


@pytest.mark.parametrize("batch_size", [0, 10_001])
def test_otlp_batch_size_is_bounded(fixture_store: Store, batch_size: int) -> None:
    with pytest.raises(ExportError, match="batch size"):
        export_otlp(fixture_store[0], endpoint="http://127.0.0.1:9", batch_size=batch_size)


def test_export_of_a_path_that_is_not_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ExportError, match="not a directory"):
        export_parquet(tmp_path / "file", tmp_path / "out")
    with pytest.raises(ExportError, match="Could not open"):
        export_otlp(tmp_path / "missing", endpoint="http://127.0.0.1:9")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=json_values)
def test_any_state_document_is_read_or_refused_as_damaged(tmp_path: Path, document: Any) -> None:
    out = tmp_path / "state-prop"
    out.mkdir(exist_ok=True)
    (out / STATE_NAME).write_bytes(orjson.dumps(document))
    try:
        state = open_export_dir(out)
    except ExportError as exc:
        assert "damaged" in str(exc)
    else:
        assert state.committed_run >= 0


@settings(max_examples=200, deadline=None)
@given(
    entry=st.lists(json_values, min_size=6, max_size=6),
    committed=st.integers(0, 10),
)
def test_rollout_entries_of_any_shape_are_checked(entry: list[Any], committed: int) -> None:
    document = {"version": 1, "committed_run": committed, "rollouts": {"r": entry}}
    try:
        state = parquet_files._parse_state(Path("state"), orjson.dumps(document))
    except ExportError:
        return
    loaded = state.rollouts["r"]
    assert loaded.next_index >= 0 and (loaded.size is None or loaded.size >= 0)


@settings(max_examples=300, deadline=None)
@given(row=st.dictionaries(st.sampled_from(["reward", "_ng_task_index", "ng_model_call_capture", "x"]), json_values))
def test_any_attached_row_reads_or_is_skipped(row: dict[str, Any]) -> None:
    found = attached_rollout(row)
    if found is not None:
        rollout_id, attached = found
        assert isinstance(rollout_id, str)
        assert attached.reward is None or isinstance(attached.reward, float)
        json.loads(attached.fingerprint())


@settings(max_examples=300, deadline=None)
@given(
    line=st.fixed_dictionaries(
        {"model_call_id": st.text(min_size=1, max_size=8)},
        optional={
            "dialect": st.sampled_from(["chat", "responses", "messages", "other"]),
            "request": json_values,
            "response": json_values,
            "started_at": st.floats(0, 4e9),
            "completed_at": st.floats(0, 4e9),
            "status_code": json_values,
            "error_category": json_values,
        },
    )
)
def test_any_record_becomes_a_span_and_a_row_or_is_skipped(line: dict[str, Any]) -> None:
    record = ModelCallRecord.from_raw_line(line, 0)
    attributes = span_attributes(record, "r", content=True)
    for value in attributes.values():
        assert isinstance(value, (str, bool, int, float, list))
    span = span_for_record(record, "r", resource=default_resource(), content=True)
    assert (span is None) == (record.started_at is None or (record.completed_at is None and record.latency_total_ms is None))
    row = call_row(record, "r", 1, payloads=True)
    assert row["model_call_id"] == record.model_call_id
