"""Running a command under capture: what `llmtap run -- CMD ...` does.

1. Take the URL registry (a malformed override stops here, before anything runs) and create the
   capsule's directories with the registry the workload's hooks will use (`url_registry.json`),
   holding the capsule's runner lock (`recover`) until it is finalised. A Python command that
   would skip the hooks (`-I`, `-E`, `-S`; `isolation`) is reported on stderr and in the capsule.
2. Start the command with the injected `sitecustomize` first on PYTHONPATH, so every Python
   process it starts (children, grandchildren, multiprocessing workers) captures into the capsule.
3. While it runs, write the `running` manifest, and stream its stdout and stderr through live,
   byte for byte, while keeping a copy in the capsule.
4. Ctrl-C: the terminal already delivered SIGINT to the command (same process group); the
   recorder waits for it to end and marks the run `interrupted`. SIGTERM and SIGHUP, and a SIGINT
   not sent by the terminal, are forwarded to the command.
5. Finalise the capsule (on success, failure and interruption alike) and return the command's
   exit code (128 + signal number when a signal ended it; 127 when it could not be started).

Every run pays for what happens before its command starts (issue 5 allows 50 ms over plain
`python` for the whole of `llmtap run`), so that part loads nothing but `os`, `sys`, `time`,
`select` and the C half of `signal`: the registry comes from `run_registry` (checked once, then
reused), the command is started with `os.posix_spawn` the way `subprocess.Popen` would start it,
and its output is copied by one `poll` loop instead of threads. The manifest, the finalisation
code and the heavier modules they need (`json`, `pathlib`) are loaded once the command runs.
"""

from __future__ import annotations

import os
import select
import sys
import time

from .isolation import uncaptured_python
from .run_registry import registry_for_run, registry_source
from .writer import create_capsule_directories, directory_identity, hold_runner_lock, write_new_file

TYPE_CHECKING = False  # `typing` is not imported at run time (see above)
if TYPE_CHECKING:
    import signal as _signals
    from collections.abc import Callable, Sequence
    from pathlib import Path
    from typing import Any, Self

    from .finalise import CaptureOutcome
    from .writer import CapsulePaths
else:
    # The C module `signal` wraps in enums, loaded with the interpreter: building those enums would
    # cost several milliseconds before the command can start, and plain signal numbers do here.
    try:
        import _signal as _signals
    except ImportError:  # pragma: no cover - an interpreter without it
        import signal as _signals

__all__ = ["RunResult", "run_captured", "site_directory"]

_FORWARDED = (_signals.SIGINT, _signals.SIGTERM, _signals.SIGHUP)
# Python ignores these; `subprocess` gives a child their default handling back, and so does this.
_RESTORED = tuple(getattr(_signals, name) for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ") if hasattr(_signals, name))
_PUMP_CHUNK = 65536
_EXIT_CHECK_MS = 50  # how often the command's exit is checked where the kernel cannot signal it (no pidfd)
_SITE = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "hooks", "site")


class RunResult:
    """How a captured run ended and where its capsule is."""

    __slots__ = ("capsule", "exit_code", "manifest", "status")

    def __init__(self, exit_code: int, status: str, capsule: Path, manifest: dict[str, Any]) -> None:
        self.exit_code = exit_code
        self.status = status
        self.capsule = capsule
        self.manifest = manifest

    def __repr__(self) -> str:
        return f"RunResult(exit_code={self.exit_code}, status={self.status!r}, capsule={str(self.capsule)!r})"


def site_directory() -> Path:
    """The directory holding the injected `sitecustomize.py`."""
    from pathlib import Path

    return Path(_SITE)


def _library_path() -> list[str]:
    """Where this llmtap and its dependencies live, for workloads whose environment lacks them."""
    from importlib.machinery import PathFinder

    import llmtap

    entries = [os.path.dirname(os.path.dirname(os.path.realpath(llmtap.__file__)))]
    dependency = PathFinder.find_spec("orjson")  # located, not imported
    if dependency is not None and dependency.origin:
        entries.append(os.path.dirname(os.path.dirname(os.path.realpath(dependency.origin))))
    return list(dict.fromkeys(entries))


