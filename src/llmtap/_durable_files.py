"""Durability steps, atomicwrites-style: each one named, each one a syscall or two.

The one place llmtap makes bytes and names survive a crash: the capture store's appends, markers
and tombstones, and the whole-file rewrites of rollout files (`replace_atomically`). Names are
looked up on `os` at call time, so tests that patch `os.fsync` or `os.fdatasync` reach them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from io import BufferedWriter
from pathlib import Path

__all__ = [
    "FILE_MODE",
    "append_lines_durably",
    "open_for_append",
    "replace_atomically",
    "sync_data",
    "sync_directory",
    "write_all",
    "write_file_synced",
]

FILE_MODE = 0o644
_NOATIME = getattr(os, "O_NOATIME", 0)  # Linux only


def write_all(fd: int, payload: bytes) -> None:
    """Write `payload` with one write(); loop only if the kernel writes short."""
    view = memoryview(payload)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(f"write() made no progress on descriptor {fd}")
        view = view[written:]


def sync_data(fd: int) -> None:
    """Make the bytes written to `fd` durable (fdatasync; fsync where there is none, as on macOS)."""
    if hasattr(os, "fdatasync"):
        os.fdatasync(fd)
    else:
        os.fsync(fd)


def sync_directory(directory: str | os.PathLike[str]) -> None:
    """Make names created, renamed or unlinked in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_synced(path: str | os.PathLike[str], content: bytes) -> None:
    """Create or truncate `path`, write `content` and fsync it; the caller syncs the directory."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        write_all(fd, content)
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_file(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_CLOEXEC, FILE_MODE)


def open_for_append(path: str, open_file: Callable[[str, int], int] = _open_file) -> int:
    """Open for append and for the torn-tail check; O_NOATIME keeps that read from dirtying the inode.

    `open_file(path, flags)` opens it (a registry of descriptors can pass its own).
    """
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT
    try:
        return open_file(path, flags | _NOATIME)
    except PermissionError:  # O_NOATIME needs the file's owner; others still get a correct append
        if not _NOATIME:
            raise
        return open_file(path, flags)


def append_lines_durably(path: str, directory: str, lines: list[bytes]) -> None:
    """Append whole lines to `path` with one write and sync them; the caller holds the lock.

    An unterminated last segment (a crashed writer's partial line) is ended with a newline first,
    so it becomes one damaged line and the new lines stay intact.
    """
    fd = open_for_append(path)
    try:
        payload = b"".join(lines)
        size = os.fstat(fd).st_size
        if size == 0:
            # New, or left empty by a crash: make its name durable before any line lands, so a
            # non-empty file always has a durable directory entry.
            sync_directory(directory)
        elif os.pread(fd, 1, size - 1) != b"\n":
            payload = b"\n" + payload
        write_all(fd, payload)
        sync_data(fd)
    finally:
        os.close(fd)


@contextmanager
def replace_atomically(target: Path, purpose: str) -> Iterator[BufferedWriter]:
    """Yield a writer whose bytes replace `target` whole, or not at all.

    The writer is a temporary file next to `target`, named for `purpose` and this process. On a
    clean exit it is flushed, fsynced and renamed over `target`, and the directory is synced; on
    any exception it is removed and `target` is left as it was.
    """
    temporary = target.with_name(f".{target.name}.{purpose}-{os.getpid()}.tmp")
    try:
        with temporary.open("wb") as writer:
            yield writer
            writer.flush()
            os.fsync(writer.fileno())
        os.replace(temporary, target)
        sync_directory(target.parent)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
