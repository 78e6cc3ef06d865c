"""Commands whose Python skips the capture hooks are found before they run, and agree with Python itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtap.capsule.isolation import uncaptured_python

ENV = {"PATH": os.path.dirname(sys.executable)}


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        (["python3", "-I", "agent.py"], "-I"),
        (["python", "-E", "agent.py"], "-E"),
        (["python3.11", "-S", "-m", "agent"], "-S"),
        (["python", "-bIq", "agent.py"], "-I"),
        (["python", "-W", "ignore", "-E", "agent.py"], "-E"),
        (["python", "-X", "dev", "-I"], "-I"),
        (["/usr/bin/pypy3", "-E", "agent.py"], "-E"),
        (["python", "agent.py", "-I"], None),  # the script's own argument
        (["python", "-c", "pass", "-I"], None),
        (["python", "-m", "agent", "-E"], None),
        (["python", "-WI", "agent.py"], None),  # "I" is -W's value here
        (["node", "-I"], None),
        (["python3-config", "-I"], None),
    ],
)
def test_the_flags_that_skip_sitecustomize_are_found(command: list[str], flag: str | None) -> None:
    found = uncaptured_python(command, ENV)
    assert (found and found["flag"]) == flag
    if found:
        assert "not captured" in found["reason"]


def test_a_script_whose_shebang_isolates_python_is_found(tmp_path: Path) -> None:
    script = tmp_path / "agent"
    script.write_text(f"#!{sys.executable} -I\nprint('hi')\n")
    script.chmod(0o755)
    assert uncaptured_python([str(script)], ENV) == {
        "command": sys.executable,
        "flag": "-I",
        "reason": "-I (isolated mode) ignores PYTHONPATH, so its model calls are not captured",
    }
    plain = tmp_path / "plain"
    plain.write_text(f"#!{sys.executable}\n")
    assert uncaptured_python([str(plain)], ENV) is None


def test_a_fifo_as_the_command_never_blocks_the_check(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "agent")
    assert uncaptured_python([str(tmp_path / "agent")], ENV) is None


_OPTIONS = st.lists(
    st.sampled_from(["-I", "-E", "-S", "-s", "-b", "-q", "-u", "-B", "-O", "-W", "ignore", "-X", "dev", "-Wignore", "-Xdev", "-bq", "-qI", "-uE"]),
    max_size=4,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(options=_OPTIONS)
def test_the_check_agrees_with_what_the_real_interpreter_does(options: list[str]) -> None:
    probe = "import sys; f = sys.flags; print(int(bool(f.isolated or f.ignore_environment or f.no_site)))"
    finished = subprocess.run([sys.executable, *options, "-c", probe], capture_output=True, text=True, check=False, timeout=60)
    if finished.returncode != 0:
        return  # an option list Python refuses (a value missing) starts nothing to capture
    skips_hooks = finished.stdout.strip() == "1"
    assert (uncaptured_python([sys.executable, *options, "-c", probe], ENV) is not None) == skips_hooks
