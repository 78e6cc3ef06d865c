"""A run capsule on disk: its layout, its creation, and safe writes into it.

    .llmtap/runs/<ULID>/
      capsule.json            manifest (status "running" until finalised)
      calls/                  <rollout_id>.capture.jsonl, written through CaptureStore
      model-calls.jsonl       one OpenTelemetry GenAI record per call (at finalisation)
      tool-calls.jsonl        one `ToolCallRecord` per MCP request (the spool collector appends)
      network_events.jsonl    one event per HTTP request the workload made (method, host, sizes)
      env.lock                the workload's interpreter, packages, safe environment
      outputs/stdout.txt      the workload's output (llmtap run)
      outputs/stderr.txt
      capture-health.json     capture counts of every process, summed
      url_registry.json       the registry the hooks matched calls against
      internal/               per-process health counts, interpreter notes (machinery)

The workload writes into its own capsule, so nothing here trusts what it finds: writes replace
files by atomic rename and never follow a symbolic link (`O_NOFOLLOW`); reads refuse links and
special files. The atomic replaces and fsyncs are `store.durable`'s, imported where they are
used: `llmtap run` creates its capsule with this module before its command starts, when loading
the store package would cost more than the rest of its start-up.
"""

from __future__ import annotations

import os
import stat

from .ulid import new_ulid

TYPE_CHECKING = False  # `llmtap run` creates capsules before its command starts: no typing, pathlib or json then
if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path
    from typing import Any

__all__ = [
    "CapsulePaths",
    "create_capsule",
    "create_capsule_directories",
    "default_runs_dir",
    "directory_identity",
    "hold_runner_lock",
    "is_real_directory",
    "FileTooLargeError",
    "NotRegularFileError",
    "read_regular_file",
    "sync_files",
    "write_file_atomic",
    "write_json_atomic",
    "write_json_last",
    "write_new_file",
]

RUNS_DIR_ENV = "LLMTAP_RUNS_DIR"


class CapsulePaths:
    """Where each part of a capsule lives."""

    __slots__ = ("root",)

    def __init__(self, root: Path) -> None:
        self.root = root

    def __repr__(self) -> str:
        return f"CapsulePaths({str(self.root)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CapsulePaths) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)

    @property
    def run_id(self) -> str:
        return self.root.name

    @property
    def manifest(self) -> Path:
        return self.root / "capsule.json"

    @property
    def calls(self) -> Path:
        return self.root / "calls"

    @property
    def model_calls(self) -> Path:
        return self.root / "model-calls.jsonl"

    @property
    def tool_calls(self) -> Path:
        return self.root / "tool-calls.jsonl"

    @property
    def network_events(self) -> Path:
        return self.root / "network_events.jsonl"

    @property
    def env_lock(self) -> Path:
        return self.root / "env.lock"

    @property
    def outputs(self) -> Path:
        return self.root / "outputs"

    @property
    def stdout(self) -> Path:
        return self.outputs / "stdout.txt"

    @property
    def stderr(self) -> Path:
        return self.outputs / "stderr.txt"

    @property
    def capture_health(self) -> Path:
        return self.root / "capture-health.json"

    @property
    def url_registry(self) -> Path:
        return self.root / "url_registry.json"

    @property
    def internal(self) -> Path:
        return self.root / "internal"

    @property
    def process_health(self) -> Path:
        return self.internal / "health"

    @property
    def interpreter(self) -> Path:
        return self.internal / "interpreter"

    @property
    def spool(self) -> Path:
        return self.internal / "spool"

    @property
    def runner_lock(self) -> Path:
        return self.internal / "runner.lock"

    def managed_directories(self) -> list[Path]:
        """Directories the recorder writes into, which must be real directories (never links)."""
        return [self.calls, self.outputs, self.internal, self.process_health, self.spool]

    def managed_files(self) -> list[Path]:
        """Files finalisation reads or writes, which must be regular files (never links)."""
        return [
            self.manifest,
            self.model_calls,
            self.tool_calls,
            self.network_events,
            self.env_lock,
            self.stdout,
            self.stderr,
            self.capture_health,
            self.url_registry,
            self.interpreter,
            self.runner_lock,
        ]


def default_runs_dir() -> Path:
    """`$LLMTAP_RUNS_DIR`, else `.llmtap/runs` under the current directory."""
    from pathlib import Path

    return Path(_default_runs_dir())


def _default_runs_dir() -> str:
    configured = os.environ.get(RUNS_DIR_ENV)
    return os.path.expanduser(configured) if configured else os.path.join(".llmtap", "runs")


