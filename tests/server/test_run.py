"""`llmtap serve` as a process: the settings it runs with."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from llmtap.server import run
from llmtap.server.run import raise_open_file_limit
from tests.support.servers import free_port


def _soft_open_files(pid: int) -> int:
    limits = Path(f"/proc/{pid}/limits").read_text()
    match = re.search(r"^Max open files\s+(\d+)", limits, re.MULTILINE)
    assert match is not None
    return int(match.group(1))


@pytest.mark.skipif(not os.path.exists("/proc/self/limits"), reason="needs Linux /proc")
def test_serve_raises_a_low_open_file_limit_so_the_store_keeps_its_rollouts_open() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 1024:
        pytest.skip("the hard limit leaves nothing to raise")

    def start_low() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "llmtap", "serve", f"++port={port}", "++upstreams.a.base_url=http://127.0.0.1:9"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=start_low,
    )
    try:
        assert process.stderr is not None
        assert b"llmtap serve on" in process.stderr.readline()  # printed after the limit is raised
        wanted = run._WANTED_OPEN_FILES
        assert _soft_open_files(process.pid) == (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard))
    finally:
        process.terminate()
        process.wait(timeout=30)
        if process.stderr is not None:
            process.stderr.close()


def test_the_limit_is_never_lowered() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert raise_open_file_limit(wanted=16) == soft
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (soft, hard)
