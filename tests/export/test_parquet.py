"""`export_parquet`: rows equal the normalized records, and re-runs append only what is new."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import orjson
import pyarrow.dataset as ds
import pytest

from llmtap import CaptureStore, aggregate_model_call_metrics, attach_file, read_model_call_records
from llmtap.export import parquet as parquet_module
from llmtap.export.parquet import export_parquet
from llmtap.export.parquet_files import STATE_NAME
from llmtap.export.sources import ExportError
from llmtap.export.tables import CALLS_SCHEMA, delivered_tool_results
from llmtap.records import ModelCallRecord
from tests.export.support import BASE_TIME, line_for
from tests.fixtures import fixture

Store = tuple[Path, dict[str, list[str]]]
_COUNTS = ("tokens_in", "tokens_out", "tokens_reasoning", "tokens_total", "cached_tokens", "cache_creation_tokens")


def _table(out: Path, name: str) -> list[dict[str, Any]]:
    if not (out / name).exists():
        return []
    return ds.dataset(out / name, format="parquet", partitioning="hive").to_table().to_pylist()


def _micros(value: Any) -> int | None:
    return None if value is None else round(value.timestamp() * 1_000_000)


def _store_records(root: Path) -> dict[str, tuple[str, ModelCallRecord]]:
    store = CaptureStore(root, create=False)
    return {
        record.model_call_id: (rollout_id, record)
        for rollout_id in store.rollouts()
        for record in read_model_call_records(store, rollout_id)
    }


def _copy(fixture_store: Store, tmp_path: Path) -> Path:
    root = tmp_path / "model-calls"
    shutil.copytree(fixture_store[0], root)
    return root


def assert_call_row_matches(row: dict[str, Any], rollout_id: str, record: ModelCallRecord) -> None:
    """Every column of a `calls` row against the record it came from."""
    assert row["rollout_id"] == rollout_id
    for name in (
        "call_index", "response_id", "dialect", "provider", "model", "status_code", "response_status",
        "error_category", "finish_reason", "finish_reason_normalized", "latency_total_ms", "latency_ttft_ms",
        "cache_hit", "stream", "stream_truncated", "reasoning_redacted_blocks", "schema_version", *_COUNTS,
    ):  # fmt: skip
        assert row[name] == getattr(record, name), (record.model_call_id, name)
    assert row["is_error"] is (record.error_category is not None)
    assert row["request_model"] == (record.request or {}).get("model")
    assert row["model_ref_name"] == "policy_model" and row["model_ref_type"] == "responses_api_models"
    assert _micros(row["started_at"]) == round(record.started_at * 1_000_000)
    assert _micros(row["completed_at"]) == round(record.completed_at * 1_000_000)
    assert row["tool_call_names"] == [call["name"] for call in record.tool_calls]
    assert (row["tool_result_names"], row["tool_error_names"]) == delivered_tool_results(record)
    assert row["has_refusal"] is (record.refusal is not None)
    assert row["request_bytes"] == len(orjson.dumps(record.request))
    assert row["response_bytes"] == (None if record.response is None else len(orjson.dumps(record.response)))
    assert row["date"] == ("2026-01-01" if record.started_at < BASE_TIME + 86_400 else "2026-01-02")


def test_every_fixture_becomes_a_calls_row_equal_to_its_record(fixture_store: Store, tmp_path: Path) -> None:
    root, _ = fixture_store
    report = export_parquet(root, tmp_path / "out")
    records = _store_records(root)
    rows = _table(tmp_path / "out", "calls")
    assert report.calls_written == len(rows) == len(records) == 84
    assert sorted(row["model_call_id"] for row in rows) == sorted(records)
    for row in rows:
        rollout_id, record = records[row["model_call_id"]]
        assert_call_row_matches(row, rollout_id, record)
        assert row["request_json"] is None and row["response_json"] is None  # payloads only when asked
    assert {row["date"] for row in rows} == {"2026-01-01", "2026-01-02"}
    assert any(row["tool_result_names"] for row in rows)  # follow-up fixtures deliver tool results


def test_payload_columns_hold_the_records_payloads_with_payloads_on(fixture_store: Store, tmp_path: Path) -> None:
    root, _ = fixture_store
    export_parquet(root, tmp_path / "out", payloads=True)
    records = _store_records(root)
    for row in _table(tmp_path / "out", "calls"):
        _, record = records[row["model_call_id"]]
        assert json.loads(row["request_json"]) == record.request
        assert (None if row["response_json"] is None else json.loads(row["response_json"])) == record.response
        assert row["response_raw"] == record.response_raw


def test_rollouts_rows_hold_each_rollouts_metrics_and_gaps(fixture_store: Store, tmp_path: Path) -> None:
    root, rollouts = fixture_store
    export_parquet(root, tmp_path / "out")
    store = CaptureStore(root, create=False)
    rows = {row["rollout_id"]: row for row in _table(tmp_path / "out", "rollouts")}
    assert set(rows) == set(rollouts)
    for rollout_id, row in rows.items():
        metrics = aggregate_model_call_metrics(store, rollout_id)
        for name in ("num_calls", "num_errors", "latency_total_ms", "wall_clock_ms", "latency_ttft_ms_p50", *_COUNTS):
            assert row[name] == metrics[name], (rollout_id, name)
        assert json.loads(row["errors_by_category"]) == metrics["errors_by_category"]
        assert row["gaps"] == [] and row["reward"] is None and row["export_run"] == 1


def test_a_second_run_appends_only_new_calls_and_new_rollout_versions(fixture_store: Store, tmp_path: Path) -> None:
    root = _copy(fixture_store, tmp_path)
    out = tmp_path / "out"
    export_parquet(root, out)
    again = export_parquet(root, out)
    assert (again.calls_written, again.rollout_rows_written, again.rollouts_read) == (0, 0, 0)
    recorded = fixture("chat/tool-result-followup-gpt4o")
    with CaptureStore(root) as store:
        store.append("chat-0", line_for(recorded, call_id="new-1", rollout_id="chat-0", started_at=BASE_TIME + 200_000))
        store.append("brand-new", line_for(recorded, call_id="new-2", rollout_id="brand-new", started_at=BASE_TIME))
    third = export_parquet(root, out)
    assert (third.calls_written, third.rollout_rows_written, third.rollouts_read) == (2, 2, 2)
    rows = _table(out, "calls")
    assert len(rows) == 86 and len({row["model_call_id"] for row in rows}) == 86
    records = _store_records(root)
    for row in rows:
        assert_call_row_matches_loosely(row, *records[row["model_call_id"]])
    new = {row["model_call_id"]: row for row in rows if row["export_run"] == 3}
    assert set(new) == {"new-1", "new-2"} and new["new-1"]["call_index"] == 2 and new["new-1"]["date"] == "2026-01-03"
    versions = [row for row in _table(out, "rollouts") if row["rollout_id"] == "chat-0"]
    assert sorted((row["export_run"], row["num_calls"]) for row in versions) == [(1, 2), (3, 3)]


def assert_call_row_matches_loosely(row: dict[str, Any], rollout_id: str, record: ModelCallRecord) -> None:
    assert (row["rollout_id"], row["call_index"], row["tokens_out"]) == (rollout_id, record.call_index, record.tokens_out)


def test_an_unterminated_last_line_waits_for_its_newline_and_damaged_lines_keep_their_index(
    fixture_store: Store, tmp_path: Path
) -> None:
    root = _copy(fixture_store, tmp_path)
    out = tmp_path / "out"
    path = root / "chat-1.capture.jsonl"
    line = orjson.dumps(line_for(fixture("chat/text-basic-gpt4o"), call_id="late", rollout_id="chat-1", started_at=BASE_TIME))
    with open(path, "ab") as handle:
        handle.write(b"{not json}\n" + line[:40])  # a damaged line, then a write in progress
    first = export_parquet(root, out)
    assert first.unreadable_lines == 1
    assert "late" not in {row["model_call_id"] for row in _table(out, "calls")}
    with open(path, "ab") as handle:
        handle.write(line[40:] + b"\n")
    second = export_parquet(root, out)
    assert second.calls_written == 1 and second.unreadable_lines == 0
    [late] = [row for row in _table(out, "calls") if row["model_call_id"] == "late"]
    assert late["call_index"] == 3  # after the two calls and the damaged line


def test_a_cleared_and_recaptured_rollout_exports_its_new_calls(fixture_store: Store, tmp_path: Path) -> None:
    root = _copy(fixture_store, tmp_path)
    out = tmp_path / "out"
    export_parquet(root, out)
    recorded = fixture("messages/text-basic-sonnet4")
    with CaptureStore(root) as store:
        store.clear("messages-0")
        # A call of the new attempt starts after the clear (an earlier start would be set aside as late).
        store.append("messages-0", line_for(recorded, call_id="retry-1", rollout_id="messages-0", started_at=time.time()))
    report = export_parquet(root, out)
    assert report.rollouts_replaced == 1 and report.calls_written == 1
    [row] = [row for row in _table(out, "calls") if row["model_call_id"] == "retry-1"]
    assert row["call_index"] == 0


def test_attached_rows_add_reward_and_attribution(fixture_store: Store, tmp_path: Path) -> None:
    root, rollouts = _copy(fixture_store, tmp_path), fixture_store[1]
    store = CaptureStore(root, create=False)
    rows_in = tmp_path / "rollouts.jsonl"
    with rows_in.open("w") as handle:
        for number, rollout_id in enumerate(sorted(rollouts)):
            last = read_model_call_records(store, rollout_id)[-1]
            handle.write(json.dumps({"_ng_rollout_id": rollout_id, "reward": number % 3 / 2, "response": last.response}) + "\n")
        handle.write("not json\n")
    attached = tmp_path / "attached.jsonl"
    attach_file(rows_in, attached, root)
    out = tmp_path / "out"
    report = export_parquet(root, out, rollouts_file=attached)
    assert report.attached_rows == len(rollouts) and report.attached_bad_lines == 1
    expected = {}
    for line in attached.read_text().splitlines():
        row = json.loads(line) if line.startswith("{") else None
        if row is not None:
            expected[row["_ng_rollout_id"]] = (row["reward"], row["ng_model_call_capture"]["attribution"])
    exported = {row["rollout_id"]: row for row in _table(out, "rollouts")}
    for rollout_id, (reward, attribution) in expected.items():
        row = exported[rollout_id]
        assert row["reward"] == reward
        assert row["terminal_model_call_id"] == attribution["model_call_id"]
        assert row["attributed"] is attribution["attributed"]
        assert row["attribution_method"] == (attribution["method"] or None)
    assert any(row["attributed"] for row in exported.values())
    # Unchanged store and rows: nothing new. A later run without the file keeps the reward on new versions.
    assert export_parquet(root, out, rollouts_file=attached).rollout_rows_written == 0
    with CaptureStore(root) as writable:
        writable.append("chat-0", line_for(fixture("chat/text-basic-gpt4o"), call_id="n", rollout_id="chat-0", started_at=BASE_TIME))
    assert export_parquet(root, out).calls_written == 1
    rows = _table(out, "rollouts")
    versions = sorted((row["export_run"], row["reward"]) for row in rows if row["rollout_id"] == "chat-0")
    assert versions == [(1, expected["chat-0"][0]), (3, expected["chat-0"][0])]


def test_a_failed_run_leaves_the_export_as_it_was(
    fixture_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = fixture_store
    out = tmp_path / "out"

    def fail(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(parquet_module, "save_state", fail)
    with pytest.raises(OSError):
        export_parquet(root, out)
    assert _table(out, "calls") == [] and not (out / STATE_NAME).exists()
    monkeypatch.undo()
    # A run killed after renaming its files but before its commit leaves files numbered above the state.
    export_parquet(root, out)
    partition = next((out / "calls").iterdir())
    [committed] = list(partition.iterdir())
    shutil.copy(committed, partition / "part-000002-0001.parquet")
    (partition / "part-000002-0002.parquet.tmp").write_bytes(b"half a file")
    export_parquet(root, out)
    assert len(_table(out, "calls")) == 84
    assert list(partition.iterdir()) == [committed]


def test_the_export_directory_is_checked_before_anything_is_written(fixture_store: Store, tmp_path: Path) -> None:
    root, _ = fixture_store
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("someone else's")
    with pytest.raises(ExportError, match="not empty"):
        export_parquet(root, busy)
    target = tmp_path / "real"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(ExportError, match="link"):
        export_parquet(root, tmp_path / "link")
    out = tmp_path / "out"
    export_parquet(root, out)
    (out / STATE_NAME).write_bytes(b'{"version": 1, "committed_run": -4, "rollouts": {}}')
    with pytest.raises(ExportError, match="damaged"):
        export_parquet(root, out)
    (out / STATE_NAME).unlink()
    (out / STATE_NAME).symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(ExportError, match="link"):
        export_parquet(root, out)


def test_a_capture_file_that_is_a_link_or_fifo_is_refused_not_read(fixture_store: Store, tmp_path: Path) -> None:
    root = _copy(fixture_store, tmp_path)
    os.unlink(root / "chat-2.capture.jsonl")
    os.mkfifo(root / "chat-2.capture.jsonl")  # reading it would block the export forever
    os.unlink(root / "chat-3.capture.jsonl")
    (root / "chat-3.capture.jsonl").symlink_to(tmp_path / "secret.txt")
    report = export_parquet(root, tmp_path / "out")
    assert sorted(report.refused_files) == ["chat-2", "chat-3"]
    assert {row["rollout_id"] for row in _table(tmp_path / "out", "calls")}.isdisjoint({"chat-2", "chat-3"})


def test_bounded_batches_give_the_same_rows(fixture_store: Store, tmp_path: Path) -> None:
    root, _ = fixture_store
    export_parquet(root, tmp_path / "small", batch_rows=3)
    export_parquet(root, tmp_path / "large")
    def key(row: dict[str, Any]) -> str:
        return str(row["model_call_id"])

    small = sorted(_table(tmp_path / "small", "calls"), key=key)
    large = sorted(_table(tmp_path / "large", "calls"), key=key)
    assert small == large
    assert ds.dataset(tmp_path / "small" / "calls", format="parquet").schema.names == CALLS_SCHEMA.names


def test_a_copied_store_goes_on_from_where_the_export_stopped(fixture_store: Store, tmp_path: Path) -> None:
    root = _copy(fixture_store, tmp_path)
    out = tmp_path / "out"
    export_parquet(root, out)
    moved = tmp_path / "restored"
    shutil.copytree(root, moved)  # new inodes, same contents
    with CaptureStore(moved) as store:
        store.append("chat-0", line_for(fixture("chat/text-basic-gpt4o"), call_id="n", rollout_id="chat-0", started_at=BASE_TIME))
    report = export_parquet(moved, out)
    assert (report.calls_written, report.rollouts_replaced) == (1, 0)
    assert len(_table(out, "calls")) == 85
    assert report.rollout_rows_written == 1  # only chat-0 changed


def test_two_runs_at_once_take_turns_and_write_each_call_once(fixture_store: Store, tmp_path: Path) -> None:
    import threading

    root, _ = fixture_store
    out = tmp_path / "out"
    errors: list[BaseException] = []

    def run() -> None:
        try:
            export_parquet(root, out, batch_rows=5)
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    rows = _table(out, "calls")
    assert len(rows) == 84 and len({row["model_call_id"] for row in rows}) == 84
