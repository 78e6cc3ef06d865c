"""A workload under `llmtap run` that ends abruptly right after its calls keeps their records:
SIGTERM and SIGKILL from outside, `os._exit` from inside, and a multiprocessing pool terminated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_run_sdks import only_capsule
from tests.fixtures import fixture

WORKLOAD = '''
import json, os, sys, time
import httpx

request = json.loads(os.environ["REPLAY_REQUEST"])
with httpx.Client() as client:
    for _ in range(3):
        client.post(os.environ["REPLAY_BASE"] + "/v1/chat/completions", json=request)
    with client.stream("POST", os.environ["REPLAY_BASE"] + "/v1/chat/completions", json=json.loads(os.environ["REPLAY_STREAM"])) as streamed:
        for _ in streamed.iter_bytes():
            pass
if sys.argv[1] == "os._exit":
    os._exit(0)
print(os.getpid(), flush=True)
time.sleep(60)
'''

POOL_WORKLOAD = '''
import json, os, time, multiprocessing as mp
import httpx

def ask(_):
    with httpx.Client() as client:
        client.post(os.environ["REPLAY_BASE"] + "/v1/chat/completions", json=json.loads(os.environ["REPLAY_REQUEST"]))
    return os.getpid()

if __name__ == "__main__":
    pool = mp.get_context("fork").Pool(2)
    print(len(pool.map(ask, range(4))), flush=True)
    pool.terminate()  # SIGTERM to the workers: no exit handler runs in them
    pool.join()
'''


def _run(script: Path, arguments: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "llmtap.cli.run", "--capsule-dir", str(cwd / "runs"), "--", sys.executable, str(script), *arguments]
    return subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _environment(replay_upstream: Any) -> dict[str, str]:
    return dict(
        os.environ,
        REPLAY_BASE=replay_upstream.base_url,
        REPLAY_REQUEST=json.dumps(fixture("chat/text-basic-gpt4o").request_json),
        REPLAY_STREAM=json.dumps(fixture("chat/text-stream-include-usage-gpt4").request_json),
    )


@pytest.mark.parametrize("ending", ["SIGTERM", "SIGKILL", "os._exit"])
def test_a_workload_ending_abruptly_right_after_its_calls_keeps_every_record(
    ending: str, replay_upstream: Any, tmp_path: Path
) -> None:
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    process = _run(script, [ending], _environment(replay_upstream), tmp_path)
    try:
        assert process.stdout is not None
        if ending != "os._exit":
            workload_pid = int(process.stdout.readline())
            os.kill(workload_pid, getattr(signal, ending))  # the workload alone, right after its last call
        process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()

    capsule = only_capsule(tmp_path)
    manifest = json.loads((capsule / "capsule.json").read_text())
    assert manifest["counts"]["model_calls"] == 4
    lines = [json.loads(line) for line in (capsule / "calls" / "default.capture.jsonl").read_text().splitlines()]
    assert [line.get("stream", False) for line in lines] == [False, False, False, True]
    assert all(line["error_category"] is None and line["response"] for line in lines)
    health = json.loads((capsule / "capture-health.json").read_text())
    assert health["records"]["written"] == 4 and health["dropped"] == {}


def test_workers_of_a_terminated_pool_keep_their_records(replay_upstream: Any, tmp_path: Path) -> None:
    script = tmp_path / "pool.py"
    script.write_text(POOL_WORKLOAD)
    process = _run(script, [], _environment(replay_upstream), tmp_path)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    assert stdout == "4\n"

    capsule = only_capsule(tmp_path)
    lines = [json.loads(line) for line in (capsule / "calls" / "default.capture.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and all(line["response"] for line in lines)
    assert json.loads((capsule / "capsule.json").read_text())["counts"]["model_calls"] == 4
