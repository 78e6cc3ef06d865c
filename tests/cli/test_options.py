"""Shared CLI options: one definition each, and `records` taking `--capture-dir` like every other command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmtap.cli import main
from llmtap.exchange import Exchange
from llmtap.records import raw_line_from_exchange
from llmtap.store import CaptureStore
from tests.fixtures import fixture

COMMANDS_WITH_CAPTURE_DIR = [["serve"], ["collect"], ["attach"], ["demo"], ["records", "list"], ["records", "status"],
                             ["records", "path"], ["records", "show"]]


@pytest.fixture
def capture_dir(tmp_path: Path) -> Path:
    recorded = fixture("chat/parallel-tool-calls-gpt41-nano")
    exchange = Exchange(method="POST", path=recorded.request_path, request_body=json.dumps(recorded.request_json).encode())
    exchange.status_code = recorded.status
    exchange.response_headers = {"content-type": recorded.content_type}
    exchange.add_response_chunk(recorded.body_bytes)
    with CaptureStore(tmp_path) as store:
        store.append("r-1", raw_line_from_exchange(exchange))
    return tmp_path


@pytest.mark.parametrize("command", COMMANDS_WITH_CAPTURE_DIR, ids=" ".join)
def test_every_command_that_reads_or_writes_a_capture_dir_offers_capture_dir(command: list[str]) -> None:
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "--capture-dir" in result.output


@pytest.mark.parametrize("how", ["option", "positional"])
def test_records_show_reads_the_same_rollout_either_way(capture_dir: Path, how: str) -> None:
    where = ["--capture-dir", str(capture_dir)] if how == "option" else [str(capture_dir)]
    result = CliRunner().invoke(main, ["records", "show", *where, "r-1", "--json"])
    assert result.exit_code == 0, result.output
    assert len(result.output.splitlines()) == 1 and '"model_call_id"' in result.output


@pytest.mark.parametrize("how", ["option", "positional"])
def test_records_list_and_path_take_either_form(capture_dir: Path, how: str) -> None:
    where = ["--capture-dir", str(capture_dir)] if how == "option" else [str(capture_dir)]
    listed = CliRunner().invoke(main, ["records", "list", *where], env={"COLUMNS": "200"})
    assert listed.exit_code == 0 and "r-1" in listed.output
    path = CliRunner().invoke(main, ["records", "path", *where, "r-1"])
    assert path.exit_code == 0 and path.output.strip() == str(capture_dir / "r-1.capture.jsonl")


def test_records_refuses_the_directory_given_twice_or_not_at_all(capture_dir: Path) -> None:
    twice = CliRunner().invoke(main, ["records", "show", "--capture-dir", str(capture_dir), str(capture_dir), "r-1"])
    assert twice.exit_code == 2 and "give the directory once" in twice.output
    missing = CliRunner().invoke(main, ["records", "status"])
    assert missing.exit_code == 2 and "--capture-dir DIR (or DIR)" in missing.output


def test_records_positional_directory_must_exist(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["records", "list", str(tmp_path / "absent")])
    assert result.exit_code == 2 and "does not exist" in result.output


@pytest.mark.parametrize("command", ["demo", "agent"])
def test_the_demo_package_commands_still_start(command: str) -> None:
    """`llmtap demo` and `llmtap agent` load from llmtap.demo now; `python -m llmtap` reaches them."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "llmtap", command, "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"Usage: python -m llmtap {command}")


def test_the_agent_command_builds_the_reference_agent_from_the_demo_package() -> None:
    from llmtap.cli.agent import agent
    from llmtap.demo.agent import AGENT_SOURCE, SimpleAgentConfig, build_app

    assert AGENT_SOURCE == "llmtap.agents.simple"  # recorded in observations before the move: a label, kept
    assert agent.name == "agent"
    app = build_app(SimpleAgentConfig(model_url="http://127.0.0.1:9"))
    assert "/run" in {route.path for route in app.routes}
