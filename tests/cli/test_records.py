"""`llmtap records`: a capture directory shown as people read it, and errors as one clean line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmtap import __version__
from llmtap.cli import main
from llmtap.errors import StoreError
from llmtap.exchange import Exchange
from llmtap.records import raw_line_from_exchange
from llmtap.store import CaptureStore
from tests.fixtures import fixture


def _capture(store: CaptureStore, rollout_id: str, name: str) -> None:
    recorded = fixture(name)
    exchange = Exchange(method="POST", path=recorded.request_path, request_body=json.dumps(recorded.request_json).encode())
    exchange.status_code = recorded.status
    exchange.response_headers = {"content-type": recorded.content_type}
    exchange.add_response_chunk(recorded.body_bytes)
    store.append(rollout_id, raw_line_from_exchange(exchange))


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_records_show_prints_a_table_with_totals(tmp_path: Path) -> None:
    with CaptureStore(tmp_path) as store:
        _capture(store, "0-0", "chat/parallel-tool-calls-gpt41-nano")
        _capture(store, "0-0", "messages/error-404-model-not-found")
    result = CliRunner().invoke(main, ["records", "show", str(tmp_path), "0-0"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    body = json.loads(fixture("chat/parallel-tool-calls-gpt41-nano").body_text)
    tool_names = {call["function"]["name"] for call in body["choices"][0]["message"]["tool_calls"]}
    assert "rollout 0-0" in result.output
    assert all(name in result.output for name in tool_names)
    assert "not_found" in result.output
    assert "calls 2  errors 1" in result.output


def test_records_show_json_gives_one_record_per_line(tmp_path: Path) -> None:
    with CaptureStore(tmp_path) as store:
        _capture(store, "r", "responses/function-call-gpt55")
    result = CliRunner().invoke(main, ["records", "show", str(tmp_path), "r", "--json"])
    [line] = result.output.splitlines()
    record = json.loads(line)
    assert record["dialect"] == "responses" and "request" not in record and record["tool_calls"]


def test_records_show_of_an_unknown_rollout_is_one_clear_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["records", "show", str(tmp_path), "nope"])
    assert result.exit_code == 1
    assert "No capture for rollout 'nope'" in result.output and "Traceback" not in result.output


def test_records_path_rejects_a_bad_id(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["records", "path", str(tmp_path), "../x"])
    assert result.exit_code == 1 and "not valid" in result.output


def test_records_list_counts_calls(tmp_path: Path) -> None:
    with CaptureStore(tmp_path) as store:
        _capture(store, "a", "chat/text-basic-gpt4o")
        _capture(store, "b", "chat/text-basic-gpt4o")
        _capture(store, "b", "chat/text-basic-gpt4o")
    result = CliRunner().invoke(main, ["records", "list", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    cells = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in result.output.splitlines() if line.count("│") > 3}
    assert cells["a"] == "1" and cells["b"] == "2"


def test_records_status_says_where_and_what(tmp_path: Path) -> None:
    with CaptureStore(tmp_path) as store:
        _capture(store, "a", "chat/text-basic-gpt4o")
        _capture(store, "b", "messages/error-404-model-not-found")
        store.mark_incomplete("b", "test")
        size = store.size_of("a") + store.size_of("b")
    with (tmp_path / "b.capture.jsonl").open("ab") as handle:
        handle.write(b"{broken\n")
    result = CliRunner().invoke(main, ["records", "status", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"directory: {tmp_path}" in result.output
    assert "rollouts: 2  calls: 2  errors: 1" in result.output
    assert f"size: {size + len(b'{broken' + bytes([10])):,} bytes" in result.output
    assert "damaged lines: 1" in result.output and "incomplete (a write failed): b" in result.output


def test_records_status_counts_a_torn_tail_as_damage(tmp_path: Path) -> None:
    with CaptureStore(tmp_path) as store:
        _capture(store, "a", "chat/text-basic-gpt4o")
    with (tmp_path / "a.capture.jsonl").open("ab") as handle:
        handle.write(b'{"cut off mid-wri')  # a writer killed in the middle of its line
    result = CliRunner().invoke(main, ["records", "status", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "calls: 1" in result.output
    assert "damaged lines: 1 (torn tails: 1)" in result.output


def test_records_status_shows_the_capture_failures_another_process_counted(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "x.capture.lock")  # planted: every append to x fails, counted in its marker
    with CaptureStore(tmp_path) as store:
        _capture(store, "a", "chat/text-basic-gpt4o")
        for _ in range(2):
            with pytest.raises(StoreError):
                _capture(store, "x", "chat/text-basic-gpt4o")
    os.mkfifo(tmp_path / "y.capture.jsonl")  # and a rollout whose data file is a FIFO
    with CaptureStore(tmp_path) as store, pytest.raises(StoreError):
        _capture(store, "y", "chat/text-basic-gpt4o")
    result = CliRunner().invoke(main, ["records", "status", str(tmp_path)])  # would hang on the FIFO if it opened it blocking
    assert result.exit_code == 0, result.output
    assert "capture failures: 2" in result.output  # x's, from its marker; y's file cannot be read at all
    assert "incomplete (a write failed): x" in result.output
    assert "refused (not a regular file, never read): y" in result.output
