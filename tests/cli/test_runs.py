"""`llmtap runs show`: a capsule's model calls read through the store's one JSON-lines parse path."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
from click.testing import CliRunner

from llmtap.capsule.manifest import start_manifest
from llmtap.capsule.ulid import new_ulid
from llmtap.capsule.writer import create_capsule
from llmtap.cli import main


def _call(index: int) -> dict[str, object]:
    return {
        "rollout_id": "r-0",
        "call_index": index,
        "name": "chat gpt-4o",
        "status": "ok",
        "duration_ms": 12.5 + index,
        "attributes": {"gen_ai.provider.name": "openai", "gen_ai.usage.input_tokens": 9, "gen_ai.usage.output_tokens": 1},
    }


def test_runs_show_reads_the_whole_calls_and_skips_damaged_lines(tmp_path: Path) -> None:
    paths = create_capsule(tmp_path / "runs", run_id=new_ulid())
    start_manifest(paths, capture_mode="run", command=["python", "x.py"], cwd="/w", started_at=1.0, registry_source=None)
    calls = [_call(0), _call(1), _call(2)]
    (paths.root / "model-calls.jsonl").write_bytes(
        orjson.dumps(calls[0]) + b"\n{damaged\n[1, 2]\n\n" + orjson.dumps(calls[1]) + b"\n" + orjson.dumps(calls[2])
    )
    shown = CliRunner().invoke(main, ["runs", "show", paths.root.name, "--capsule-dir", str(tmp_path / "runs"), "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["model_calls"] == calls  # the last line lost only its newline: still a call


def test_runs_show_drops_a_cut_off_last_call(tmp_path: Path) -> None:
    paths = create_capsule(tmp_path / "runs", run_id=new_ulid())
    start_manifest(paths, capture_mode="run", command=["python", "x.py"], cwd="/w", started_at=1.0, registry_source=None)
    (paths.root / "model-calls.jsonl").write_bytes(orjson.dumps(_call(0)) + b"\n" + orjson.dumps(_call(1))[:30])
    shown = CliRunner().invoke(main, ["runs", "show", paths.root.name, "--capsule-dir", str(tmp_path / "runs"), "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["model_calls"] == [_call(0)]
