"""Durability steps, atomicwrites-style: each one named, each one a syscall or two.

The one place llmtap makes bytes and names survive a crash: the capture store's appends, markers
and tombstones, the whole-file rewrites of rollout files (`replace_atomically`), and a capsule's
files (`write_file_atomic`, and `write_file_last` for its manifest, the commit point). Names are
looked up on `os` at call time, so tests that patch `os.fsync` or `os.fdatasync` reach them.

Capture files live in a directory other programs can write to, so every open of one here goes
through `open_regular`: relative to the directory's descriptor, never through a symbolic link
(`O_NOFOLLOW`), never blocking on a FIFO (`O_NONBLOCK`), and only onto a regular file (`fstat`),
with no second name when it is opened for append (a hard link could name a file elsewhere).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Callable, Iterator, Sequence
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
    "sync_files",
    "write_all",
    "write_file_atomic",
    "write_file_last",
    "write_temporary",
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


def append_lines_durably(name: str, dir_fd: int, lines: list[bytes], *, lock_file: bool = False) -> None:
    """Append whole lines to `name` in the directory `dir_fd` with one write and sync them.

    The caller holds the lock, or with `lock_file` the file itself is locked (`flock`) while
    the lines go in, for writers that share no lock file. An unterminated last segment (a crashed
    writer's partial line) is ended with a newline first, so it becomes one damaged line and the
    new lines stay intact.
    """
    fd = open_for_append(name, dir_fd=dir_fd)
    try:
        if lock_file:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released when the descriptor is closed
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

    The writer is a temporary file next to `target`, named for `purpose`, this process and a
    random part, and created with O_EXCL | O_NOFOLLOW: a link or file planted at that name is
    never written through (the open fails instead). On a clean exit it is flushed, fsynced and
    renamed over `target`, and the directory is synced; on any exception it is removed and
    `target` is left as it was.
    """
    temporary = target.with_name(f".{target.name}.{purpose}-{os.getpid()}-{os.urandom(4).hex()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | SAFE_FLAGS, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as writer:
            yield writer
            writer.flush()
            os.fsync(writer.fileno())
        os.replace(temporary, target)
        sync_directory(target.parent)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_file_atomic(path: str | os.PathLike[str], data: bytes, *, sync: bool = True) -> None:
    """Replace `path` with `data`: written to a fresh temp file (never through a link), then renamed.

    `sync=False` skips the fsync, for files a later synced write makes durable (`sync_files`).
    """
    temporary = write_temporary(path, data, sync=sync)
    try:
        os.replace(temporary, path)
    except BaseException:
        _remove_quietly(temporary)
        raise


def write_temporary(path: str | os.PathLike[str], data: bytes, *, sync: bool) -> str:
    """Write `data` to a new temp file next to `path` and return its name.

    The name is fresh (pid, clock and a random part) and created with O_EXCL | O_NOFOLLOW, so
    nothing planted next to `path` is ever written through; a failed write leaves no temp file.
    """
    directory, name = os.path.split(os.fspath(path))
    temporary = os.path.join(directory, f".{name}.{os.getpid()}.{time.monotonic_ns()}.{os.urandom(3).hex()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        try:
            write_all(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        _remove_quietly(temporary)
        raise
    return temporary


def _remove_quietly(path: str | os.PathLike[str]) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def write_file_last(path: str | os.PathLike[str], data: bytes, *, after: Sequence[str | os.PathLike[str]]) -> None:
    """Replace `path` with `data`, durably, once the files in `after` and their names are durable.

    A capsule's commit point: its manifest must never say a run is done before the files it names
    are on disk. One pass of syncs: the new manifest goes to a temp file, it and every file in
    `after` are synced together (`sync_files`), then the temp file is renamed over `path` and the
    directory synced, so the rename itself survives a crash.
    """
    temporary = write_temporary(path, data, sync=False)
    try:
        sync_files([*after, temporary])
        os.replace(temporary, path)
    except BaseException:
        _remove_quietly(temporary)
        raise
    _sync_directory_if_present(os.path.dirname(os.fspath(path)))


def sync_files(paths: Sequence[str | os.PathLike[str]]) -> None:
    """fsync several files, then their directories (missing files are skipped).

    Writeback of every file is started before the first fsync, so on a journalling filesystem
    one commit tends to carry them all and the later fsyncs find little left to do: as quick as
    syncing them on threads, without the threads.
    """
    fds: list[int] = []
    try:
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue
            if stat.S_ISREG(os.fstat(fd).st_mode):
                fds.append(fd)
            else:  # swapped for a FIFO or device since it was written: nothing of ours to sync
                os.close(fd)
        for fd in fds:
            _start_writeback(fd)
        for fd in fds:
            os.fsync(fd)
    finally:
        for fd in fds:
            os.close(fd)
    for directory in dict.fromkeys(os.path.dirname(os.fspath(path)) for path in paths):
        _sync_directory_if_present(directory)


def _start_writeback(fd: int) -> None:
    """Ask the kernel to start writing `fd`'s dirty pages now (Linux does for POSIX_FADV_DONTNEED); a hint only."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None:
        try:
            advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


def _sync_directory_if_present(directory: str) -> None:
    """fsync `directory` (never through a link); a directory that cannot be opened is skipped."""
    try:
        fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
