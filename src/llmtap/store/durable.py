"""Durability steps, atomicwrites-style: each one named, each one a syscall or two.

The one place llmtap makes bytes and names survive a crash: the capture store's appends, markers
and tombstones, and the whole-file rewrites of rollout files (`replace_atomically`). Names are
looked up on `os` at call time, so tests that patch `os.fsync` or `os.fdatasync` reach them.

Capture files live in a directory other programs can write to, so every open of one here goes
through `open_regular`: relative to the directory's descriptor, never through a symbolic link
(`O_NOFOLLOW`), never blocking on a FIFO (`O_NONBLOCK`), and only onto a regular file (`fstat`),
with no second name when it is opened for append (a hard link could name a file elsewhere).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from io import BufferedWriter
from pathlib import Path

from llmtap.errors import UnsafeCaptureFileError

__all__ = [
    "FILE_MODE",
    "SAFE_FLAGS",
    "append_lines_durably",
    "open_for_append",
    "open_regular",
    "replace_atomically",
    "replace_file_synced",
    "sync_data",
    "sync_directory",
    "write_all",
]

FILE_MODE = 0o644
_NOATIME = getattr(os, "O_NOATIME", 0)  # Linux only
# O_NONBLOCK has no effect on a regular file, so it can stay set after the fstat check.
SAFE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

OpenFile = Callable[[str, int, "int | None"], int]


def _plain_open(name: str, flags: int, dir_fd: int | None) -> int:
    return os.open(name, flags, FILE_MODE, dir_fd=dir_fd)


def open_regular(
    name: str, flags: int, *, dir_fd: int | None = None, single_link: bool = False, open_file: OpenFile = _plain_open
) -> int:
    """Open `name` (relative to `dir_fd`) only if it is a regular file; raise UnsafeCaptureFileError if not.

    A symbolic link is never followed, a FIFO never blocks, and with `single_link` a file with
    another name (a hard link, perhaps to a file outside the directory) is refused too. Other
    errors (missing file, permissions, full disk) are raised as the OSError they are.
    """
    try:
        fd = open_file(name, flags | SAFE_FLAGS, dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeCaptureFileError(name, "a symbolic link") from exc
        if exc.errno == errno.ENXIO:  # O_WRONLY | O_NONBLOCK on a FIFO nobody reads
            raise UnsafeCaptureFileError(name, "a FIFO") from exc
        raise
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise UnsafeCaptureFileError(name, _kind(found.st_mode))
        if single_link and found.st_nlink > 1:
            raise UnsafeCaptureFileError(name, f"a file with {found.st_nlink} names (a hard link)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device or other special file"


def write_all(fd: int, payload: bytes) -> None:
    """Write `payload` with one write(); loop only if the kernel writes short."""
    view = memoryview(payload)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(f"write() made no progress on descriptor {fd}")
        view = view[written:]


def append_whole(fd: int, payload: bytes, size: int) -> None:
    """Write `payload` at the end of a file of `size` bytes, or leave the file at `size` bytes.

    A write cut short (ENOSPC, EIO, a quota) would leave half a line, which the next append turns
    into a damaged line for ever; truncating back keeps the file made of whole lines. The caller
    holds the file's lock, so `size` is still its length.
    """
    try:
        write_all(fd, payload)
    except OSError:
        try:
            os.ftruncate(fd, size)
        except OSError:
            pass  # the write's own error is the one to report
        raise


def sync_data(fd: int) -> None:
    """Make the bytes written to `fd` durable (fdatasync; fsync where there is none, as on macOS)."""
    if hasattr(os, "fdatasync"):
        os.fdatasync(fd)
    else:
        os.fsync(fd)


def sync_directory(directory: str | os.PathLike[str] | int) -> None:
    """Make names created, renamed or unlinked in `directory` (a path, or its open descriptor) durable."""
    if isinstance(directory, int):
        os.fsync(directory)
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file_synced(name: str, content: bytes, *, dir_fd: int) -> None:
    """Replace `name` in the directory `dir_fd` with `content`: a fresh synced temp file, then a rename.

    Whatever stood at `name` (a planted link included) is replaced as a name, never written
    through; the caller syncs the directory.
    """
    temporary = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | SAFE_FLAGS, FILE_MODE, dir_fd=dir_fd)
    try:
        try:
            write_all(fd, content)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(temporary, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def open_for_append(name: str, *, dir_fd: int | None = None, open_file: OpenFile = _plain_open) -> int:
    """Open a regular file for append and for the torn-tail check (`open_regular`, one name only).

    O_NOATIME keeps that read from dirtying the inode. `open_file(name, flags, dir_fd)` opens it
    (a registry of descriptors can pass its own).
    """
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT
    try:
        return open_regular(name, flags | _NOATIME, dir_fd=dir_fd, single_link=True, open_file=open_file)
    except PermissionError:  # O_NOATIME needs the file's owner; others still get a correct append
        if not _NOATIME:
            raise
        return open_regular(name, flags, dir_fd=dir_fd, single_link=True, open_file=open_file)


def append_lines_durably(name: str, dir_fd: int, lines: list[bytes]) -> None:
    """Append whole lines to `name` in the directory `dir_fd` with one write and sync them; the caller holds the lock.

    An unterminated last segment (a crashed writer's partial line) is ended with a newline first,
    so it becomes one damaged line and the new lines stay intact.
    """
    fd = open_for_append(name, dir_fd=dir_fd)
    try:
        payload = b"".join(lines)
        size = os.fstat(fd).st_size
        if size == 0:
            # New, or left empty by a crash: make its name durable before any line lands, so a
            # non-empty file always has a durable directory entry.
            sync_directory(dir_fd)
        elif os.pread(fd, 1, size - 1) != b"\n":
            payload = b"\n" + payload
        append_whole(fd, payload, size)
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
