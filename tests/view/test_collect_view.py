"""The viewer over a real `llmtap collect` run: the reference agent, the real local model behind
`llmtap serve`, the command in its own process; then the rows, the timeline and a call in Chromium."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from llmtap import CaptureStore, read_model_call_records
from llmtap.demo.agent import SimpleAgentConfig, build_app
from llmtap.demo.localmodel import LocalModelServer
from llmtap.view.summary import call_outcome
from tests.e2e.serve_harness import serving
from tests.support.servers import ServerThread
from tests.view.browser import CHROMIUM, chromium_page, viewer_serving
from tests.view.test_browser import OUTCOME_COLOURS, _shoot

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed (scripts/bootstrap.sh installs it)"
    ),
]

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


def test_a_real_collect_run_shows_its_rows_timeline_and_calls(agent_url: str, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(task) + b"\n" for task in TASKS))
    output = tmp_path / "rollouts.jsonl"
    command = [*COLLECT_COMMAND, "--agent-url", agent_url, "--input", str(tasks), "--capture-dir", str(tmp_path / "calls"),
               "--num-repeats", "2", "--output", str(output), "--no-progress"]  # fmt: skip
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    rows = [orjson.loads(line) for line in output.read_bytes().splitlines()]
    store = CaptureStore(tmp_path / "calls", create=False)
    by_id: dict[str, Any] = {row["ng_model_call_capture"]["rollout_id"]: row for row in rows}

    with viewer_serving([output, tmp_path / "calls"]) as url, chromium_page() as page:
        page.goto(url + "/")
        page.click("a[href='/s/f1']")
        shown = page.eval_on_selector_all("table.rollouts tbody tr", "trs => trs.map(tr => tr.dataset.id)")
        assert sorted(shown) == sorted(by_id)
        for rollout_id, row in by_id.items():
            cells = page.locator(f"tr[data-id='{rollout_id}'] td").all_inner_texts()
            assert str(row["ng_model_call_capture"]["metrics"]["num_calls"]) in cells[2]
            assert cells[-1] == (
                "attributed" if row["ng_model_call_capture"]["attribution"]["attributed"] else "abstained"
            )
        _shoot(page, tmp_path, "collect-home")
        rollout_id = min(by_id)
        records = read_model_call_records(store, rollout_id)
        page.goto(f"{url}/s/f1/r/{rollout_id}")
        bars = page.eval_on_selector_all(
            "svg.timeline g.bar",
            "gs => gs.map(g => [Number(g.dataset.callIndex), getComputedStyle(g.querySelector('rect')).fill])",
        )
        in_time_order = sorted(records, key=lambda r: (r.started_at, r.call_index))
        assert [index for index, _ in bars] == [r.call_index for r in in_time_order]
        # max_tokens=24 cuts some answers: those calls are `truncated` (finish reason length), the rest ok.
        assert [fill for _, fill in bars] == [OUTCOME_COLOURS[call_outcome(r)] for r in in_time_order]
        terminal = by_id[rollout_id]["ng_model_call_capture"]["attribution"]["model_call_id"]
        if terminal is not None:
            assert page.locator("#calls tr.terminal").count() == 1
        assert page.locator("text=Trajectory").count() == 1
        _shoot(page, tmp_path, "collect-rollout")
        page.goto(f"{url}/s/f1/r/{rollout_id}/c/{records[0].call_index}")
        question = TASKS[by_id[rollout_id]["_ng_task_index"]]["question"]
        assert question in page.locator(".msg.role-user").first.inner_text()
        _shoot(page, tmp_path, "collect-call")
