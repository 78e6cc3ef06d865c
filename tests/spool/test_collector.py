"""The spool collector: live and at finalisation, torn frames, planted files, counts in flight."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from llmtap.capsule.finalise import CaptureOutcome, finalise_capsule
from llmtap.capsule.manifest import start_manifest
from llmtap.capsule.writer import CapsulePaths, create_capsule
from llmtap.spool.collector import SpoolCollector, drain_spool
from llmtap.spool.frame import (
    KIND_CALL,
    KIND_HEALTH,
    encode_call,
    encode_frame,
    encode_meta,
)
from llmtap.spool.writer import SpoolWriter, spool_directory
from llmtap.store import CaptureStore
from tests.spool.test_frame import _RECORDED, _exchange, _frame_bytes

# --- the collector ------------------------------------------------------------------------------


def _capsule(tmp_path: Path) -> tuple[CapsulePaths, dict[str, Any]]:
    paths = create_capsule(tmp_path / "runs", with_outputs=False)
    manifest = start_manifest(paths, capture_mode="run", command=["agent"], cwd=str(tmp_path), started_at=0.0, registry_source=None)
    return paths, manifest


def _spool_calls(paths: CapsulePaths, count: int, *, first: int = 0, writer: SpoolWriter | None = None) -> SpoolWriter:
    writer = writer or SpoolWriter(spool_directory(paths.root))
    recorded = next(f for f in _RECORDED if f.id == "chat/text-basic-gpt4o")
    for index in range(first, first + count):
        exchange, response_headers = _exchange(recorded)
        exchange.extra["sequence"] = index
        writer.write(encode_call(exchange, dialect="chat", request_headers=[], response_headers=response_headers, body_decoded=False))
    return writer


def _sequences(paths: CapsulePaths, rollout_id: str = "r-1") -> list[int]:
    with CaptureStore(paths.calls, create=False) as store:
        return [line["sequence"] for _, line in store.read(rollout_id).entries]


def test_finalisation_turns_every_frame_into_one_record_in_order_when_no_collector_ran(tmp_path: Path) -> None:
    paths, manifest = _capsule(tmp_path)
    _spool_calls(paths, 25)

    final = finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0))

    assert _sequences(paths) == list(range(25))
    assert final["counts"]["model_calls"] == 25 and final["counts"]["records_dropped"] == 0
    health = json.loads(paths.capture_health.read_text())
    assert health["ok"] is True and health["records"]["captured_calls"] == 25 and health["records"]["written"] == 25
    assert list(spool_directory(paths.root).iterdir()) == []  # every frame is a record now


def test_a_live_collector_and_finalisation_together_record_each_call_once(tmp_path: Path) -> None:
    paths, manifest = _capsule(tmp_path)
    collector = SpoolCollector(paths, interval=0.01).start()
    writer = _spool_calls(paths, 10)
    for _ in range(500):  # the live thread picks them up while the workload runs
        if (paths.calls / "r-1.capture.jsonl").exists() and len(_sequences(paths)) == 10:
            break
        threading.Event().wait(0.01)
    assert _sequences(paths) == list(range(10))
    _spool_calls(paths, 5, first=10, writer=writer)

    finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0))

    assert _sequences(paths) == list(range(15))
    collector.finish()  # idempotent, and finalisation already finished it
    assert _sequences(paths) == list(range(15))


def test_a_workload_that_never_pauses_still_gets_its_records_while_it_runs(tmp_path: Path) -> None:
    paths, manifest = _capsule(tmp_path)
    collector = SpoolCollector(paths, interval=0.01, max_delay=0.2).start()
    writer = _spool_calls(paths, 1)
    seen_live: list[int] = []
    stop = threading.Event()

    def busy_workload() -> None:  # a frame every few milliseconds: the files never stop growing
        sequence = 1
        while not stop.wait(0.003):
            _spool_calls(paths, 1, first=sequence, writer=writer)
            sequence += 1

    workload = threading.Thread(target=busy_workload)
    workload.start()
    try:
        for _ in range(1000):
            if (paths.calls / "r-1.capture.jsonl").exists():
                seen_live = _sequences(paths)
                if seen_live:
                    break
            threading.Event().wait(0.01)
    finally:
        stop.set()
        workload.join()
    finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0))
    collector.finish()

    assert seen_live  # recorded while the workload was still busy
    everything = _sequences(paths)
    assert everything == list(range(len(everything))) and len(everything) > len(seen_live)


def test_a_torn_last_frame_is_counted_as_a_dropped_record(tmp_path: Path) -> None:
    paths, manifest = _capsule(tmp_path)
    writer = _spool_calls(paths, 3)
    with open(writer.path, "ab") as spool:  # a process killed in the middle of its fourth write
        spool.write(b"".join(encode_frame(KIND_CALL, encode_meta({"method": "POST"}), b"x" * 100, b"y" * 100))[:-50])

    final = finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0))

    assert _sequences(paths) == [0, 1, 2]
    health = json.loads(paths.capture_health.read_text())
    assert health["ok"] is False and health["dropped"] == {"record_write_failed": 1}
    assert health["records"]["captured_calls"] == 4 and health["records"]["written"] == 3
    assert final["counts"]["records_dropped"] == 1
    assert [path.name.endswith(".spool.kept") for path in spool_directory(paths.root).iterdir()] == [True]


def test_a_frame_the_recorder_cannot_build_is_counted_and_its_file_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    paths, manifest = _capsule(tmp_path)
    writer = _spool_calls(paths, 1)
    writer.write(encode_frame(KIND_CALL, encode_meta({"method": "POST", "path": "/v1/chat/completions", "started_at": "not a time"})))
    _spool_calls(paths, 1, first=1, writer=writer)

    finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0))

    assert _sequences(paths) == [0, 1]
    health = json.loads(paths.capture_health.read_text())
    assert health["dropped"] == {"record_build_failed": 1}
    assert "record_build_failed" in caplog.text and "ValueError" in caplog.text
    assert len(list(spool_directory(paths.root).glob("*.spool.kept"))) == 1


def test_counts_reported_in_a_spool_file_reach_capture_health(tmp_path: Path) -> None:
    paths, manifest = _capsule(tmp_path)
    writer = _spool_calls(paths, 2)
    writer.write(encode_frame(KIND_HEALTH, encode_meta({"counts": {"hook_failed": 1, "calls_captured": 1}})))

    finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0))

    health = json.loads(paths.capture_health.read_text())
    assert health["dropped"] == {"hook_failed": 1}
    assert health["records"]["captured_calls"] == 3 and health["records"]["written"] == 2
    (process,) = health["processes"]
    assert process["pid"] == os.getpid()


def test_links_and_special_files_in_the_spool_directory_are_never_read(tmp_path: Path) -> None:
    paths, _ = _capsule(tmp_path)
    directory = spool_directory(paths.root)
    directory.mkdir(parents=True)
    outside = tmp_path / "outside.spool"
    outside.write_bytes(_frame_bytes(KIND_HEALTH, {"counts": {"hook_failed": 5}}))
    (directory / "1-link.spool").symlink_to(outside)
    os.mkfifo(directory / "2-fifo.spool")

    drain_spool(paths)

    assert not list(paths.process_health.iterdir())
    assert outside.exists()


def test_finalising_a_capsule_twice_never_records_a_call_twice(tmp_path: Path) -> None:
    paths, manifest = _capsule(tmp_path)
    writer = _spool_calls(paths, 2)
    with open(writer.path, "ab") as spool:
        spool.write(b"garbage that keeps the file for inspection")
    finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0))
    drain_spool(paths)
    assert _sequences(paths) == [0, 1]


def test_a_spool_bigger_than_what_the_collector_holds_at_once_is_drained_whole_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import llmtap.spool.collector as spool_module

    monkeypatch.setattr(spool_module, "_READ_CHUNK", 1000)
    monkeypatch.setattr(spool_module, "_READ_LIMIT", 3000)  # smaller than one frame, and than the file
    paths, manifest = _capsule(tmp_path)
    _spool_calls(paths, 12)

    finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0))

    assert _sequences(paths) == list(range(12))
    assert json.loads(paths.capture_health.read_text())["ok"] is True


# A process under `llmtap run` that opens calls and is killed with them in flight.
_KILLED_WITH_CALLS_OPEN = """
import os, signal, sys
from llmtap.spool.writer import SpoolWriter
writer = SpoolWriter(sys.argv[1])
writer.set_in_flight(1)
writer.set_in_flight(2)
writer.set_in_flight(1)
writer.set_in_flight(2)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_calls_in_flight_when_a_process_is_killed_are_counted_at_finalisation(tmp_path: Path) -> None:
    import subprocess
    import sys

    paths = create_capsule(tmp_path / "runs")
    manifest = start_manifest(paths, capture_mode="run", command=["x"], cwd=str(tmp_path), started_at=0.0, registry_source=None)
    _spool_calls(paths, 1)  # a process that finished its one call ...
    spool = spool_directory(paths.root)
    finished = subprocess.run([sys.executable, "-c", _KILLED_WITH_CALLS_OPEN, str(spool)], check=False, timeout=60)
    assert finished.returncode == -9  # ... and one killed with two calls open, before any frame
    (in_flight,) = spool.glob("*.inflight")
    assert in_flight.read_bytes() == (2).to_bytes(8, "little")
    final = finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0))
    health = json.loads(paths.capture_health.read_bytes())
    assert health["records"]["in_flight_at_exit"] == 2 and health["dropped"] == {"calls_in_flight_at_exit": 2}
    assert health["ok"] is False and final["counts"]["records_dropped"] == 2
    assert list(spool.iterdir()) == []  # the counts are in capture health now


def test_a_process_that_ends_its_calls_leaves_nothing_in_flight(tmp_path: Path) -> None:
    writer = SpoolWriter(tmp_path)
    writer.set_in_flight(1)
    writer.set_in_flight(0)
    (in_flight,) = tmp_path.glob("*.inflight")
    assert in_flight.read_bytes() == bytes(8)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            writer.after_fork()
            writer.set_in_flight(5)  # the child's own file, never the parent's mapping
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert in_flight.read_bytes() == bytes(8)
    assert sorted(int.from_bytes(path.read_bytes(), "little") for path in tmp_path.glob("*.inflight")) == [0, 5]
