"""`llmtap run` through the console script: the fast path reads what click would, and leaves the rest to click."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtap.cli.run import RunArguments, _command, parse_fast

# Words the generated argument lists are made of: every form of every option, the separator,
# help, unknown options, odd values and ordinary command words.
_WORDS = [
    "--capsule-dir", "--registry", "-q", "--quiet", "--", "-", "-h", "--help", "--bogus", "-x", "-qq",
    "--capsule-dir=", "--capsule-dir=runs", "--registry=reg.yaml", "--quiet=1", "runs", "reg.yaml",
    "a//b/", "python", "-c", "pass", "x=y", "",
]


def _click_parse(args: list[str]) -> RunArguments | None:
    """What the click command makes of `args`, or None when it refuses them or shows help."""
    command = _command()
    try:
        with command.make_context("run", list(args)) as context:
            params = context.params
    except (click.exceptions.Exit, click.ClickException):
        return None

    def text(value: Path | None) -> str | None:
        return None if value is None else str(value)

    return RunArguments(
        list(params["command"]),
        capsule_dir=text(params["capsule_dir"]),
        registry_path=text(params["registry_path"]),
        quiet=params["quiet"],
    )


def _normalised(parsed: RunArguments) -> RunArguments:
    """Paths as click hands them over (it makes Path objects of them)."""

    def text(value: str | None) -> str | None:
        return None if value is None else str(Path(value))

    return RunArguments(
        parsed.command, capsule_dir=text(parsed.capsule_dir), registry_path=text(parsed.registry_path), quiet=parsed.quiet
    )


@settings(max_examples=400, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(st.sampled_from(_WORDS), max_size=7))
def test_whatever_the_fast_parser_accepts_click_reads_the_same_way(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    fast = parse_fast(args)
    if fast is not None:
        assert _normalised(fast) == _click_parse(args)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--", "python", "-c", "pass"], RunArguments(["python", "-c", "pass"])),
        (["python", "-q"], RunArguments(["python", "-q"])),
        (["-q", "--capsule-dir", "d", "--registry=r.yaml", "--", "--", "x"], RunArguments(["--", "x"], capsule_dir="d", registry_path="r.yaml", quiet=True)),
        (["--capsule-dir", "a", "--capsule-dir=b", "cmd"], RunArguments(["cmd"], capsule_dir="b")),
    ],
)
def test_the_usual_forms_are_read_without_click(args: list[str], expected: RunArguments) -> None:
    assert parse_fast(args) == expected


@pytest.mark.parametrize(
    "args",
    [[], ["--"], ["-q"], ["--help", "x"], ["-h"], ["--bogus", "x"], ["--capsule-dir"], ["--capsule-dir", "-q", "x"], ["--quiet=1", "x"]],
)
def test_help_errors_and_unknown_options_are_left_to_click(args: list[str]) -> None:
    assert parse_fast(args) is None


def test_path_values_click_would_refuse_are_left_to_click(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert parse_fast(["--capsule-dir", str(a_file), "true"]) is None
    assert parse_fast(["--registry", str(tmp_path), "true"]) is None
    accepted = parse_fast(["--capsule-dir", str(tmp_path), "--registry", str(a_file), "true"])
    assert accepted == RunArguments(["true"], capsule_dir=str(tmp_path), registry_path=str(a_file))


def _console(args: list[str], cwd: Path, env: dict[str, str] | None = None, prelude: str = "") -> subprocess.CompletedProcess[str]:
    """Run the `llmtap` console script's entry point as the installed script does."""
    code = f"import sys\n{prelude}\nfrom llmtap.cli import console_main\nsys.argv[0] = 'llmtap'\nsys.exit(console_main())\n"
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=env or dict(os.environ), capture_output=True, text=True, timeout=120, check=False
    )


# Records which modules the recorder had loaded when it started the command.
_SPY = """
import llmtap.capsule.runner as runner
_start = runner._start
def _spy(*args, **kwargs):
    loaded = [name for name in ("click", "rich", "typing", "pathlib", "subprocess", "threading", "json", "re", "enum")
              if name in sys.modules]
    with open("loaded.txt", "w") as handle:
        handle.write(" ".join(loaded))
    return _start(*args, **kwargs)
runner._start = _spy
"""


def test_llmtap_run_starts_the_command_before_loading_click_or_the_heavy_standard_modules(tmp_path: Path) -> None:
    first = _console(["run", "--capsule-dir", "runs", "--", "true"], tmp_path, prelude=_SPY)
    assert first.returncode == 0, first.stderr
    assert "click" not in (tmp_path / "loaded.txt").read_text()  # the registry was checked the slow way once
    result = _console(["run", "--capsule-dir", "runs", "--", sys.executable, "-c", "print('hi')"], tmp_path, prelude=_SPY)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hi\n"
    assert (tmp_path / "loaded.txt").read_text() == ""
    assert result.stderr.startswith("llmtap: run ") and " success (exit 0), 0 model call(s) -> " in result.stderr


def test_llmtap_run_returns_the_command_exit_code_and_quiet_drops_the_summary(tmp_path: Path) -> None:
    result = _console(["run", "-q", "--capsule-dir", "runs", "--", "sh", "-c", "echo out; exit 5"], tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (5, "out\n", "")
    [capsule] = (tmp_path / "runs").iterdir()
    assert json.loads((capsule / "capsule.json").read_text())["exit_code"] == 5


def test_llmtap_run_help_is_clicks(tmp_path: Path) -> None:
    result = _console(["run", "--help"], tmp_path)
    assert result.returncode == 0
    assert result.stdout.startswith("Usage: llmtap run [OPTIONS] COMMAND...")
    assert "--capsule-dir DIRECTORY" in result.stdout


def test_a_bad_registry_is_reported_as_click_reports_it_and_nothing_runs(tmp_path: Path) -> None:
    registry = tmp_path / "registry.yaml"
    registry.write_text("schema_version: 1\nproviders:\n  - provider: x\n")
    env = dict(os.environ, LLMTAP_URL_REGISTRY=str(registry))
    result = _console(["run", "--capsule-dir", "runs", "--", "touch", "ran"], tmp_path, env=env)
    assert result.returncode == 1
    assert result.stderr.startswith(f"Error: The URL registry '{registry}' is invalid:")
    assert not (tmp_path / "ran").exists() and not (tmp_path / "runs").exists()


def test_other_commands_still_go_through_the_click_group(tmp_path: Path) -> None:
    result = _console(["--version"], tmp_path)
    assert result.returncode == 0 and "llmtap, version" in result.stdout


def test_errors_and_interruptions_read_as_the_click_command_reports_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from click.testing import CliRunner

    from llmtap.cli import run as run_module
    from llmtap.errors import ConfigError

    for failure in (ConfigError("The URL registry 'x' is invalid: broken; fix it."), KeyboardInterrupt()):

        def fail(*args: object, failure: BaseException = failure, **kwargs: object) -> int:
            raise failure

        monkeypatch.setattr(run_module, "execute", fail)
        by_click = CliRunner().invoke(_command(), ["--", "true"])
        assert run_module.run_fast(["--", "true"]) == by_click.exit_code == 1
        assert capsys.readouterr().err == by_click.output
