"""Reading a capsule's files for export without ever following a link the workload planted.

The workload wrote into its capsule, so every entry is untrusted: the walk goes through directory
file descriptors (`O_DIRECTORY | O_NOFOLLOW` for each folder, `lstat` semantics for each entry),
lists only regular files, and reports links, FIFOs, sockets, devices and hard-linked files as
problems. Each file is later opened relative to its folder's descriptor with `O_NOFOLLOW |
O_NONBLOCK` and its `fstat` must match what the walk saw, so a file swapped or rewritten between
the check and the export is refused instead of exported.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from ..errors import LlmtapError
from .bundle_format import BundleLimits, unsafe_name_reason

__all__ = ["CapsuleChangedError", "CapsuleFile", "CapsuleReader"]

MAX_DEPTH = 32
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class CapsuleChangedError(LlmtapError, OSError):
    """Raised when a capsule file is no longer the regular file the walk saw (swapped, grown, rewritten)."""


@dataclass(frozen=True)
class CapsuleFile:
    """A regular file of the capsule as the walk saw it: its relative POSIX path and identity."""

    path: str
    size: int
    identity: tuple[int, int, int, int, int]  # device, inode, size, mtime_ns, ctime_ns


def _identity(info: os.stat_result) -> tuple[int, int, int, int, int]:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a special file"


class CapsuleReader:
    """A capsule directory held open by descriptor, walked and read without following links.

    with CapsuleReader(capsule) as reader:
        files, problems = reader.walk(BundleLimits())
        with reader.open(files[0]) as fd: ...
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._root_fd: int | None = None

    def __enter__(self) -> Self:
        # The root is the path the user named, so a link they made to it is followed; nothing inside is.
        self._root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._root_fd is not None:
            os.close(self._root_fd)
            self._root_fd = None

    @property
    def _fd(self) -> int:
        if self._root_fd is None:
            raise RuntimeError("CapsuleReader is used outside its with block")
        return self._root_fd

    def walk(self, limits: BundleLimits) -> tuple[list[CapsuleFile], list[str]]:
        """Every regular file under the capsule, sorted by path bytes, and the problems met on the way."""
        files: list[CapsuleFile] = []
        problems: list[str] = []
        self._walk(self._fd, "", 0, limits, files, problems)
        total = sum(file.size for file in files)
        if total > limits.max_total_bytes:
            problems.append(f"the capsule holds {total} bytes, more than a bundle may carry ({limits.max_total_bytes})")
        files.sort(key=lambda file: file.path.encode("utf-8"))
        return files, problems

    def _walk(
        self, dir_fd: int, prefix: str, depth: int, limits: BundleLimits, files: list[CapsuleFile], problems: list[str]
    ) -> None:
        for name in sorted(os.listdir(dir_fd)):
            path = prefix + name
            reason = unsafe_name_reason(path)
            if reason is not None:
                problems.append(f"{path!r}: {reason}, so no bundle can list it")
                continue
            try:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                problems.append(f"{path}: vanished while the capsule was being read")
                continue
            if stat.S_ISDIR(info.st_mode):
                if depth + 1 >= MAX_DEPTH:
                    problems.append(f"{path}: folders nest deeper than {MAX_DEPTH} levels")
                    continue
                try:
                    child = os.open(name, _DIRECTORY_FLAGS, dir_fd=dir_fd)
                except OSError as exc:
                    problems.append(f"{path}: could not be opened as a folder ({exc.strerror})")
                    continue
                try:
                    if _identity(os.fstat(child))[:2] != _identity(info)[:2]:
                        problems.append(f"{path}: was replaced while the capsule was being read")
                        continue
                    self._walk(child, path + "/", depth + 1, limits, files, problems)
                finally:
                    os.close(child)
            elif stat.S_ISREG(info.st_mode):
                if info.st_nlink > 1:
                    problems.append(
                        f"{path}: is a hard link ({info.st_nlink} names), so it may be changed from outside the capsule"
                    )
                elif info.st_size > limits.max_member_bytes:
                    problems.append(
                        f"{path}: is {info.st_size} bytes, more than a bundle member may be ({limits.max_member_bytes})"
                    )
                elif len(files) >= limits.max_members:
                    problems.append(
                        f"the capsule holds more than {limits.max_members} files, more than a bundle may carry"
                    )
                    return
                else:
                    files.append(CapsuleFile(path, info.st_size, _identity(info)))
            else:
                problems.append(f"{path}: is {_kind(info.st_mode)}, not a regular file (never followed)")

    @contextmanager
    def open(self, file: CapsuleFile) -> Iterator[int]:
        """A read descriptor on `file`, opened part by part with `O_NOFOLLOW`; CapsuleChangedError if it changed."""
        *folders, name = file.path.split("/")
        opened: list[int] = []
        try:
            dir_fd = self._fd
            for folder in folders:
                dir_fd = os.open(folder, _DIRECTORY_FLAGS, dir_fd=dir_fd)
                opened.append(dir_fd)
            fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            raise CapsuleChangedError(
                f"'{file.path}' could not be reopened without following a link ({exc.strerror})"
            ) from None
        finally:
            for descriptor in opened:
                os.close(descriptor)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or _identity(info) != file.identity:
                raise CapsuleChangedError(f"'{file.path}' changed after the capsule was checked")
            yield fd
            if _identity(os.fstat(fd)) != file.identity:
                raise CapsuleChangedError(f"'{file.path}' changed while it was being read")
        finally:
            os.close(fd)

    def read_all(self, file: CapsuleFile, limit: int) -> bytes:
        """The whole of a small file (at most `limit` bytes), read through `open`."""
        if file.size > limit:
            raise CapsuleChangedError(f"'{file.path}' is {file.size} bytes, more than {limit} that may be read whole")
        with self.open(file) as fd:
            chunks: list[bytes] = []
            remaining = file.size
            while remaining > 0 and (chunk := os.read(fd, min(remaining, 1 << 20))):
                chunks.append(chunk)
                remaining -= len(chunk)
        return b"".join(chunks)
