"""Links, FIFOs and hard links planted where the store and `llmtap run` write: refused, counted, never followed.

Every planting points at a file or directory outside the capture directory; each test checks that
the outside thing is byte-identical afterwards, that nothing hangs (each step runs under a
timeout on a thread), and that the failure is counted (the store's counter, the rollout's
incomplete marker, or the capsule's capture-health.json).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from llmtap.capsule.finalise import CaptureOutcome, finalise_capsule
from llmtap.capsule.health import write_process_health
from llmtap.capsule.manifest import start_manifest
from llmtap.capsule.writer import create_capsule
from llmtap.errors import CaptureDirectoryError, StoreError, UnsafeCaptureFileError
from llmtap.spool.collector import SpoolCollector
from llmtap.spool.frame import KIND_CALL, encode_frame, encode_meta
from llmtap.spool.writer import SpoolWriter, spool_directory
from llmtap.store import CaptureStore
from tests.fixtures import fixture
from tests.spool.test_collector import _spool_calls

T = TypeVar("T")
TIMEOUT = 20.0
OUTSIDE_BYTES = b"outside the capture directory: must never change\n"
RECORD = {"started_at": 1.0, "request": {"path": "/v1/chat/completions"}, "response": {"status": 200}}


def within(action: Callable[[], T], seconds: float = TIMEOUT) -> T:
    """Run `action` on a thread and fail the test if it has not returned in time (a FIFO hang)."""
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append(("value", action()))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(("error", exc))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"{action} did not return within {seconds} s: it blocked"
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value  # type: ignore[no-any-return]


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    target = tmp_path / "outside" / "precious.txt"
    target.parent.mkdir()
    target.write_bytes(OUTSIDE_BYTES)
    return target


def plant(kind: str, at: Path, outside: Path) -> None:
    if kind == "symlink":
        at.symlink_to(outside)
    elif kind == "dangling-symlink":
        at.symlink_to(outside.parent / "not-yet-there")
    elif kind == "fifo":
        os.mkfifo(at)
    elif kind == "hardlink":
        os.link(outside, at)
    else:
        raise AssertionError(kind)


def assert_outside_untouched(outside: Path) -> None:
    assert outside.read_bytes() == OUTSIDE_BYTES
    assert sorted(path.name for path in outside.parent.iterdir()) == ["precious.txt"]


# --- the store -----------------------------------------------------------------------------------

PLANTINGS = ["symlink", "dangling-symlink", "fifo", "hardlink"]


@pytest.mark.parametrize("kind", PLANTINGS)
@pytest.mark.parametrize("suffix", [".capture.jsonl", ".capture.lock"])
def test_a_blocking_append_refuses_a_planted_data_or_lock_file(tmp_path: Path, outside: Path, suffix: str, kind: str) -> None:
    root = tmp_path / "calls"
    root.mkdir()
    plant(kind, root / f"r{suffix}", outside)
    with CaptureStore(root) as store:
        with pytest.raises(StoreError) as raised:
            within(lambda: store.append("r", RECORD))
        assert isinstance(raised.value.__cause__, UnsafeCaptureFileError)
        assert store.failure_counts() == {"unsafe_file": 1}
        result = store.read("r") if suffix != ".capture.jsonl" else None
    assert_outside_untouched(outside)
    marker = root / "r.capture.incomplete"
    assert marker.is_file() and not marker.is_symlink()
    assert json.loads(marker.read_bytes())["failures"] == 1
    if result is not None:
        assert result.incomplete and result.capture_failures == 1 and result.entries == []


@pytest.mark.parametrize("kind", PLANTINGS)
def test_an_awaited_append_refuses_a_planted_data_file_without_blocking_the_loop(
    tmp_path: Path, outside: Path, kind: str
) -> None:
    plant(kind, tmp_path / "r.capture.jsonl", outside)

    async def append_twice() -> list[Any]:
        with CaptureStore(tmp_path) as store:
            first = store.append_async("r", RECORD, alone=True)
            second = store.append_async("r", RECORD)
            outcomes = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), TIMEOUT)
            return [*outcomes, store.failure_counts()]

    first, second, counts = within(lambda: asyncio.run(append_twice()))
    assert isinstance(first, StoreError) and isinstance(second, StoreError)
    assert counts["unsafe_file"] >= 1
    assert_outside_untouched(outside)
    assert json.loads((tmp_path / "r.capture.incomplete").read_bytes())["failures"] == 2


@pytest.mark.parametrize("kind", PLANTINGS)
def test_a_planted_incomplete_marker_is_replaced_never_followed(tmp_path: Path, outside: Path, kind: str) -> None:
    plant(kind, tmp_path / "r.capture.incomplete", outside)
    with CaptureStore(tmp_path) as store:
        within(lambda: store.mark_incomplete("r", "test"))
        within(lambda: store.mark_incomplete("r", "test again"))
        result = within(lambda: store.read("r"))
    assert_outside_untouched(outside)
    marker = tmp_path / "r.capture.incomplete"
    assert marker.is_file() and not marker.is_symlink() and os.stat(marker).st_nlink == 1
    assert result.incomplete and result.capture_failures == 3  # the planted one counted as one, then two more


@pytest.mark.parametrize("kind", PLANTINGS)
def test_a_planted_tombstone_is_refused_at_append_and_replaced_by_clear(tmp_path: Path, outside: Path, kind: str) -> None:
    plant(kind, tmp_path / "r.capture.cleared", outside)
    with CaptureStore(tmp_path) as store:
        with pytest.raises(StoreError):
            within(lambda: store.append("r", RECORD))
        within(lambda: store.clear("r"))  # the fence is rewritten by rename over the planted name
        assert not (tmp_path / "r.capture.cleared").is_symlink()
        store.append("r", {**RECORD, "started_at": time.time() + 1})
        assert len(store.read("r").entries) == 1
    assert_outside_untouched(outside)


@pytest.mark.parametrize("kind", PLANTINGS)
def test_a_planted_late_file_is_refused(tmp_path: Path, outside: Path, kind: str) -> None:
    with CaptureStore(tmp_path) as store:
        store.clear("r")
        plant(kind, tmp_path / "r.capture.late.jsonl", outside)
        with pytest.raises(StoreError) as raised:
            within(lambda: store.append("r", RECORD))  # started before the clear: a late write
        assert isinstance(raised.value.__cause__, UnsafeCaptureFileError)
        assert store.failure_counts() == {"unsafe_file": 1}
    assert_outside_untouched(outside)


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_clear_removes_a_planted_data_file_as_a_name_only(tmp_path: Path, outside: Path, kind: str) -> None:
    plant(kind, tmp_path / "r.capture.jsonl", outside)
    with CaptureStore(tmp_path) as store:
        within(lambda: store.clear("r"))
    assert not os.path.lexists(tmp_path / "r.capture.jsonl")
    assert_outside_untouched(outside)


@pytest.mark.parametrize("kind", ["symlink", "fifo", "hardlink"])
def test_reading_a_planted_data_file_is_refused_without_hanging(tmp_path: Path, outside: Path, kind: str) -> None:
    plant(kind, tmp_path / "r.capture.jsonl", outside)
    with CaptureStore(tmp_path, create=False) as store:
        if kind == "hardlink":  # a second name is refused for append only; its content reads as damage
            assert within(lambda: store.read("r")).invalid_count == 1
        else:
            with pytest.raises(StoreError) as raised:
                within(lambda: store.read("r"))
            assert isinstance(raised.value.__cause__, UnsafeCaptureFileError)
    assert_outside_untouched(outside)


def test_a_fifo_swapped_in_for_an_open_data_file_neither_blocks_nor_receives_lines(tmp_path: Path) -> None:
    async def append_then_swap() -> None:
        with CaptureStore(tmp_path) as store:
            await store.append_async("r", RECORD)  # the data file is open, and known to the sync helper
            os.rename(tmp_path / "r.capture.jsonl", tmp_path / "moved.jsonl")
            os.mkfifo(tmp_path / "r.capture.jsonl")
            await asyncio.wait_for(store.append_async("r", RECORD), TIMEOUT)
        with CaptureStore(tmp_path) as fresh, pytest.raises(StoreError):  # opening the name now refuses the FIFO
            await asyncio.wait_for(fresh.append_async("r", RECORD), TIMEOUT)

    within(lambda: asyncio.run(append_then_swap()))
    assert len((tmp_path / "moved.jsonl").read_bytes().splitlines()) == 2  # the file written all along


def test_a_capture_directory_swapped_for_a_link_after_opening_gets_no_line(tmp_path: Path, outside: Path) -> None:
    root = tmp_path / "calls"
    root.mkdir()
    with CaptureStore(root) as store:
        store.append("r", RECORD)
        root.rename(tmp_path / "calls-moved")
        root.symlink_to(outside.parent, target_is_directory=True)
        store.append("r", RECORD)
        store.append("s", RECORD)
    assert_outside_untouched(outside)
    assert len((tmp_path / "calls-moved" / "r.capture.jsonl").read_bytes().splitlines()) == 2
    assert (tmp_path / "calls-moved" / "s.capture.jsonl").is_file()


def test_a_store_refusing_links_rejects_a_linked_directory(tmp_path: Path, outside: Path) -> None:
    (tmp_path / "calls").symlink_to(outside.parent, target_is_directory=True)
    with pytest.raises(CaptureDirectoryError, match="symbolic link"):
        CaptureStore(tmp_path / "calls", refuse_links=True)
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "via").symlink_to(real, target_is_directory=True)
    with pytest.raises(CaptureDirectoryError, match="symbolic link"):
        CaptureStore(tmp_path / "via" / "calls", refuse_links=True)  # a link higher up the path
    assert_outside_untouched(outside)


# --- a capsule -----------------------------------------------------------------------------------


def _capsule(tmp_path: Path) -> Any:
    paths = create_capsule(tmp_path / "runs")
    manifest = start_manifest(paths, capture_mode="run", command=["x"], cwd=str(tmp_path), started_at=time.time(), registry_source=None)
    return paths, manifest


def _spool_one_call(paths: Any) -> None:
    """One call of a recorded exchange, spooled as a workload process writes it."""
    _spool_calls(paths, 1)


def _outside_directory(tmp_path: Path) -> Path:
    """A directory outside the capsule holding a file, a link, a FIFO and a socket: all must survive."""
    directory = tmp_path / "elsewhere"
    directory.mkdir()
    (directory / "keep.txt").write_bytes(OUTSIDE_BYTES)
    (directory / "keep.capture.jsonl").write_bytes(OUTSIDE_BYTES)
    (directory / "link").symlink_to(directory / "keep.txt")
    os.mkfifo(directory / "fifo")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(directory / "sock"))
    listener.close()
    return directory


def _entries(directory: Path) -> dict[str, bytes | str]:
    found: dict[str, bytes | str] = {}
    for path in directory.iterdir():
        found[path.name] = path.read_bytes() if path.is_file() and not path.is_symlink() else os.readlink(path) if path.is_symlink() else "special"
    return found


@pytest.mark.parametrize("managed", ["calls", "internal/health", "internal/spool", "outputs"])
def test_finalising_never_touches_what_a_managed_directory_link_points_to(tmp_path: Path, managed: str) -> None:
    paths, manifest = _capsule(tmp_path)
    elsewhere = _outside_directory(tmp_path)
    before = _entries(elsewhere)
    target = paths.root / managed
    if target.exists():
        os.rmdir(target)
    target.symlink_to(elsewhere, target_is_directory=True)
    final = within(lambda: finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0)))
    assert _entries(elsewhere) == before
    assert {"path": managed, "kind": "symlink"} in final["capture_tampered"]
    health = json.loads(paths.capture_health.read_bytes())
    assert health["ok"] is False and {"path": managed, "kind": "symlink"} in health["tampered_entries"]
    assert not target.is_symlink()


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
@pytest.mark.parametrize("name", ["capture-health.json", "model-calls.jsonl", "env.lock", "internal/interpreter", "outputs/stdout.txt"])
def test_finalising_replaces_a_planted_managed_file_and_never_follows_it(tmp_path: Path, outside: Path, name: str, kind: str) -> None:
    paths, manifest = _capsule(tmp_path)
    planted = paths.root / name
    planted.unlink(missing_ok=True)
    plant(kind, planted, outside)
    final = within(lambda: finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0)))
    assert_outside_untouched(outside)
    assert {"path": name, "kind": kind} in final["capture_tampered"]
    assert not os.path.islink(planted)


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_finalising_removes_planted_entries_inside_calls_only(tmp_path: Path, outside: Path, kind: str) -> None:
    paths, manifest = _capsule(tmp_path)
    plant(kind, paths.calls / "r1.capture.jsonl", outside)
    _spool_one_call(paths)
    final = within(lambda: finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0)))
    assert_outside_untouched(outside)
    assert {"path": "calls/r1.capture.jsonl", "kind": kind} in final["capture_tampered"]
    assert final["counts"]["model_calls"] == 1  # the spooled call still became its record, in the capsule


def test_the_spool_collector_never_writes_records_through_a_calls_link(tmp_path: Path) -> None:
    paths, _ = _capsule(tmp_path)
    elsewhere = _outside_directory(tmp_path)
    before = _entries(elsewhere)
    os.rmdir(paths.calls)
    paths.calls.symlink_to(elsewhere, target_is_directory=True)
    _spool_one_call(paths)
    collector = SpoolCollector(paths)
    within(lambda: collector._collect(final=False))  # what the live thread does while the workload runs
    assert _entries(elsewhere) == before
    within(collector.finish)
    health = [json.loads(path.read_bytes()) for path in paths.process_health.glob("*.json")]
    assert sum(entry["counts"].get("record_write_failed", 0) for entry in health) == 1
    assert _entries(elsewhere) == before


def test_the_spool_collector_never_reads_or_removes_spool_files_through_a_link(tmp_path: Path) -> None:
    paths, manifest = _capsule(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    SpoolWriter(elsewhere).write(encode_frame(KIND_CALL, encode_meta({"not": "ours"})))
    before = _entries(elsewhere)
    spool_directory(paths.root).symlink_to(elsewhere, target_is_directory=True)
    final = within(lambda: finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0)))
    assert _entries(elsewhere) == before
    assert final["counts"]["model_calls"] == 0


def test_process_health_is_never_written_through_a_linked_directory(tmp_path: Path) -> None:
    paths, _ = _capsule(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.rmdir(paths.process_health)
    paths.process_health.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(OSError):
        write_process_health(paths.process_health / "1.json", {"calls_captured": 1})
    assert list(elsewhere.iterdir()) == []


WORKLOAD_SWAPPING_CALLS = """
import os, sys, json, time, shutil
import httpx
capsule = os.environ["LLMTAP_RUN_CAPSULE"]
calls = os.path.join(capsule, "calls")
os.rename(calls, calls + "-gone")
os.symlink(sys.argv[1], calls)
with httpx.Client() as client:
    client.post(os.environ["REPLAY_BASE"] + "/v1/chat/completions", json=json.loads(os.environ["REPLAY_REQUEST"]))
