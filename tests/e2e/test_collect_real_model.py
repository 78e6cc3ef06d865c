"""`llmtap collect` as a user runs it: the real local model behind `llmtap serve`, the reference agent,
the command in its own process; then the same collection killed midway and resumed."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from llmtap.demo.agent import SimpleAgentConfig, build_app
from llmtap.dialects.history import request_items, response_items
from llmtap.demo.localmodel import LocalModelServer
from llmtap.records import ModelCallRecord
from llmtap.rollouts.collect.files import attempts_path_for
from llmtap.rollouts.trajectory import model_visible_history, model_visible_input
from llmtap.store import CaptureStore
from llmtap.store.readers import read_rollout_calls
from tests.e2e.serve_harness import serving
from tests.support.servers import ServerThread

pytestmark = pytest.mark.slow

COLLECT_COMMAND = [sys.executable, "-c", "from llmtap.cli.collect import collect; collect(prog_name='llmtap collect')"]
TASKS = [
    {"question": "What is 17 + 25?", "a": 17, "b": 25, "expected": 42},
    {"question": "What is 40 + 2?", "a": 40, "b": 2, "expected": 42},
]


@pytest.fixture
def agent_url(local_model: LocalModelServer, tmp_path: Path) -> Iterator[str]:
    """The reference agent, its model calls going through `llmtap serve` (capturing into tmp/calls)."""
    with serving(local_model.base_url, tmp_path / "calls") as (proxy, _):
        config = SimpleAgentConfig(
            model_url=proxy.base_url,
            model_ref={"type": "responses_api_models", "name": "policy"},
            max_turns=3,
            max_tokens=24,
        )
        server = ServerThread(build_app(config), graceful_timeout=60)
        server._server.config.lifespan = "on"
        with server.start():
            yield server.base_url


def rows_of(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def check_row(row: dict[str, Any], store: CaptureStore) -> list[ModelCallRecord]:
    """Everything one output row must carry, checked against the raw capture; returns its calls."""
    capture = row["ng_model_call_capture"]
    records = read_rollout_calls(store, capture["rollout_id"]).records
    assert records and "gaps" not in capture
    assert [call["model_call_id"] for call in capture["calls"]] == [r.model_call_id for r in records]
    metrics = capture["metrics"]
    assert metrics["num_calls"] == len(records)
    for total, field in (("tokens_in", "tokens_in"), ("tokens_out", "tokens_out"), ("tokens_total", "tokens_total")):
        assert metrics[total] == sum(getattr(r, field) for r in records)  # llama.cpp reports usage unstreamed
    trajectory = row["ng_trajectory"]
    for record in records:  # the history the trajectory keeps is exactly what the model saw and said
        seen = request_items(record.dialect, record.request)
        said = response_items(record.dialect, record.response)
        assert model_visible_input(trajectory, record.model_call_id) == seen
        assert model_visible_history(trajectory, record.model_call_id) == seen + said  # type: ignore[operator]
    [returned] = [r for r in records if r.response == row["response"]]
    assert capture["attribution"]["model_call_id"] == returned.model_call_id
    assert row["turns"] == len(records) and isinstance(row["reward"], float)
    return records


def test_collect_attaches_calls_trajectory_and_attribution_and_resumes_after_a_kill(agent_url: str, tmp_path: Path) -> None:
    store = CaptureStore(tmp_path / "calls")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(task) + b"\n" for task in TASKS))
    first = tmp_path / "first.jsonl"
    common = ["--agent-url", agent_url, "--input", str(tasks), "--capture-dir", str(tmp_path / "calls"), "--num-repeats", "2"]
    done = subprocess.run([*COLLECT_COMMAND, *common, "--output", str(first)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    rows = rows_of(first)
    assert sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    first_calls = {r.model_call_id for row in rows for r in check_row(row, store)}

    # The same rollouts again, killed hard once a row is written, then resumed.
    second = tmp_path / "second.jsonl"
    process = subprocess.Popen(
        [*COLLECT_COMMAND, *common, "--output", str(second), "--concurrency", "2", "--no-progress"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not (second.exists() and second.read_bytes().count(b"\n") >= 1):
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        process.send_signal(signal.SIGKILL)
        process.wait(30)
    finally:
        process.kill()
    written = {row["ng_model_call_capture"]["rollout_id"] for row in rows_of(second)}
    events = [orjson.loads(line) for line in attempts_path_for(second).read_bytes().splitlines()]
    killed = {e["rollout_id"] for e in events if e["event"] == "dispatch"} - written
    assert len(written) < 4 and killed  # at least the rollout in flight when the run was killed
    resumed = subprocess.run(
        [*COLLECT_COMMAND, *common, "--output", str(second), "--resume", "--no-progress"], capture_output=True, text=True, timeout=900
    )
    assert resumed.returncode == 0, resumed.stderr
    rows = rows_of(second)
    assert sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    attached = {r.model_call_id for row in rows for r in check_row(row, store)}
    assert not attached & first_calls  # the first run's capture of each id was cleared before dispatch

    retried = [row for row in rows if f"{row['_ng_task_index']}-{row['_ng_rollout_index']}" in killed]
    assert len(retried) == len(killed)
    assert all(row["_ng_attempt_index"] == 1 and row["ng_model_call_capture"]["rollout_id"].endswith("-a1") for row in retried)
    deadline = time.monotonic() + 120  # the killed attempts' agent runs finish and write their calls
    while not any(read_rollout_calls(store, rollout_id).records for rollout_id in killed):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    killed_calls = {r.model_call_id for rollout_id in killed for r in read_rollout_calls(store, rollout_id).records}
    assert killed_calls and not killed_calls & attached
