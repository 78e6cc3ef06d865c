"""A capsule whose recorder died: told apart from a live one by its runner lock, and finalised from its spool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from llmtap.capsule.manifest import CapsuleError, start_manifest
from llmtap.capsule.recover import RUNNER_ALIVE, RUNNER_GONE, RUNNER_UNKNOWN, recover_capsule, runner_state
from llmtap.capsule.writer import CapsulePaths, create_capsule, hold_runner_lock
from llmtap.cli import main
from tests.spool.test_collector import _spool_calls

# Holds the runner lock the way `llmtap run` does, until its stdin closes.
HOLDER = """
import sys
from llmtap.capsule.writer import hold_runner_lock
fd = hold_runner_lock(sys.argv[1])
print("held", flush=True)
sys.stdin.read()
"""


def _running_capsule(tmp_path: Path, *, with_lock: bool = True) -> CapsulePaths:
    paths = create_capsule(tmp_path / "runs")
    if with_lock:
        os.close(hold_runner_lock(str(paths.runner_lock)))  # a recorder that has died since
    start_manifest(paths, capture_mode="run", command=["python", "agent.py"], cwd=str(tmp_path), started_at=time.time(), registry_source=None)
    return paths


def _hold(paths: CapsulePaths) -> subprocess.Popen[str]:
    paths.runner_lock.unlink(missing_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(paths.runner_lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def _release(holder: subprocess.Popen[str]) -> None:
    holder.communicate(timeout=30)


def test_a_runner_lock_tells_a_live_recorder_from_a_dead_one(tmp_path: Path) -> None:
    paths = _running_capsule(tmp_path)
    holder = _hold(paths)
    try:
        assert runner_state(paths.root) == RUNNER_ALIVE
    finally:
        _release(holder)
    assert runner_state(paths.root) == RUNNER_GONE  # the kernel dropped the lock with the process
    assert runner_state(_running_capsule(tmp_path, with_lock=False).root) == RUNNER_UNKNOWN


def test_a_killed_recorder_never_keeps_its_lock(tmp_path: Path) -> None:
    paths = _running_capsule(tmp_path)
    holder = _hold(paths)
    holder.kill()  # SIGKILL: no handler, no cleanup
    holder.communicate(timeout=30)
    assert runner_state(paths.root) == RUNNER_GONE


def test_recover_finalises_a_dead_run_from_its_spool_as_interrupted(tmp_path: Path) -> None:
    paths = _running_capsule(tmp_path)
    _spool_calls(paths, 3)
    manifest = recover_capsule(paths.root)
    assert manifest["status"] == "interrupted"
    assert manifest["error"]["type"] == "RecorderLost"
    assert manifest["counts"]["model_calls"] == 3 and manifest["recovered"]["reason"]
    on_disk = json.loads(paths.manifest.read_bytes())
    assert on_disk["status"] == "interrupted" and on_disk["counts"]["model_calls"] == 3
    assert len(paths.model_calls.read_bytes().splitlines()) == 3
    assert runner_state(paths.root) == RUNNER_GONE
    with pytest.raises(CapsuleError, match="already finalised"):
        recover_capsule(paths.root)


def test_a_recovery_after_a_finalisation_killed_halfway_records_each_call_once(tmp_path: Path) -> None:
    from llmtap.spool.collector import drain_spool
    from llmtap.spool.writer import spool_directory

    paths = _running_capsule(tmp_path)
    _spool_calls(paths, 3)
    (spool_file,) = spool_directory(paths.root).iterdir()
    spooled = spool_file.read_bytes()
    drain_spool(paths)  # the records are in calls/ ...
    spool_file.write_bytes(spooled)  # ... but the finalisation died before removing the spool file
    manifest = recover_capsule(paths.root)
    assert manifest["counts"]["model_calls"] == 3
    (calls_file,) = paths.calls.glob("*.capture.jsonl")
    origins = [json.loads(line)["capture"]["spool"] for line in calls_file.read_bytes().splitlines()]
    assert origins == [{"file": spool_file.name, "call": number} for number in range(3)]
    health = json.loads(paths.capture_health.read_bytes())
    assert health["records"]["written"] == 3 and health["ok"] is True


def test_recover_refuses_a_run_whose_recorder_is_alive(tmp_path: Path) -> None:
    paths = _running_capsule(tmp_path)
    holder = _hold(paths)
    try:
        with pytest.raises(CapsuleError, match="still being recorded"):
            recover_capsule(paths.root)
    finally:
        _release(holder)
    assert json.loads(paths.manifest.read_bytes())["status"] == "running"


def test_recover_refuses_a_run_with_no_runner_lock(tmp_path: Path) -> None:
    paths = _running_capsule(tmp_path, with_lock=False)
    with pytest.raises(CapsuleError, match="no runner lock"):
        recover_capsule(paths.root)


@pytest.mark.parametrize("planted", ["symlink", "fifo"])
def test_a_planted_runner_lock_never_counts_as_a_gone_recorder(tmp_path: Path, planted: str) -> None:
    paths = _running_capsule(tmp_path, with_lock=False)
    outside = tmp_path / "outside.lock"
    outside.write_bytes(b"")
    if planted == "symlink":
        paths.runner_lock.symlink_to(outside)
    else:
        os.mkfifo(paths.runner_lock)
    assert runner_state(paths.root) == RUNNER_UNKNOWN
    with pytest.raises(CapsuleError, match="no runner lock"):
        recover_capsule(paths.root)


def _cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def test_runs_list_flags_a_stale_run_and_runs_recover_finalises_it(tmp_path: Path) -> None:
    stale = _running_capsule(tmp_path)
    _spool_calls(stale, 2)
    live = _running_capsule(tmp_path)
    holder = _hold(live)
    try:
        listed = _cli("runs", "list", "--capsule-dir", str(tmp_path / "runs"))
        assert listed.exit_code == 0, listed.output
        rows = {line.split()[0]: line.split()[1] for line in listed.output.splitlines()[1:]}
        assert rows == {stale.run_id: "stale", live.run_id: "running"}
        as_json = json.loads(_cli("runs", "list", "--json", "--capsule-dir", str(tmp_path / "runs")).output)
        assert {entry["run_id"]: entry["runner"] for entry in as_json} == {stale.run_id: "gone", live.run_id: "alive"}
        recovered = _cli("runs", "recover", stale.run_id, "--capsule-dir", str(tmp_path / "runs"))
        assert recovered.exit_code == 0, recovered.output
        assert f"Recovered run {stale.run_id}: status interrupted, 2 call(s)" in recovered.output
        refused = _cli("runs", "recover", live.run_id, "--capsule-dir", str(tmp_path / "runs"))
        assert refused.exit_code == 1 and "still being recorded" in refused.output
    finally:
        _release(holder)
    listed = _cli("runs", "list", "--capsule-dir", str(tmp_path / "runs"))
    rows = {line.split()[0]: line.split()[1] for line in listed.output.splitlines()[1:]}
    assert rows == {stale.run_id: "interrupted", live.run_id: "stale"}
