"""Running a command under capture: what `llmtap run -- CMD ...` does.

1. Load the URL registry (a malformed override stops here, before anything runs) and create the
   capsule with a `running` manifest and the compiled registry.
2. Start the command with the injected `sitecustomize` first on PYTHONPATH, so every Python
   process it starts (children, grandchildren, multiprocessing workers) captures into the capsule.
3. Stream its stdout and stderr through live, byte for byte, while keeping a copy in the capsule.
4. Ctrl-C: the terminal already delivered SIGINT to the command (same process group); the
   recorder waits for it to end and marks the run `interrupted`. SIGTERM and SIGHUP, and a SIGINT
   not sent by the terminal, are forwarded to the command.
5. Finalise the capsule (on success, failure and interruption alike) and return the command's
   exit code (128 + signal number when a signal ended it; 127 when it could not be started).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, NamedTuple, Sequence

from .finalise import CaptureOutcome, finalise_capsule
from .manifest import start_manifest
from .writer import CapsulePaths, create_capsule, write_json_atomic

__all__ = ["RunResult", "run_captured", "site_directory"]

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PUMP_CHUNK = 65536


class RunResult(NamedTuple):
    """How a captured run ended and where its capsule is."""

    exit_code: int
    status: str
    capsule: Path
    manifest: dict[str, Any]


def site_directory() -> Path:
    """The directory holding the injected `sitecustomize.py`."""
    return Path(__file__).resolve().parent.parent / "hooks" / "site"


def _library_path() -> list[str]:
    """Where this llmtap and its dependencies live, for workloads whose environment lacks them."""
    from importlib.util import find_spec

    import llmtap

    entries = [str(Path(llmtap.__file__).resolve().parent.parent)]
    dependency = find_spec("orjson")  # located, not imported
    if dependency is not None and dependency.origin:
        entries.append(str(Path(dependency.origin).resolve().parent.parent))
    return list(dict.fromkeys(entries))


def _child_environment(paths: CapsulePaths, base: dict[str, str], echo_is_tty: bool) -> tuple[dict[str, str], list[str]]:
    env = dict(base)
    site = str(site_directory())
    library = _library_path()
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = site + (os.pathsep + existing if existing else "")
    env["LLMTAP_RUN_CAPSULE"] = str(paths.root)
    env["LLMTAP_RUN_RECORDER_PID"] = str(os.getpid())
    env["LLMTAP_RUN_LIBPATH"] = os.pathsep.join(library)
    if echo_is_tty and "PYTHONUNBUFFERED" not in env:
        # Python block-buffers output into a pipe; on a terminal it would have been line-buffered,
        # so output would no longer appear live.
        env["PYTHONUNBUFFERED"] = "1"
    return env, [site]


class _Pump(threading.Thread):
    """Copies one output stream of the command to our own and into the capsule, as it arrives."""

    def __init__(self, source: IO[bytes], echo_fd: int | None, keep: Path) -> None:
        super().__init__(name=f"llmtap-run-{keep.stem}", daemon=True)
        self._source = source
        self._echo_fd = echo_fd
        self._keep = keep

    def run(self) -> None:
        fd = self._source.fileno()
        keep = os.open(self._keep, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            while chunk := os.read(fd, _PUMP_CHUNK):
                if self._echo_fd is not None:
                    try:
                        _write_all(self._echo_fd, chunk)
                    except OSError:
                        self._echo_fd = None  # our own output went away; keep recording
                _write_all(keep, chunk)
        finally:
            os.close(keep)
            self._source.close()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _Signals:
    """Notes interruption and forwards signals to the command while it runs."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.received: list[int] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for signum in _FORWARDED:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: object) -> None:
        self.received.append(signum)
        process = self.process
        if process is None or process.poll() is not None:
            return
        if signum == signal.SIGINT and _terminal_sent_it():
            return  # the command is in our foreground process group and got it too
        try:
            process.send_signal(signum)
        except OSError:
            pass


def _terminal_sent_it() -> bool:
    """True when we are the foreground process group of a terminal (so Ctrl-C reached the command)."""
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        try:
            if os.tcgetpgrp(stream.fileno()) == os.getpgrp():
                return True
        except (OSError, ValueError, AttributeError):
            continue
    return False


def _outcome(returncode: int | None, received: list[int], launch_error: OSError | None) -> CaptureOutcome:
    if launch_error is not None:
        code = 126 if isinstance(launch_error, PermissionError) else 127
        return CaptureOutcome(
            "failure",
            exit_code=code,
            error={"type": type(launch_error).__name__, "message": f"The command could not be started ({launch_error.strerror})."},
        )
    assert returncode is not None
    exit_code = returncode if returncode >= 0 else 128 - returncode
    if received or returncode in (-signal.SIGINT, -signal.SIGTERM, -signal.SIGHUP):
        name = signal.Signals(received[0] if received else -returncode).name
        return CaptureOutcome("interrupted", exit_code=exit_code, error={"type": "Interrupted", "signal": name})
    if returncode == 0:
        return CaptureOutcome("success", exit_code=0)
    if returncode < 0:
        name = signal.Signals(-returncode).name
        return CaptureOutcome(
            "failure", exit_code=exit_code, error={"type": "Signal", "signal": name, "message": f"The command was killed by {name}."}
        )
    return CaptureOutcome(
        "failure", exit_code=exit_code, error={"type": "NonZeroExit", "message": f"The command exited with code {returncode}."}
    )


def run_captured(
    command: Sequence[str],
    *,
    runs_dir: Path | None = None,
    registry_path: Path | None = None,
    echo: bool = True,
    linger: float = 2.0,
    environ: dict[str, str] | None = None,
) -> RunResult:
    """Run `command` under capture into a new capsule and return how it ended.

    Raises ConfigError (before running anything) when the URL registry is malformed.
    """
    from ..hooks.registry import load_registry

    registry = load_registry(registry_path)
    started, started_mono = time.time(), time.perf_counter()
    paths = create_capsule(runs_dir, with_outputs=True)
    write_json_atomic(paths.url_registry, {"source": registry.source, "registry": registry.data}, sync=False)
    manifest = start_manifest(
        paths, capture_mode="run", command=command, cwd=os.getcwd(), started_at=started, registry_source=registry.source
    )
    echo_stdout = sys.stdout.fileno() if echo else None
    echo_stderr = sys.stderr.fileno() if echo else None
    is_tty = echo and (os.isatty(sys.stdout.fileno()) or os.isatty(sys.stderr.fileno()))
    env, injected = _child_environment(paths, dict(os.environ if environ is None else environ), is_tty)
    launch_error: OSError | None = None
    returncode: int | None = None
    with _Signals() as signals:
        try:
            process = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        except OSError as exc:
            launch_error = exc
        else:
            signals.process = process
            assert process.stdout is not None and process.stderr is not None
            pumps = [_Pump(process.stdout, echo_stdout, paths.stdout), _Pump(process.stderr, echo_stderr, paths.stderr)]
            for pump in pumps:
                pump.start()
            returncode = process.wait()
            for pump in pumps:
                pump.join(linger)  # a grandchild may still hold the pipes open
        for stream in (paths.stdout, paths.stderr):
            stream.touch(exist_ok=True)
        outcome = _outcome(returncode, signals.received, launch_error)
        outcome.duration_ms = round((time.perf_counter() - started_mono) * 1000.0, 3)
        final = finalise_capsule(paths, manifest, outcome, environ=env, injected_paths=injected)
    assert outcome.exit_code is not None
    return RunResult(outcome.exit_code, outcome.status, paths.root, final)
