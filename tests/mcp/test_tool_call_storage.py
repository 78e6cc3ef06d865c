"""Where tool-call records go: beside a rollout's model calls (`store.tool_calls`), and into a capsule through the spool."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmtap.capsule.writer import create_capsule
from llmtap.errors import InvalidRolloutIdError, StoreError, UnsafeCaptureFileError
from llmtap.mcp.capsule_sink import CapsuleToolCallSink, CapsuleToolCallSinkError
from llmtap.mcp.records import ToolCallRecord, new_call_id
from llmtap.mcp.timeline import interleave
from llmtap.spool.collector import SpoolCollector
from llmtap.spool.frame import KIND_NETWORK, KIND_TOOL_CALL, encode_frame, encode_meta
from llmtap.spool.writer import SpoolWriter, spool_directory
from llmtap.store import CaptureStore
from llmtap.store.tool_calls import RolloutToolCallSink, append_tool_calls, read_tool_calls, tool_calls_path


def record(name: str = "add", rollout_id: str | None = "r1", started_at: float = 1000.0) -> ToolCallRecord:
    return ToolCallRecord(
        call_id=new_call_id(), session_id="s", transport="stdio", direction="client_to_server", method="tools/call",
        jsonrpc_id=1, started_at=started_at, status="completed", completed_at=started_at + 0.5, duration_ms=500.0,
        rollout_id=rollout_id, name=name, arguments={"a": 1}, arguments_bytes=7, result={"result_bytes": 12},
    )  # fmt: skip


def test_records_land_beside_the_rollout_and_read_back_in_order(tmp_path: Path) -> None:
    sink = RolloutToolCallSink(tmp_path)
    sink.open()
    first, second, loose = record("add"), record("mul", rollout_id="r2"), record("sub", rollout_id=None)
    sink.write([first, second, loose])
    sink.write([record("div")])
    assert [r.name for r in read_tool_calls(tmp_path, "r1").records] == ["add", "div"]
    assert [r.call_id for r in read_tool_calls(tmp_path, "r2").records] == [second.call_id]
    assert [r.name for r in read_tool_calls(tmp_path, "default").records] == ["sub"]  # no rollout id: the default
    assert (tmp_path / "r1.capture.lock").exists()  # the store's own lock file for the rollout
    assert read_tool_calls(tmp_path, "nothing-here").records == []


def test_an_append_waits_for_the_rollouts_lock(tmp_path: Path) -> None:
    with CaptureStore(tmp_path) as store:
        store.append("r1", {"x": 1})
    lock = os.open(tmp_path / "r1.capture.lock", os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)  # a clear() or a model-call writer holding the rollout
    done = threading.Event()
    writer = threading.Thread(target=lambda: (append_tool_calls(tmp_path, "r1", [record()]), done.set()))
    writer.start()
    time.sleep(0.2)
    assert not done.is_set() and not tool_calls_path(tmp_path, "r1").exists()
    fcntl.flock(lock, fcntl.LOCK_UN)
    os.close(lock)
    writer.join(5)
    assert done.is_set() and len(read_tool_calls(tmp_path, "r1").records) == 1


def test_a_torn_or_foreign_line_is_counted_and_the_next_append_stays_whole(tmp_path: Path) -> None:
    append_tool_calls(tmp_path, "r1", [record("add")])
    with open(tool_calls_path(tmp_path, "r1"), "ab") as file:
        file.write(b'{"record": "mcp_request", "schema_ver')  # a writer killed mid-line
    append_tool_calls(tmp_path, "r1", [record("mul")])
    read = read_tool_calls(tmp_path, "r1")
    assert [r.name for r in read.records] == ["add", "mul"] and read.unreadable_lines == 1


def test_links_fifos_and_bad_ids_are_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(b"")
    root = tmp_path / "calls"
    root.mkdir()
    (root / "r1.tool-calls.jsonl").symlink_to(outside)
    with pytest.raises(UnsafeCaptureFileError):
        append_tool_calls(root, "r1", [record()])
    with pytest.raises(UnsafeCaptureFileError):
        read_tool_calls(root, "r1")
    assert outside.read_bytes() == b""
    os.mkfifo(root / "r2.tool-calls.jsonl")
    with pytest.raises(UnsafeCaptureFileError):
        read_tool_calls(root, "r2")  # never blocks on a FIFO
    with pytest.raises(InvalidRolloutIdError):
        append_tool_calls(root, "../escape", [record()])
    linked = tmp_path / "linked"
    linked.symlink_to(root)
    with pytest.raises(StoreError):
        append_tool_calls(linked, "r3", [record()])


def test_the_collector_appends_spooled_tool_calls_and_network_events_once(tmp_path: Path) -> None:
    paths = create_capsule(tmp_path / "runs")
    (paths.root / "capsule.json").write_text("{}")
    sink = CapsuleToolCallSink(paths.root)
    sink.open()
    records = [record("add"), record("mul")]
    sink.write(records)
    writer = SpoolWriter(spool_directory(paths.root))
    event = {"event_id": "ne_1", "method": "GET", "host": "example.test", "path": "/x", "status": 200}
    writer.write(encode_frame(KIND_NETWORK, encode_meta(event)))
    writer.write(encode_frame(KIND_TOOL_CALL, encode_meta({"no": "id"})))  # not a record: counted, never written
    SpoolCollector(paths).finish()
    lines = [json.loads(line) for line in paths.tool_calls.read_bytes().splitlines()]
    assert [line["call_id"] for line in lines] == [r.call_id for r in records]
    assert [json.loads(line) for line in paths.network_events.read_bytes().splitlines()] == [event]
    health = [json.loads(p.read_text()) for p in paths.process_health.iterdir()]
    assert sum(h["counts"].get("spool_frames_damaged", 0) for h in health) == 1
    # The damaged frame kept the spool file: a second finalisation adds no line twice.
    SpoolCollector(paths).finish()
    assert len(paths.tool_calls.read_bytes().splitlines()) == 2


def test_a_directory_that_is_not_a_capsule_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CapsuleToolCallSinkError):
        CapsuleToolCallSink(tmp_path).open()


def test_the_timeline_puts_each_tool_call_between_the_model_calls_around_it() -> None:
    tool = record("add", started_at=10.5)
    late = record("mul", started_at=30.0)
    order = interleave(["m0", "m1"], [10.0, "1970-01-01T00:00:20Z"], [late, tool])
    assert order == [("model", "m0"), ("tool", tool), ("model", "m1"), ("tool", late)]


def test_records_show_lists_the_tool_calls_between_the_model_calls(tmp_path: Path) -> None:
    from llmtap.cli.records import records

    with CaptureStore(tmp_path) as store:
        store.append("r1", {"schema_version": 1, "request": {"model": "m", "messages": []}, "started_at": 10.0})
    append_tool_calls(tmp_path, "r1", [record("add", started_at=11.0)])
    result = CliRunner().invoke(records, ["show", str(tmp_path), "r1"], terminal_width=200)
    assert result.exit_code == 0, result.output
    timeline = result.output.split("timeline:", 1)[1]
    assert "1 MCP request(s)" in timeline and "-> tool add  completed  500.0 ms  args 7 B  result 12 B" in timeline
