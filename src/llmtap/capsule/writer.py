"""A run capsule on disk: its layout, its creation, and safe writes into it.

    .llmtap/runs/<ULID>/
      capsule.json            manifest (status "running" until finalised)
      calls/                  <rollout_id>.capture.jsonl, written through CaptureStore
      model-calls.jsonl       one OpenTelemetry GenAI record per call (at finalisation)
      env.lock                the workload's interpreter, packages, safe environment
      outputs/stdout.txt      the workload's output (llmtap run)
      outputs/stderr.txt
      capture-health.json     capture counts of every process, summed
      url_registry.json       the registry the hooks matched calls against
      internal/               per-process health counts, interpreter notes (machinery)

The workload writes into its own capsule, so nothing here trusts what it finds: writes replace
files by atomic rename and never follow a symbolic link (`O_NOFOLLOW`); reads refuse links and
special files.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

from .ulid import new_ulid

__all__ = [
    "CapsulePaths",
    "create_capsule",
    "default_runs_dir",
    "read_regular_file",
    "sync_files",
    "write_file_atomic",
    "write_json_atomic",
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

    def managed_files(self) -> list[Path]:
        """Files finalisation reads or writes, which must be regular files (never links)."""
        return [
            self.manifest,
            self.model_calls,
            self.env_lock,
            self.stdout,
            self.stderr,
            self.capture_health,
            self.url_registry,
            self.interpreter,
        ]


def default_runs_dir() -> Path:
    """`$LLMTAP_RUNS_DIR`, else `.llmtap/runs` under the current directory."""
    configured = os.environ.get(RUNS_DIR_ENV)
    return Path(configured).expanduser() if configured else Path(".llmtap") / "runs"


def write_file_atomic(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Replace `path` with `data`: written to a fresh temp file (never through a link), then renamed.

    `sync=False` skips the fsync, for files a later synced write makes durable (`sync_files`).
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)


def write_json_atomic(path: Path, data: Any, *, sync: bool = True) -> None:
    """Write `data` as indented JSON, atomically."""
    encoded = (json.dumps(data, indent=2, sort_keys=False, default=str) + "\n").encode("utf-8")
    write_file_atomic(path, encoded, sync=sync)


def sync_files(paths: list[Path]) -> None:
    """fsync several files at once (concurrently: the filesystem commits them together), then their directories."""
    import threading

    def sync_one(path: Path) -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    threads = [threading.Thread(target=sync_one, args=(path,)) for path in paths]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for directory in {path.parent for path in paths}:
        sync_one(directory)


def read_regular_file(path: Path) -> bytes:
    """Read `path` without following a link or blocking on a FIFO; OSError if it is not a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"'{path}' is not a regular file")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def create_capsule(runs_dir: Path | None = None, *, run_id: str | None = None, with_outputs: bool = True) -> CapsulePaths:
    """Create an empty capsule directory named by a new ULID (or `run_id`) and return its paths."""
    base = (runs_dir or default_runs_dir()).expanduser().resolve()
    base.mkdir(parents=True, exist_ok=True)
    paths = CapsulePaths(base / (run_id or new_ulid()))
    paths.root.mkdir()
    paths.calls.mkdir()
    paths.process_health.mkdir(parents=True)
    if with_outputs:
        paths.outputs.mkdir()
    return paths
