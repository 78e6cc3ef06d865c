"""`llmtap view` as a user starts it: its own process on loopback, and its refusals as one clean line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
from click.testing import CliRunner

from llmtap.cli import main
from tests.support.servers import free_port, wait_for_http
from tests.view.stores import build_store


def test_view_serves_the_given_directory_on_loopback_until_stopped(tmp_path: Path) -> None:
    build_store(tmp_path / "calls")
    port = free_port()
    command = [sys.executable, "-m", "llmtap", "view", str(tmp_path / "calls"), "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        home = wait_for_http(f"http://127.0.0.1:{port}/", timeout=30)
        assert home.status_code == 200 and 'data-id="xss-0"' in home.text
        with httpx.Client(trust_env=False) as client:
            assert client.get(f"http://127.0.0.1:{port}/", headers={"host": "rebound.example"}).status_code == 421
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=30)
    assert f"http://127.0.0.1:{port}/" in out


def test_view_refuses_a_non_loopback_address_and_a_missing_path(tmp_path: Path) -> None:
    wide_open = CliRunner().invoke(main, ["view", str(tmp_path), "--host", "0.0.0.0"])
    assert wide_open.exit_code == 1 and "loopback only" in wide_open.output
    missing = CliRunner().invoke(main, ["view", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_view_without_a_path_and_without_runs_says_what_to_give(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["view"], env={"LLMTAP_RUNS_DIR": str(tmp_path / "no-runs")})
    assert result.exit_code == 1 and "give a capture directory" in result.output
