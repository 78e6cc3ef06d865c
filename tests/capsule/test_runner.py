"""`run_captured`: the command starts as `subprocess` would start it, ends as it ended, and its output is kept."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from llmtap.capsule.runner import RunResult, run_captured


def _run(command: list[str], tmp_path: Path, **options: object) -> RunResult:
    return run_captured(command, runs_dir=tmp_path / "runs", echo=False, **options)  # type: ignore[arg-type]


def _manifest(result: RunResult) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((result.capsule / "capsule.json").read_text())
    return loaded


def test_the_exit_code_status_and_both_outputs_are_kept(tmp_path: Path) -> None:
    result = _run(["sh", "-c", "echo out; echo err >&2; exit 3"], tmp_path)
    assert (result.exit_code, result.status) == (3, "failure")
    assert (result.capsule / "outputs" / "stdout.txt").read_text() == "out\n"
    assert (result.capsule / "outputs" / "stderr.txt").read_text() == "err\n"
    assert _manifest(result)["error"] == {"type": "NonZeroExit", "message": "The command exited with code 3."}


def test_output_is_shown_as_well_as_kept(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    result = run_captured(["sh", "-c", "echo out; echo err >&2"], runs_dir=tmp_path / "runs")
    assert result.exit_code == 0
    assert capfd.readouterr() == ("out\n", "err\n")


def test_the_program_is_looked_up_on_the_path_of_the_environment_given(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    tool = tools / "my-llmtap-tool"
    tool.write_text("#!/bin/sh\necho tool ran\n")
    tool.chmod(0o755)
    environ = dict(os.environ, PATH=f"{tmp_path / 'nowhere'}{os.pathsep}{tools}{os.pathsep}/usr/bin{os.pathsep}/bin")
    result = _run(["my-llmtap-tool"], tmp_path, environ=environ)
    assert result.exit_code == 0
    assert (result.capsule / "outputs" / "stdout.txt").read_text() == "tool ran\n"


def test_a_missing_program_exits_127_and_one_that_cannot_run_126(tmp_path: Path) -> None:
    missing = _run(["no-such-program-llmtap"], tmp_path)
    assert (missing.exit_code, missing.status) == (127, "failure")
    assert _manifest(missing)["error"] == {
        "type": "FileNotFoundError",
        "message": "The command could not be started (No such file or directory).",
    }
    not_executable = tmp_path / "not-executable"
    not_executable.write_text("#!/bin/sh\n")
    refused = _run([str(not_executable)], tmp_path)
    assert refused.exit_code == 126
    assert _manifest(refused)["error"]["type"] == "PermissionError"  # type: ignore[index]


def test_descriptors_the_recorder_inherited_are_not_passed_on(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, True)
    try:
        probe = f"import os\ntry:\n    os.fstat({write_end})\n    print('open')\nexcept OSError:\n    print('closed')\n"
        result = _run([sys.executable, "-c", probe], tmp_path)
    finally:
        os.close(read_end)
        os.close(write_end)
    assert (result.capsule / "outputs" / "stdout.txt").read_text() == "closed\n"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the signal mask from /proc")
def test_the_command_gets_default_sigpipe_handling_back(tmp_path: Path) -> None:
    assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN  # Python ignores it in the recorder
    result = _run(["grep", "SigIgn", "/proc/self/status"], tmp_path)
    ignored = int((result.capsule / "outputs" / "stdout.txt").read_text().split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1))


def test_a_grandchild_holding_the_output_open_does_not_hold_the_run(tmp_path: Path) -> None:
    result = _run(["sh", "-c", "sleep 60 & echo $!"], tmp_path, linger=0.2)
    grandchild = int((result.capsule / "outputs" / "stdout.txt").read_text())
    try:
        os.kill(grandchild, 0)  # still running: the run ended without waiting for it
    finally:
        os.kill(grandchild, signal.SIGKILL)
    assert result.status == "success"


@pytest.mark.parametrize(
    ("signum", "status", "error_type"),
    [(signal.SIGTERM, "interrupted", "Interrupted"), (signal.SIGKILL, "failure", "Signal")],
)
def test_a_command_ended_by_a_signal_exits_128_plus_its_number(tmp_path: Path, signum: int, status: str, error_type: str) -> None:
    result = _run(["sh", "-c", f"kill -{signum} $$"], tmp_path)
    assert (result.exit_code, result.status) == (128 + signum, status)
    error = _manifest(result)["error"]
    assert isinstance(error, dict) and error["type"] == error_type and error["signal"] == signal.Signals(signum).name


def test_it_runs_from_a_thread_other_than_the_main_one(tmp_path: Path) -> None:
    results: list[RunResult] = []
    thread = threading.Thread(target=lambda: results.append(_run(["true"], tmp_path)))
    thread.start()
    thread.join()
    assert [result.status for result in results] == ["success"]


def test_the_recorders_signal_handlers_are_put_back(tmp_path: Path) -> None:
    before = [signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]
    _run(["true"], tmp_path)
    assert [signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)] == before


def test_without_a_pidfd_the_exit_is_still_noticed_and_all_output_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmtap.capsule import runner

    monkeypatch.setattr(runner, "_exit_descriptor", lambda pid: None)  # as on macOS or a kernel before 5.3
    result = _run(["sh", "-c", "echo one; sleep 0.1; echo two; exit 4"], tmp_path)
    assert result.exit_code == 4
    assert (result.capsule / "outputs" / "stdout.txt").read_text() == "one\ntwo\n"