"""


def test_a_real_run_whose_workload_swaps_calls_for_a_link_writes_nothing_through_it(replay_upstream: Any, tmp_path: Path) -> None:
    elsewhere = _outside_directory(tmp_path)
    before = _entries(elsewhere)
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD_SWAPPING_CALLS)
    env = dict(
        os.environ,
        REPLAY_BASE=replay_upstream.base_url,
        REPLAY_REQUEST=json.dumps(fixture("chat/text-basic-gpt4o").request_json),
    )
    command = [sys.executable, "-m", "llmtap.cli.run", "--capsule-dir", str(tmp_path / "runs"), "--", sys.executable, str(script), str(elsewhere)]
    finished = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, check=False, timeout=120)
    assert finished.returncode == 0, finished.stderr
    assert _entries(elsewhere) == before
    (capsule,) = (tmp_path / "runs").iterdir()
    manifest = json.loads((capsule / "capsule.json").read_bytes())
    assert {"path": "calls", "kind": "symlink"} in manifest["capture_tampered"]
    assert manifest["counts"]["model_calls"] == 1  # the call was spooled, then recorded into a real calls/
    assert not (capsule / "calls").is_symlink()


WORKLOAD_SWAPPING_THE_CAPSULE = """
import os, sys
capsule = os.environ["LLMTAP_RUN_CAPSULE"]
os.rename(capsule, capsule + "-moved")
os.symlink(sys.argv[1], capsule)
"""


def test_a_real_run_whose_workload_swaps_the_capsule_itself_for_a_link_touches_nothing_there(tmp_path: Path) -> None:
    elsewhere = _outside_directory(tmp_path)
    for name in ("calls", "internal"):  # shaped like a capsule, so a followed link would find work to do
        (elsewhere / name).mkdir()
        os.mkfifo(elsewhere / name / "fifo")
    before = {name: _entries(elsewhere / name) for name in ("", "calls", "internal")}
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD_SWAPPING_THE_CAPSULE)
    command = [sys.executable, "-m", "llmtap.cli.run", "--capsule-dir", str(tmp_path / "runs"), "--", sys.executable, str(script), str(elsewhere)]
    finished = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, check=False, timeout=120)
    assert finished.returncode != 0 and "was replaced" in finished.stderr
    assert {name: _entries(elsewhere / name) for name in ("", "calls", "internal")} == before
    (moved,) = (tmp_path / "runs").glob("*-moved")
    assert json.loads((moved / "capsule.json").read_bytes())["status"] == "running"  # honest: never finalised


def test_recover_refuses_a_link_in_place_of_a_capsule(tmp_path: Path) -> None:
    from llmtap.capsule.manifest import CapsuleError
    from llmtap.capsule.recover import recover_capsule

    paths, _ = _capsule(tmp_path)
    moved = paths.root.with_name(paths.root.name + "-moved")
    paths.root.rename(moved)
    paths.root.symlink_to(moved, target_is_directory=True)
    with pytest.raises(CapsuleError, match="symbolic link"):
        recover_capsule(paths.root)
    with pytest.raises(CapsuleError, match="was replaced"):
        finalise_capsule(paths, {}, CaptureOutcome("success", exit_code=0))
