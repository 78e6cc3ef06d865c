"""The reference system, NeMo Gym 0.7.0, in its own interpreter: a venv built once per machine.

NeMo Gym is never a dependency of llmtap: it installs from PyPI into a Python 3.13 venv kept in
the cache directory (`$LLMTAP_CACHE_DIR`, else `$XDG_CACHE_HOME/llmtap`, else `~/.cache/llmtap`),
as the local model is. It declares Requires-Python >=3.13.14 and the machine has 3.13.0, hence
`--ignore-requires-python`. A build that fails (no network, no 3.13) fails the tests loudly: they
are the only evidence that llmtap agrees with the reference, so they never skip.

The drivers in `drivers/` run in that interpreter, read JSON on stdin and print JSON on stdout.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

NEMO_GYM_VERSION = "0.7.0"
PYTHON_313 = Path(os.environ.get("LLMTAP_PYTHON_313", "/root/.pyenv/versions/3.13.0/bin/python"))
DRIVERS = Path(__file__).parent / "drivers"
_READY = "llmtap-ready.json"  # written last: a venv without it is a build that did not finish


def interop_cache_dir() -> Path:
    """Where the reference venv is kept: `$LLMTAP_CACHE_DIR`, else `$XDG_CACHE_HOME/llmtap`, else ~/.cache/llmtap."""
    override = os.environ.get("LLMTAP_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "llmtap"


def _run(command: list[str], what: str, timeout: float) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        pytest.fail(f"Could not {what} (exit {done.returncode}); the interop tests need it:\n{tail}", pytrace=False)


def build_reference_venv(cache_dir: Path) -> Path:
    """Return the reference venv's python, building the venv first when it is not there (once: a lock
    keeps two runs from building it at the same time; the build goes to a temporary directory that
    is renamed into place only once NeMo Gym imports)."""
    venv = cache_dir / f"nemo-gym-{NEMO_GYM_VERSION}-venv"
    python = venv / "bin" / "python"
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f"nemo-gym-{NEMO_GYM_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / _READY).is_file():
            return python
        if not PYTHON_313.is_file():
            pytest.fail(f"Python 3.13 is not at {PYTHON_313}; set LLMTAP_PYTHON_313 to its interpreter.", pytrace=False)
        partial = cache_dir / f"nemo-gym-{NEMO_GYM_VERSION}-venv.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(venv, ignore_errors=True)  # an unfinished build
        _run([str(PYTHON_313), "-m", "venv", str(partial)], "create the Python 3.13 venv", 300)
        partial_python = str(partial / "bin" / "python")
        _run(
            [partial_python, "-m", "pip", "install", "--quiet", "--ignore-requires-python", f"nemo-gym=={NEMO_GYM_VERSION}"],
            f"install nemo-gym=={NEMO_GYM_VERSION} from PyPI",
            3600,
        )
        _run([partial_python, "-c", "import nemo_gym.base_responses_api_model"], "import the installed NeMo Gym", 300)
        os.replace(partial, venv)  # a venv's python finds its site-packages relative to itself
        (venv / _READY).write_text(json.dumps({"nemo_gym": NEMO_GYM_VERSION}) + "\n")
        return python


@pytest.fixture(scope="session")
def reference_python() -> Path:
    """The interpreter of the venv holding NeMo Gym 0.7.0 (built on first use)."""
    return build_reference_venv(interop_cache_dir())


class ReferenceDriver:
    """Runs one driver script in the reference interpreter: JSON in, JSON out."""

    def __init__(self, python: Path) -> None:
        self.python = python

    def __call__(self, driver: str, payload: Any, *, timeout: float = 300) -> Any:
        env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
        done = subprocess.run(
            [str(self.python), str(DRIVERS / f"{driver}.py")],
            input=json.dumps(payload),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(f"The reference driver {driver} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
        return json.loads(done.stdout)


@pytest.fixture(scope="session")
def reference(reference_python: Path) -> Iterator[ReferenceDriver]:
    """Call `reference("driver_name", payload)` to run a driver in NeMo Gym's own interpreter."""
    yield ReferenceDriver(reference_python)