def _child_environment(root: str, base: dict[str, str], echo_is_tty: bool) -> tuple[dict[str, str], list[str]]:
    env = dict(base)
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = _SITE + (os.pathsep + existing if existing else "")
    env["LLMTAP_RUN_CAPSULE"] = root
    env["LLMTAP_RUN_RECORDER_PID"] = str(os.getpid())
    env["LLMTAP_RUN_LIBPATH"] = os.pathsep.join(_library_path())
    if echo_is_tty and "PYTHONUNBUFFERED" not in env:
        # Python block-buffers output into a pipe; on a terminal it would have been line-buffered,
        # so output would no longer appear live.
        env["PYTHONUNBUFFERED"] = "1"
    return env, [_SITE]


def _start(command: Sequence[str], env: dict[str, str]) -> tuple[int, int, int]:
    """Start `command` with its stdout and stderr on new pipes; return (pid, stdout's read end, stderr's).

    As `subprocess.Popen(command, stdout=PIPE, stderr=PIPE, env=env)` would: the program is looked
    up on the PATH of `env`, descriptors other than 0-2 are not inherited, SIGPIPE and SIGXFSZ get
    their default handling back, and a failure raises the same OSError.
    """
    stdout_read, stdout_write = os.pipe()
    stderr_read, stderr_write = os.pipe()
    try:
        actions: list[tuple[int, ...]] = [(os.POSIX_SPAWN_DUP2, stdout_write, 1), (os.POSIX_SPAWN_DUP2, stderr_write, 2)]
        actions.extend((os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable_descriptors())
        pid = _spawn_on_path(command, env, actions)
    except BaseException:
        os.close(stdout_read)
        os.close(stderr_read)
        raise
    finally:
        os.close(stdout_write)
        os.close(stderr_write)
    return pid, stdout_read, stderr_read


def _inheritable_descriptors() -> list[int]:
    """Descriptors above 2 a child would inherit (Python opens its own non-inheritable; these came from our parent)."""
    for listing in ("/proc/self/fd", "/dev/fd"):
        try:
            names = os.listdir(listing)
        except OSError:
            continue
        found = []
        for name in names:
            fd = int(name)
            try:
                if fd > 2 and os.get_inheritable(fd):
                    found.append(fd)
            except OSError:  # the listing's own descriptor, closed by now
                continue
        return found
    return []


def _spawn_on_path(command: Sequence[str], env: dict[str, str], actions: list[tuple[int, ...]]) -> int:
    """posix_spawn the first candidate for `command[0]` that starts; else raise the error `subprocess` would.

    That is the first error other than "no such file" met on the way, or else the last one.
    """
    program = command[0]
    candidates = [program] if os.path.dirname(program) else [os.path.join(entry, program) for entry in os.get_exec_path(env)]
    missing: OSError = FileNotFoundError(2, os.strerror(2), program)
    other: OSError | None = None
    for candidate in candidates:
        try:
            return os.posix_spawn(candidate, list(command), env, file_actions=actions, setsigdef=_RESTORED)
        except (FileNotFoundError, NotADirectoryError) as exc:
            missing = exc
        except OSError as exc:
            other = other or exc
    raise other or missing


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _open_for_keeping(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)


def _exit_descriptor(pid: int) -> int | None:
    """A descriptor that becomes readable when `pid` exits (Linux pidfd), or None where there is none."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        fd: int = pidfd_open(pid)
    except OSError:  # a kernel older than 5.3
        return None
    return fd


class _Command:
    """The started command: its process, and its output copied to our own and into the capsule as it arrives."""

    def __init__(self, pid: int, outputs: dict[int, tuple[int | None, int | None]]) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._outputs = outputs  # pipe read end -> (where to echo it, where to keep it)

    def wait_copying_output(self, linger: float) -> int:
        """Copy output until the command has exited and its pipes are closed, or until `linger`
        seconds after it exited (a grandchild may hold them open); return its return code."""
        poller = select.poll()
        for fd in self._outputs:
            poller.register(fd, select.POLLIN)
        exit_fd = _exit_descriptor(self.pid)
        if exit_fd is not None:
            poller.register(exit_fd, select.POLLIN)
        deadline: float | None = None
        try:
            while True:
                if self.returncode is None and exit_fd is None:
                    self._reap(os.WNOHANG)
                timeout: float | None = None
                if self.returncode is not None:
                    if not self._outputs:
                        break
                    if deadline is None:
                        deadline = time.monotonic() + linger
                    timeout = (deadline - time.monotonic()) * 1000.0
                    if timeout <= 0:
                        break
                elif exit_fd is None:
                    timeout = _EXIT_CHECK_MS
                for fd, _ in poller.poll(timeout):
                    if fd == exit_fd:
                        poller.unregister(exit_fd)
                        self._reap(0)
                    else:
                        self._copy(fd, poller)
        finally:
            if exit_fd is not None:
                os.close(exit_fd)
            for fd in self._outputs:
                os.close(fd)
            self._outputs.clear()
        if self.returncode is None:
            self._reap(0)
        assert self.returncode is not None
        return self.returncode

    def _copy(self, fd: int, poller: select.poll) -> None:
        try:
            chunk = os.read(fd, _PUMP_CHUNK)
        except OSError:  # an unreadable pipe is an ended one
            chunk = b""
        if not chunk:
            poller.unregister(fd)
            os.close(fd)
            del self._outputs[fd]
            return
        echo, keep = self._outputs[fd]
        if echo is not None:
            try:
                _write_all(echo, chunk)
            except OSError:
                echo = None  # our own output went away; keep recording
        if keep is not None:
            try:
                _write_all(keep, chunk)
            except OSError:
                keep = None  # the capsule's copy failed; the output still shows
        self._outputs[fd] = (echo, keep)

    def _reap(self, flags: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored): nothing to report, as subprocess says
            self.returncode = 0
            return
        if pid:
            self.returncode = os.waitstatus_to_exitcode(status)


class _Signals:
    """Notes interruption and forwards signals to the command while it runs."""

    def __init__(self) -> None:
        self.command: _Command | None = None
        self.received: list[int] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Self:
        try:
            for signum in _FORWARDED:
                self._previous[signum] = _signals.signal(signum, self._handle)
        except ValueError:  # not the main thread: signals are left as they are
            pass
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            _signals.signal(signum, handler)

    def _handle(self, signum: int, frame: object) -> None:
        self.received.append(signum)
        command = self.command
        if command is None or command.returncode is not None:
            return
        if signum == _signals.SIGINT and _terminal_sent_it():
            return  # the command is in our foreground process group and got it too
        try:
            os.kill(command.pid, signum)
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
    from .finalise import CaptureOutcome

    if launch_error is not None:
        code = 126 if isinstance(launch_error, PermissionError) else 127
        return CaptureOutcome(
            "failure",
            exit_code=code,
            error={"type": type(launch_error).__name__, "message": f"The command could not be started ({launch_error.strerror})."},
        )
    assert returncode is not None
    exit_code = returncode if returncode >= 0 else 128 - returncode
    if received or -returncode in _FORWARDED:
        name = _signal_name(received[0] if received else -returncode)
        return CaptureOutcome("interrupted", exit_code=exit_code, error={"type": "Interrupted", "signal": name})
    if returncode == 0:
        return CaptureOutcome("success", exit_code=0)
    if returncode < 0:
        name = _signal_name(-returncode)
        return CaptureOutcome(
            "failure", exit_code=exit_code, error={"type": "Signal", "signal": name, "message": f"The command was killed by {name}."}
        )
    return CaptureOutcome(
        "failure", exit_code=exit_code, error={"type": "NonZeroExit", "message": f"The command exited with code {returncode}."}
    )


def _signal_name(signum: int) -> str:
    import signal  # only when a signal is involved (its enums cost milliseconds to build)

    return signal.Signals(signum).name


def _open_capsule(root: str, command: Sequence[str], started: float, handoff: bytes) -> tuple[CapsulePaths, dict[str, Any]]:
    """The capsule's paths and its `running` manifest (written now), once the command has started."""
    from pathlib import Path

    from .manifest import start_manifest
    from .writer import CapsulePaths

    paths = CapsulePaths(Path(root))
    manifest = start_manifest(
        paths, capture_mode="run", command=command, cwd=os.getcwd(), started_at=started, registry_source=registry_source(handoff)
    )
    return paths, manifest


def run_captured(
    command: Sequence[str],
    *,
    runs_dir: str | os.PathLike[str] | None = None,
    registry_path: str | os.PathLike[str] | None = None,
    echo: bool = True,
    linger: float = 2.0,
    environ: dict[str, str] | None = None,
    manifest_fields: dict[str, Any] | None = None,
    before_finalise: Callable[[Path], None] | None = None,
) -> RunResult:
    """Run `command` under capture into a new capsule and return how it ended.

    `manifest_fields` are added to capsule.json (`llmtap replay` names the capsule it replayed);
    `before_finalise(root)` runs once the command has ended, before finalisation, so a file it
    writes into the capsule (the replay report) is redacted and covered like the others.
    Raises ConfigError (before running anything) when the URL registry is malformed.
    """
    handoff = registry_for_run(registry_path)
    started, started_mono = time.time(), time.perf_counter()
    root = create_capsule_directories(runs_dir, with_outputs=True)
    # Held until finalisation: `llmtap runs list` and `runs recover` tell a dead recorder by it.
    runner_lock = hold_runner_lock(os.path.join(root, "internal", "runner.lock"))
    root_identity = directory_identity(root)  # finalisation refuses a root swapped meanwhile
    write_new_file(os.path.join(root, "url_registry.json"), handoff)
    echo_stdout = sys.stdout.fileno() if echo else None
    echo_stderr = sys.stderr.fileno() if echo else None
    is_tty = echo and (os.isatty(sys.stdout.fileno()) or os.isatty(sys.stderr.fileno()))
    env, injected = _child_environment(root, dict(os.environ if environ is None else environ), is_tty)
    uncaptured = uncaptured_python(command, env)
    if uncaptured is not None:
        sys.stderr.write(f"llmtap: warning: {uncaptured['command']} {uncaptured['reason']}; see capture-health.json.\n")
    keep_stdout = _open_for_keeping(os.path.join(root, "outputs", "stdout.txt"))
    keep_stderr = _open_for_keeping(os.path.join(root, "outputs", "stderr.txt"))
    launch_error: OSError | None = None
    returncode: int | None = None
    running: _Command | None = None
    try:
        with _Signals() as signals:
            try:
                pid, stdout_read, stderr_read = _start(command, env)
            except OSError as exc:
                launch_error = exc
            else:
                running = _Command(pid, {stdout_read: (echo_stdout, keep_stdout), stderr_read: (echo_stderr, keep_stderr)})
                signals.command = running
            try:
                paths, manifest = _open_capsule(root, command, started, handoff)
                if manifest_fields:
                    manifest.update(manifest_fields)
                from .finalise import finalise_capsule  # loaded while the command runs
            except BaseException:
                if running is not None:
                    running.wait_copying_output(linger)  # the command still runs to its end, its output shown
                raise
            if running is not None:
                returncode = running.wait_copying_output(linger)
            os.close(keep_stdout)
            os.close(keep_stderr)
            keep_stdout = keep_stderr = -1
            outcome = _outcome(returncode, signals.received, launch_error)
            outcome.duration_ms = round((time.perf_counter() - started_mono) * 1000.0, 3)
            if before_finalise is not None:
                before_finalise(paths.root)
            final = finalise_capsule(
                paths,
                manifest,
                outcome,
                environ=env,
                injected_paths=injected,
                uncaptured=[uncaptured] if uncaptured else (),
                root_identity=root_identity,
            )
    finally:
        for fd in (keep_stdout, keep_stderr, runner_lock):
            if fd >= 0:
                os.close(fd)
    tampered = final.get("capture_tampered")
    if tampered:
        sys.stderr.write(_integrity_line(tampered) + "\n")
    for entry in (final.get("capture_health") or {}).get("unhooked_model_traffic") or []:
        sys.stderr.write(
            f"llmtap: {entry.get('connections')} connection(s) to {entry.get('host')}:{entry.get('port')} by an unhooked "
            f"client in module {entry.get('module')}: those model calls are not recorded (see capture-health.json).\n"
        )
    assert outcome.exit_code is not None
    return RunResult(outcome.exit_code, outcome.status, paths.root, final)


def _integrity_line(tampered: list[dict[str, Any]]) -> str:
    """The one `capture integrity` line naming what the workload replaced (paths inside the capsule only)."""
    names = ", ".join(f"{entry.get('path')} ({entry.get('kind')})" for entry in tampered[:5])
    more = f" and {len(tampered) - 5} more" if len(tampered) > 5 else ""
    return (
        f"llmtap: capture integrity: the workload replaced {len(tampered)} path(s) llmtap manages: {names}{more}; "
        "they were removed without being followed and the capsule is marked tampered (see capture-health.json)."
    )
