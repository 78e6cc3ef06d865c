"""Ctrl-C during `llmtap run`: the program is interrupted and the capsule finalised `interrupted`,
with the calls made before the interruption."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.e2e.test_run_sdks import only_capsule
from tests.fixtures import fixture

WORKLOAD = '''
import json, os, sys, time
import openai

with openai.OpenAI(base_url=os.environ["REPLAY_BASE"] + "/v1", api_key="unused", max_retries=0) as client:
    client.chat.completions.create(**json.loads(os.environ["REPLAY_REQUEST"]))
print("ready", flush=True)
time.sleep(60)
'''


def test_an_interrupted_run_keeps_its_calls_and_is_marked_interrupted(replay_upstream: Any, tmp_path: Path) -> None:
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    env = dict(
        os.environ,
        REPLAY_BASE=replay_upstream.base_url,
        REPLAY_REQUEST=json.dumps(fixture("chat/text-basic-gpt4o").request_json),
    )
    command = [sys.executable, "-m", "llmtap.cli.run", "--capsule-dir", str(tmp_path / "runs"), "--", sys.executable, str(script)]
    process = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "ready\n"
        process.send_signal(signal.SIGINT)  # not from a terminal: llmtap forwards it to the program
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signal.SIGINT
    assert "KeyboardInterrupt" in stderr
    capsule = only_capsule(tmp_path)
    manifest = json.loads((capsule / "capsule.json").read_text())
    assert manifest["status"] == "interrupted"
    assert manifest["error"] == {"type": "Interrupted", "signal": "SIGINT"}
    assert manifest["counts"]["model_calls"] == 1
    assert "KeyboardInterrupt" in (capsule / "outputs" / "stderr.txt").read_text()
