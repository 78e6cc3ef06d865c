"""The README's main job, run as a user runs it: real model, `llmtap serve` process, real SDK agent."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from llmtap.demo.run import run_demo
from llmtap.store import CaptureStore
from llmtap.store.readers import read_model_call_records

pytestmark = pytest.mark.slow


def test_demo_captures_both_rollouts_with_the_tool_call_and_real_usage(tmp_path: Path) -> None:
    output = io.StringIO()
    metrics = run_demo(tmp_path / "calls", console=Console(file=output, width=200))
    assert sorted(metrics) == ["demo-0", "demo-1"]
    store = CaptureStore(tmp_path / "calls")
    for rollout_id, totals in metrics.items():
        records = read_model_call_records(store, rollout_id)
        assert [r.stream for r in records] == [True, True, False]
        assert totals["num_calls"] == 3 and totals["num_errors"] == 0
        first = records[0]
        assert first.finish_reason_normalized == "tool_calls" and [c["name"] for c in first.tool_calls] == ["add"]
        # The streamed calls carry no usage (llama.cpp sends none): unknown, never zero.
        assert first.tokens_out is None and records[2].tokens_out is not None
        assert totals["tokens_out"] == records[2].tokens_out
        # The tool result went back to the model in the second call's request.
        assert any(m.get("role") == "tool" for m in records[1].request["messages"])  # type: ignore[index]
    assert "rollout demo-0" in output.getvalue() and "rollout demo-1" in output.getvalue()
