"""Two real runs of the demo agent under the real local model, captured by `llmtap serve`, diffed by `llmtap diff`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmtap.demo.run import ServeProcess, run_tool_agent
from llmtap.demo.localmodel import LocalModelServer
from llmtap.store import CaptureStore

pytestmark = pytest.mark.slow

ROLLOUTS = {"demo-0": (17, 25), "demo-1": (40, 2)}


def capture_run(model: LocalModelServer, capture_dir: Path) -> Path:
    with ServeProcess(model.base_url, capture_dir) as serve:
        for rollout_id, question in ROLLOUTS.items():
            run_tool_agent(serve.base_url, rollout_id, question)
    return capture_dir


def llmtap_diff(*args: str | Path) -> tuple[int, dict[str, Any]]:
    command = [sys.executable, "-m", "llmtap", "diff", *map(str, args), "--json"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    return completed.returncode, json.loads(completed.stdout)


def test_two_real_runs_align_call_for_call_and_a_dropped_call_is_named(
    local_model: LocalModelServer, tmp_path: Path
) -> None:
    run_a = capture_run(local_model, tmp_path / "a")
    run_b = capture_run(local_model, tmp_path / "b")
    code, payload = llmtap_diff(run_a, run_b, "--assert-no-regressions")
    # Every call pairs with its counterpart: the same agent on the same tasks makes the same calls,
    # whatever the sampled answers (those show as changed, not as added and removed).
    calls = payload["summary"]["calls"]
    assert calls["added"] == 0 and calls["removed"] == 0
    assert calls["unchanged"] + calls["changed"] == 6
    assert payload["summary"]["a"]["rollouts"] == payload["summary"]["b"]["rollouts"] == 2
    for rollout in payload["rollouts"]:
        assert rollout["call_count"] == {"before": 3, "after": 3}
        assert all(call["status"] == "changed" for call in rollout["calls"])
    assert code == 0, payload["gate"]
    # Streamed calls carry no usage from llama.cpp: unknown, counted as such, never as zero.
    assert payload["summary"]["a"]["tokens_unknown"]["out"] == 4

    # The same second run with its last call of demo-1 dropped: that call, and only it, is removed.
    store_b = CaptureStore(run_b, create=False)
    dropped = CaptureStore(tmp_path / "c")
    for rollout_id in ROLLOUTS:
        lines = [line for _, line in store_b.read(rollout_id).entries]
        for line in lines[:-1] if rollout_id == "demo-1" else lines:
            dropped.append(rollout_id, line)
    dropped.close()
    code, payload = llmtap_diff(run_b, tmp_path / "c", "--assert-no-regressions")
    assert code == 1
    assert payload["summary"]["calls"] == {"unchanged": 5, "changed": 0, "added": 0, "removed": 1}
    (reason,) = payload["gate"]["reasons"]
    assert reason["code"] == "call_removed" and reason["rollout"] == "demo-1" and reason["call_index"] == 2
