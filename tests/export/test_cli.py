"""`llmtap export otlp|parquet`: what a user sees, success and failure, and the missing-extra line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmtap.cli import main
from tests.export.support import free_port_url, otlp_receiver

Store = tuple[Path, dict[str, list[str]]]


def test_export_otlp_reports_what_it_sent(fixture_store: Store) -> None:
    root, _ = fixture_store
    with otlp_receiver() as receiver:
        result = CliRunner().invoke(main, ["export", "otlp", str(root), "--endpoint", receiver.url, "--batch-size", "40"])
    assert result.exit_code == 0, result.output
    assert f"exported 84 of 84 calls from 43 rollouts to {receiver.url}/v1/traces in 3 batches" in result.output
    assert len(receiver.spans()) == 84


def test_export_otlp_to_a_down_collector_exits_1_with_counts(fixture_store: Store) -> None:
    root, _ = fixture_store
    url = free_port_url()
    result = CliRunner().invoke(main, ["export", "otlp", str(root), "--endpoint", url, "--timeout", "0.5", "--batch-size", "50"])
    assert result.exit_code == 1
    assert "0 spans exported, 50 failed, 34 not sent" in result.output
    assert "run the export again" in result.output and "Traceback" not in result.output


def test_export_otlp_refuses_a_bad_endpoint(fixture_store: Store) -> None:
    result = CliRunner().invoke(main, ["export", "otlp", str(fixture_store[0]), "--endpoint", "collector:4318"])
    assert result.exit_code == 1 and "is not an http(s) URL" in result.output


def test_export_parquet_then_again_appends_nothing(fixture_store: Store, tmp_path: Path) -> None:
    root, _ = fixture_store
    runner = CliRunner()
    first = runner.invoke(main, ["export", "parquet", str(root), "-o", str(tmp_path / "out")])
    assert first.exit_code == 0, first.output
    assert "run 1: 84 new calls and 43 rollout rows from 43 of 43 rollouts" in first.output
    second = runner.invoke(main, ["export", "parquet", str(root), "-o", str(tmp_path / "out")])
    assert "run 2: 0 new calls and 0 rollout rows from 0 of 43 rollouts" in second.output


@pytest.mark.parametrize("command", [["export", "parquet", "-o", "OUT"], ["query", "SELECT 1"]])
def test_without_the_export_extra_the_install_line_is_printed(
    fixture_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if pyarrow were not installed
    args = [part.replace("OUT", str(tmp_path / "out")) for part in command]
    args.insert(len(args) if command[0] == "query" else 2, str(fixture_store[0]))
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert "pip install 'llmtap[export]'" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()