def write_new_file(path: str | os.PathLike[str], data: bytes) -> None:
    """Create `path` (which must not exist yet, nor be a link) holding `data`; no fsync.

    For a capsule that was just created, where nothing else writes yet: as safe as the atomic
    replace, one rename cheaper.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _json_bytes(data: Any) -> bytes:
    import json

    return (json.dumps(data, indent=2, sort_keys=False, default=str) + "\n").encode("utf-8")


def write_file_atomic(path: str | os.PathLike[str], data: bytes, *, sync: bool = True) -> None:
    """Replace `path` with `data` atomically, never through a link (`store.durable.write_file_atomic`)."""
    # Imported here: `llmtap run` imports this module before its command starts.
    from ..store.durable import write_file_atomic as replace_file

    replace_file(path, data, sync=sync)


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, sync: bool = True) -> None:
    """Write `data` as indented JSON, atomically."""
    write_file_atomic(path, _json_bytes(data), sync=sync)


def write_json_last(path: str | os.PathLike[str], data: Any, *, after: Sequence[str | os.PathLike[str]]) -> None:
    """Replace `path` with `data` as JSON, durably, once the files in `after` and their names are durable.

    A capsule's commit point: its manifest must never say a run is done before the files it names
    are on disk (`store.durable.write_file_last`).
    """
    # Imported here: `llmtap run` imports this module before its command starts.
    from ..store.durable import write_file_last

    write_file_last(path, _json_bytes(data), after=after)


def sync_files(paths: Sequence[str | os.PathLike[str]]) -> None:
    """fsync several files, then their directories (missing files are skipped; `store.durable.sync_files`)."""
    # Imported here: `llmtap run` imports this module before its command starts.
    from ..store.durable import sync_files as sync

    sync(paths)


def directory_identity(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(device, inode) of `path` if it is a real directory (not a link to one), else None."""
    try:
        found = os.lstat(path)
    except OSError:
        return None
    return (found.st_dev, found.st_ino) if stat.S_ISDIR(found.st_mode) else None


def is_real_directory(path: str | os.PathLike[str]) -> bool:
    """True when `path` is a directory itself, not a link to one (the workload may have swapped it)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def hold_runner_lock(lock_path: str) -> int:
    """Create the capsule's runner lock and hold it (the recorder's side); returns its descriptor.

    Called by `llmtap run` right after creating the capsule, before the workload starts, so the
    file cannot have been planted (O_EXCL, O_NOFOLLOW). Close the descriptor to release it.
    """
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.lockf(fd, os.F_LOCK, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


class NotRegularFileError(OSError):
    """Raised by `read_regular_file` for a directory, FIFO, socket or device."""


class FileTooLargeError(OSError):
    """Raised by `read_regular_file` for a file over its `limit`, before anything is read."""

    def __init__(self, path: str | os.PathLike[str], size: int, limit: int) -> None:
        super().__init__(f"'{os.fspath(path)}' is {size} bytes, over the {limit} allowed")
        self.size = size
        self.limit = limit


def read_regular_file(path: str | os.PathLike[str], *, limit: int | None = None) -> bytes:
    """Read `path` without following a link or blocking on a FIFO.

    Raises OSError when it cannot be opened (a link among them), NotRegularFileError when it is
    not a regular file, and, given `limit`, FileTooLargeError when it holds more bytes than that
    (a file that grows while it is read is cut at `limit`).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFileError(f"'{os.fspath(path)}' is not a regular file")
        if limit is not None and info.st_size > limit:
            raise FileTooLargeError(path, info.st_size, limit)
        chunks = []
        left = limit
        while left is None or left > 0:
            chunk = os.read(fd, 1 << 20 if left is None else min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            if left is not None:
                left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def create_capsule(
    runs_dir: str | os.PathLike[str] | None = None, *, run_id: str | None = None, with_outputs: bool = True
) -> CapsulePaths:
    """Create an empty capsule directory named by a new ULID (or `run_id`) and return its paths."""
    from pathlib import Path

    return CapsulePaths(Path(create_capsule_directories(runs_dir, run_id=run_id, with_outputs=with_outputs)))


def create_capsule_directories(
    runs_dir: str | os.PathLike[str] | None = None, *, run_id: str | None = None, with_outputs: bool = True
) -> str:
    """Create an empty capsule's directories and return its root, absolute and resolved, as a string.

    What `create_capsule` does, without building paths objects: `llmtap run` calls it before its
    command starts, when every import counts.
    """
    base = os.path.realpath(os.path.expanduser(os.fspath(runs_dir) if runs_dir else _default_runs_dir()))
    os.makedirs(base, exist_ok=True)
    root = os.path.join(base, run_id or new_ulid())
    os.mkdir(root)
    os.mkdir(os.path.join(root, "calls"))
    os.mkdir(os.path.join(root, "internal"))
    os.mkdir(os.path.join(root, "internal", "health"))
    if with_outputs:
        os.mkdir(os.path.join(root, "outputs"))
    return root
