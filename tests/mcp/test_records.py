"""Tool-call records: the line round-trips, results are bounded, and the JSONL sink writes only a plain file."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import orjson
import pytest

from llmtap.mcp.recorder import Recorder
from llmtap.mcp.records import (
    JsonlToolCallSink,
    ToolCallRecord,
    ToolCallRecordError,
    ToolCallSinkError,
    parse_tool_call_line,
    summarize_result,
)


def _record(**fields: object) -> ToolCallRecord:
    return ToolCallRecord(
        call_id="tc_1",
        session_id="ms_1",
        transport="stdio",
        direction="client_to_server",
        method="tools/call",
        jsonrpc_id=1,
        started_at=1.0,
        **fields,
    )  # type: ignore[arg-type]


def test_a_line_round_trips_and_names_its_schema() -> None:
    record = _record(name="echo", arguments={"a": 1}, status="completed")
    line = record.to_line()
    assert orjson.loads(line)["schema_version"] == 1 and orjson.loads(line)["record"] == "mcp_request"
    assert parse_tool_call_line(line) == record
    # A newer writer's extra keys are ignored; a newer schema or another kind of line is refused.
    assert parse_tool_call_line({**orjson.loads(line), "future": 1}) == record
    with pytest.raises(ToolCallRecordError, match="schema_version 2"):
        parse_tool_call_line({**orjson.loads(line), "schema_version": 2})
    with pytest.raises(ToolCallRecordError):
        parse_tool_call_line(b'{"record": "model_call"}')
    with pytest.raises(ToolCallRecordError):
        parse_tool_call_line(b"{not json")


def test_a_large_result_keeps_a_bounded_part_and_its_full_sizes() -> None:
    result = {
        "content": [
            {"type": "text", "text": "a" * 100},
            {"type": "text", "text": "b" * 10_000},
            {"type": "text", "text": "c"},
        ],
        "structuredContent": {"x": "y" * 5000},
    }
    summary = summarize_result("tools/call", result, budget=1000)
    assert len(orjson.dumps(summary)) < 1500
    assert summary["content"][0] == {"type": "text", "text": "a" * 100}
    assert summary["content"][1]["llmtap_truncated"] is True and summary["content"][1]["llmtap_text_chars"] == 10_000
    assert len(summary["content"]) == 2 and summary["content_truncated"] is True
    assert summary["content_items"] == 3 and summary["result_bytes"] == len(orjson.dumps(result))
    assert summary["structured_content"] is None and summary["structured_content_truncated"] is True


def test_tools_list_keeps_names_only() -> None:
    summary = summarize_result("tools/list", {"tools": [{"name": "a", "inputSchema": {}}, {"name": "b"}]})
    assert summary["tools"] == ["a", "b"] and summary["tool_count"] == 2


def test_the_sink_appends_whole_lines_and_ends_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    path.write_bytes(b'{"torn": ')
    sink = JsonlToolCallSink(path)
    sink.write([_record(name="a")])
    sink.write([_record(name="b"), _record(name="c")])
    sink.close()
    lines = path.read_bytes().splitlines()
    assert lines[0] == b'{"torn": '
    assert [parse_tool_call_line(line).name for line in lines[1:]] == ["a", "b", "c"]


def test_the_sink_syncs_before_write_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real(fd))[1])
    sink = JsonlToolCallSink(tmp_path / "calls.jsonl")
    sink.write([_record()])
    assert synced
    sink.close()


def test_the_sink_refuses_a_link_a_fifo_and_a_hard_link(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("")
    (tmp_path / "symlink").symlink_to(target)
    os.mkfifo(tmp_path / "fifo")
    os.link(target, tmp_path / "hardlink")
    for name in ("symlink", "fifo", "hardlink"):
        with pytest.raises(ToolCallSinkError):
            JsonlToolCallSink(tmp_path / name).open()
    assert target.read_text() == ""


def test_concurrent_writers_never_interleave_lines(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    sinks = [JsonlToolCallSink(path) for _ in range(4)]

    def write(sink: JsonlToolCallSink) -> None:
        for index in range(50):
            sink.write([_record(name=f"{id(sink)}-{index}", arguments={"pad": "x" * 3000})])

    threads = [threading.Thread(target=write, args=(sink,)) for sink in sinks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = path.read_bytes().splitlines()
    assert len(lines) == 200 and all(parse_tool_call_line(line) for line in lines)


class _FailingSink:
    def write(self, records: object) -> None:
        raise OSError(28, "No space left on device")

    def close(self) -> None:
        return None


class _StuckSink:
    def __init__(self) -> None:
        self.release = threading.Event()

    def write(self, records: object) -> None:
        self.release.wait(30)

    def close(self) -> None:
        self.release.set()


async def test_a_failed_write_is_counted_and_said_once_never_raised() -> None:
    said: list[str] = []
    recorder = Recorder(_FailingSink(), say=said.append)
    await recorder.persist([_record()])
    await recorder.persist([_record()])
    assert recorder.counts.dropped == 2 and len(said) == 1 and "OSError" in said[0]
    recorder.close()


async def test_a_stuck_write_releases_the_answer_after_the_timeout() -> None:
    sink = _StuckSink()
    recorder = Recorder(sink, write_timeout_s=0.05, say=lambda text: None)
    await asyncio.wait_for(recorder.persist([_record()]), 20)
    assert recorder.counts.late == 1
    recorder.close()
