"""Capture that fails on every record never changes the program; the capsule counts each loss."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.e2e.test_run_sdks import llmtap_run, only_capsule
from tests.fixtures import fixture

WORKLOAD = '''
import json, os, sys
import httpx2, openai

if os.environ.get("LLMTAP_RUN_CAPSULE"):
    from llmtap.hooks.session import active_session

    def refuse(call):
        raise RuntimeError("forced failure of every record")

    active_session().frame_builder = refuse  # the hook now fails to hand over every call

BASE = os.environ["REPLAY_BASE"]
with openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0) as client:
    answers = [client.chat.completions.create(**json.loads(os.environ["REPLAY_REQUEST"])).model_dump() for _ in range(3)]
    stream = client.chat.completions.create(**json.loads(os.environ["REPLAY_STREAM"]))
    answers.append([chunk.model_dump() for chunk in stream])
print(json.dumps(answers, sort_keys=True))
'''


def test_a_hook_failing_on_every_record_leaves_results_unchanged_and_counts_each_drop(
    replay_upstream: Any, tmp_path: Path
) -> None:
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    env = dict(
        os.environ,
        REPLAY_BASE=replay_upstream.base_url,
        REPLAY_REQUEST=json.dumps(fixture("chat/text-basic-gpt4o").request_json),
        REPLAY_STREAM=json.dumps(fixture("chat/text-stream-include-usage-gpt4").request_json),
    )
    plain = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr

    captured = llmtap_run(["--", sys.executable, str(script)], env, tmp_path)

    assert captured.returncode == 0, captured.stderr
    assert captured.stdout == plain.stdout
    assert "record_build_failed" in captured.stderr and "RuntimeError" in captured.stderr
    assert "forced failure" not in captured.stderr  # the exception type is logged, never its message
    capsule = only_capsule(tmp_path)
    health = json.loads((capsule / "capture-health.json").read_text())
    assert health["ok"] is False
    assert health["dropped"] == {"record_build_failed": 4}
    manifest = json.loads((capsule / "capsule.json").read_text())
    assert manifest["status"] == "success"
    assert manifest["counts"]["model_calls"] == 0 and manifest["counts"]["records_dropped"] == 4
