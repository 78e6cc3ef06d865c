"""The real `llmtap serve` process on loopback, for tests and benches that must kill or starve it.

`ServeProcess` starts `python -m llmtap serve` (the interpreter running the tests, so the same
tree) in its own session, waits until it accepts connections, and stops exactly what it started:
SIGTERM, or SIGKILL of its process group (serve and its sync helper) for a crash.

    with ServeProcess(upstream.base_url, capture_dir).start() as serve:
        httpx.post(serve.base_url + "/ng-rollout/r1/v1/chat/completions", json=body)
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.servers import LOOPBACK, StopsOnExit, free_port

__all__ = ["ServeProcess", "rss_kib"]


def rss_kib(pid: int) -> int:
    """The resident set of process `pid` in KiB (Linux /proc); 0 once it has exited."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


class ServeProcess(StopsOnExit):
    """One `llmtap serve --upstream URL --capture-dir DIR` process; `log` holds its stderr."""

    def __init__(self, upstream_url: str, capture_dir: Path | None, *, log: Path, extra: tuple[str, ...] = ()) -> None:
        self.upstream_url = upstream_url
        self.capture_dir = capture_dir
        self.log = log
        self.extra = extra
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError("This llmtap serve is not running; call start() first.")
        return self.process.pid

    def start(self, timeout: float = 60.0) -> ServeProcess:
        """Start serve and return once it accepts connections; raises RuntimeError with its log if it exits."""
        command = [sys.executable, "-m", "llmtap", "serve", "--upstream", self.upstream_url,
                   "--host", LOOPBACK, "--port", str(self.port), *self.extra]
        if self.capture_dir is not None:
            command += ["--capture-dir", str(self.capture_dir)]
        with self.log.open("ab") as sink:
            self.process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"llmtap serve exited with code {self.process.returncode}: {self.log_text()[-3000:]}")
            with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, self.port), timeout=0.2):
                return self
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"llmtap serve did not listen on port {self.port} within {timeout} s: {self.log_text()}")
            time.sleep(0.05)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL serve and everything in its session (its sync helper), as a crash or the OOM killer would."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        self.process = None

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM serve and wait for it; SIGKILL what is left after `timeout`; safe to call twice."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
