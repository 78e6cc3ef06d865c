"""A real `llmtap run` losing its recorder, a workload killed mid-call, and a Python that skips the hooks:
none of them leaves a capsule that looks fine when it is not."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from llmtap.cli import main
from tests.fixtures import fixture

CALLS_THEN_WAIT = """
import json, os, sys, time
import httpx

with httpx.Client() as client:
    for _ in range(3):
        client.post(os.environ["REPLAY_BASE"] + "/v1/chat/completions", json=json.loads(os.environ["REPLAY_REQUEST"]))
print(os.getpid(), flush=True)
time.sleep(60)
"""

KILLED_MID_CALL = """
import json, os, signal
import httpx

with httpx.Client() as client:
    client.post(os.environ["REPLAY_BASE"] + "/v1/chat/completions", json=json.loads(os.environ["REPLAY_REQUEST"]))
    # Pieces 5 s apart: the first arrives, the rest of the answer is still to come.
    with client.stream("POST", os.environ["STALLING"] + "/v1/chat/completions", json=json.loads(os.environ["REPLAY_STREAM"])) as streamed:
        pieces = streamed.iter_bytes()  # kept: a dropped iterator would end the call as abandoned
        next(pieces)
        os.kill(os.getpid(), signal.SIGKILL)  # in the middle of the call: no frame, no exit handler
"""

ISOLATED = """
import json, os
import httpx

with httpx.Client() as client:
    client.post(os.environ["REPLAY_BASE"] + "/v1/chat/completions", json=json.loads(os.environ["REPLAY_REQUEST"]))
"""


def _environment(replay_upstream: Any) -> dict[str, str]:
    return dict(
        os.environ,
        REPLAY_BASE=replay_upstream.base_url,
        REPLAY_REQUEST=json.dumps(fixture("chat/text-basic-gpt4o").request_json),
        REPLAY_STREAM=json.dumps(fixture("chat/text-stream-include-usage-gpt4").request_json),
    )


def _run_command(tmp_path: Path, *workload: str) -> list[str]:
    return [sys.executable, "-m", "llmtap.cli.run", "--capsule-dir", str(tmp_path / "runs"), "--", *workload]


def _only_capsule(tmp_path: Path) -> Path:
    (capsule,) = (tmp_path / "runs").iterdir()
    return capsule


def _wait_until_gone(pid: int) -> None:
    """Wait for a process that is not our child (a zombie waiting for its reaper counts as gone)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} is still running")


def test_a_run_whose_recorder_was_killed_is_listed_stale_and_recovered_with_every_call(
    replay_upstream: Any, tmp_path: Path
) -> None:
    script = tmp_path / "workload.py"
    script.write_text(CALLS_THEN_WAIT)
    recorder = subprocess.Popen(
        _run_command(tmp_path, sys.executable, str(script)), env=_environment(replay_upstream), cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert recorder.stdout is not None
        workload_pid = int(recorder.stdout.readline())  # echoed by the recorder: its three calls are done
        recorder.send_signal(signal.SIGKILL)  # the recorder itself, as the OOM killer would
        recorder.communicate(timeout=60)
    finally:
        if recorder.poll() is None:
            recorder.kill()
    os.kill(workload_pid, signal.SIGKILL)
    _wait_until_gone(workload_pid)

    capsule = _only_capsule(tmp_path)
    assert json.loads((capsule / "capsule.json").read_bytes())["status"] == "running"
    runs = ["--capsule-dir", str(tmp_path / "runs")]
    listed = CliRunner().invoke(main, ["runs", "list", *runs])
    assert listed.exit_code == 0 and f"{capsule.name}  stale" in listed.output

    recovered = CliRunner().invoke(main, ["runs", "recover", capsule.name, *runs])
    assert recovered.exit_code == 0, recovered.output
    assert "status interrupted, 3 call(s) in 1 rollout(s)" in recovered.output
    manifest = json.loads((capsule / "capsule.json").read_bytes())
    assert manifest["status"] == "interrupted" and manifest["error"]["type"] == "RecorderLost"
    assert len((capsule / "model-calls.jsonl").read_bytes().splitlines()) == 3
    assert "interrupted" in CliRunner().invoke(main, ["runs", "list", *runs]).output


def test_a_workload_killed_mid_call_leaves_the_call_marked_in_flight(
    replay_upstream: Any, fault_upstream: Any, tmp_path: Path
) -> None:
    script = tmp_path / "workload.py"
    script.write_text(KILLED_MID_CALL)
    env = dict(_environment(replay_upstream), STALLING=fault_upstream.url("stall-between-5"))
    finished = subprocess.run(
        _run_command(tmp_path, sys.executable, str(script)), env=env, cwd=tmp_path,
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert finished.returncode == 128 + signal.SIGKILL, finished.stderr
    capsule = _only_capsule(tmp_path)
    health = json.loads((capsule / "capture-health.json").read_bytes())
    assert health["ok"] is False
    assert health["records"]["in_flight_at_exit"] == 1 and health["dropped"]["calls_in_flight_at_exit"] == 1
    assert health["records"]["in_store"] == 1  # the call that had ended is recorded
    assert "1 record(s) dropped" in finished.stderr


def test_a_python_that_skips_the_hooks_is_reported_not_captured_as_nothing(replay_upstream: Any, tmp_path: Path) -> None:
    script = tmp_path / "workload.py"
    script.write_text(ISOLATED)
    finished = subprocess.run(
        _run_command(tmp_path, sys.executable, "-I", str(script)), env=_environment(replay_upstream), cwd=tmp_path,
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert finished.returncode == 0, finished.stderr
    assert "llmtap: warning:" in finished.stderr and "-I (isolated mode) ignores PYTHONPATH" in finished.stderr
    capsule = _only_capsule(tmp_path)
    health = json.loads((capsule / "capture-health.json").read_bytes())
    assert health["ok"] is False
    assert health["uncaptured_processes"] == [
        {"command": sys.executable, "flag": "-I", "reason": "-I (isolated mode) ignores PYTHONPATH, so its model calls are not captured"}
    ]
    assert json.loads((capsule / "capsule.json").read_bytes())["counts"]["model_calls"] == 0
    assert "capture health not ok" in finished.stderr
