"""`llmtap run` and `llmtap runs` as a user meets them: live output, exit codes, errors, listing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml  # type: ignore[import-untyped]
from click.testing import CliRunner

from llmtap.cli.runs import runs
from tests.e2e.test_run_sdks import llmtap_run, only_capsule


def test_output_is_streamed_live_while_the_program_runs(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    program = f"import os, time\nprint('first', flush=True)\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.02)\nprint('second')\n"
    command = [sys.executable, "-m", "llmtap.cli.run", "--capsule-dir", str(tmp_path / "runs"), "--", sys.executable, "-c", program]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "first\n"  # arrives while the program still waits
        gate.touch()
        rest, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert rest == "second\n" and process.returncode == 0
    assert (only_capsule(tmp_path) / "outputs" / "stdout.txt").read_text() == "first\nsecond\n"


def test_a_non_python_command_keeps_its_exit_code_and_gets_an_env_lock_that_says_so(tmp_path: Path) -> None:
    result = llmtap_run(["--", "sh", "-c", "echo out; echo err >&2; exit 4"], dict(os.environ), tmp_path)
    assert (result.returncode, result.stdout) == (4, "out\n")
    capsule = only_capsule(tmp_path)
    assert json.loads((capsule / "env.lock").read_text())["python"] is None
    assert (capsule / "outputs" / "stderr.txt").read_text() == "err\n"


def test_a_missing_command_exits_127_and_still_leaves_a_failed_capsule(tmp_path: Path) -> None:
    result = llmtap_run(["--", "no-such-command-llmtap"], dict(os.environ), tmp_path)
    assert result.returncode == 127
    manifest = json.loads((only_capsule(tmp_path) / "capsule.json").read_text())
    assert manifest["status"] == "failure" and manifest["error"]["type"] == "FileNotFoundError"


def test_a_malformed_registry_override_stops_before_anything_runs(tmp_path: Path) -> None:
    override = tmp_path / "registry.yaml"
    override.write_text(yaml.safe_dump({"schema_version": 1, "providers": [{"provider": "x"}]}))
    marker = tmp_path / "ran"
    env = dict(os.environ, LLMTAP_URL_REGISTRY=str(override))
    result = llmtap_run(["--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"], env, tmp_path)
    assert result.returncode == 1
    assert "URL registry" in result.stderr and str(override) in result.stderr
    assert not marker.exists()


def test_runs_list_and_show_print_the_capsules(tmp_path: Path) -> None:
    for code in (0, 2):
        llmtap_run(["--", sys.executable, "-c", f"import sys; sys.exit({code})"], dict(os.environ), tmp_path)
        time.sleep(0.002)  # distinct ULID milliseconds keep the listing order obvious
    runner = CliRunner()
    listed = runner.invoke(runs, ["list", "--capsule-dir", str(tmp_path / "runs")])
    assert listed.exit_code == 0
    rows = listed.output.splitlines()
    assert rows[0].startswith("RUN") and len(rows) == 3
    assert "success" in rows[1] and "failure" in rows[2]
    shown = runner.invoke(runs, ["show", "latest", "--capsule-dir", str(tmp_path / "runs")])
    assert shown.exit_code == 0
    assert "status      failure  exit 2" in shown.output
    as_json = json.loads(runner.invoke(runs, ["show", "latest", "--json", "--capsule-dir", str(tmp_path / "runs")]).output)
    assert as_json["manifest"]["exit_code"] == 2
    missing = runner.invoke(runs, ["show", "NOPE", "--capsule-dir", str(tmp_path / "runs")])
    assert missing.exit_code == 1 and "No run 'NOPE'" in missing.output
