"""Reading the files the viewer shows without following a link or blocking on a FIFO.

The viewer opens only files inside the paths it was given. A workload could have replaced a
capture file with a symlink to something else, or with a FIFO, so every open here uses
`O_NOFOLLOW | O_NONBLOCK` and checks with `fstat` that it holds a regular file before reading,
and every read is bounded.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from ..errors import LlmtapError

__all__ = ["FileState", "UnsafeFileError", "file_state", "read_bounded"]

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UnsafeFileError(LlmtapError, OSError):
    """Raised when a file the viewer would read is a link, a FIFO, a directory or too large."""


@dataclass(frozen=True, slots=True)
class FileState:
    """What `lstat` says about a file: enough to tell whether it changed since the last look."""

    size: int
    mtime_ns: int
    inode: tuple[int, int]


def file_state(path: str) -> FileState | None:
    """The state of a regular file at `path` (not following a link); None when missing or not regular."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    return FileState(info.st_size, info.st_mtime_ns, (info.st_dev, info.st_ino))


def read_bounded(path: str, *, offset: int = 0, limit: int) -> tuple[bytes, FileState]:
    """Read at most `limit` bytes of the regular file `path` from `offset`; return them and its state.

    Raises FileNotFoundError when it is gone and UnsafeFileError when it is a link or not a
    regular file. The state is the opened file's own (`fstat`), so it describes the bytes read.
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise UnsafeFileError(
            f"Could not open '{path}' ({exc.strerror}); the viewer reads regular files only, never through a link."
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFileError(f"'{path}' is not a regular file; the viewer does not read it.")
        state = FileState(info.st_size, info.st_mtime_ns, (info.st_dev, info.st_ino))
        chunks: list[bytes] = []
        remaining = min(limit, max(0, info.st_size - offset))
        position = offset
        while remaining > 0:
            chunk = os.pread(fd, min(remaining, 1 << 20), position)
            if not chunk:
                break
            chunks.append(chunk)
            position += len(chunk)
            remaining -= len(chunk)
        return b"".join(chunks), state
    finally:
        os.close(fd)
