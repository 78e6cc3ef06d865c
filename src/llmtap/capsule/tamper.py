"""Tamper-safe finalisation's first step: every path llmtap manages is checked without being opened.

The workload writes into its own capsule, so by the time it exits any managed file may be a
symbolic link, a FIFO, a socket, a device, a hard link to a file outside (link count above one)
or a folder, and any managed folder may be a link. Each is looked at with lstat semantics only
(`os.stat(..., dir_fd=..., follow_symlinks=False)`), through folder descriptors opened with
`O_NOFOLLOW`, so a path is never resolved through something the workload planted. What is wrong
is removed as a name (never followed: the file a link or hard link points at is untouched), and
a stream the workload swapped is recreated empty: `outputs/stdout.txt`, `outputs/stderr.txt`, a
rollout's `calls/<id>.capture.jsonl`, and the managed folders themselves. Each removal is reported
as `{"path", "kind"}` for `capture_tampered` (capsule.json), `tampered_entries`
(capture-health.json) and `stream_tampered` (redaction-proof.json).
"""

from __future__ import annotations

import os
import shutil
import stat

from .writer import CapsulePaths

__all__ = ["EXTRA_MANAGED_FILES", "RECREATED_STREAMS", "sweep_managed_entries"]

# Files only finalisation writes, so anything already there was planted.
EXTRA_MANAGED_FILES = ("redaction-proof.json", "tool-calls.jsonl")
RECREATED_STREAMS = ("outputs/stdout.txt", "outputs/stderr.txt")
_DATA_SUFFIX = ".capture.jsonl"
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _kind(info: os.stat_result) -> str | None:
    """What is wrong with a file entry, or None when it is a regular file with one name."""
    mode = info.st_mode
    if stat.S_ISREG(mode):
        return "hardlink" if info.st_nlink > 1 else None
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    if stat.S_ISDIR(mode):
        return "directory"
    return "special"


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None


def _remove(dir_fd: int, name: str, info: os.stat_result) -> None:
    """Remove one entry as a name; a folder in place of a file goes with everything in it, links unfollowed."""
    if stat.S_ISDIR(info.st_mode):
        if shutil.rmtree.avoids_symlink_attacks:
            shutil.rmtree(name, dir_fd=dir_fd)
        return  # without fd-based removal a folder is left where it is, never walked by name
    os.unlink(name, dir_fd=dir_fd)


def _create_empty(dir_fd: int, name: str) -> None:
    try:
        os.close(os.open(name, _CREATE_FLAGS, 0o644, dir_fd=dir_fd))
    except OSError:  # something was put back meanwhile: the next reader refuses it
        pass


class _Sweep:
    """One pass over a capsule held open by its root descriptor."""

    def __init__(self, root_fd: int) -> None:
        self.root_fd = root_fd
        self.found: list[dict[str, str]] = []
        self.recreated: set[str] = set()

    def open_directory(self, relative: str) -> int | None:
        """A descriptor on the managed folder `relative`, opened part by part, never through a link."""
        fd = self.root_fd
        opened: list[int] = []
        try:
            for part in relative.split("/"):
                fd = os.open(part, _DIRECTORY_FLAGS, dir_fd=fd)
                opened.append(fd)
        except OSError:
            for descriptor in opened:
                os.close(descriptor)
            return None
        for descriptor in opened[:-1]:
            os.close(descriptor)
        return opened[-1] if opened else None

    def check_directory(self, relative: str) -> None:
        parent, _, name = relative.rpartition("/")
        parent_fd = self.open_directory(parent) if parent else self.root_fd
        if parent_fd is None:
            return
        try:
            info = _lstat(parent_fd, name)
            if info is None and parent in self.recreated:
                os.mkdir(name, dir_fd=parent_fd)  # a child of a folder the workload replaced
                self.recreated.add(relative)
                return
            if info is None or stat.S_ISDIR(info.st_mode):
                return
            os.unlink(name, dir_fd=parent_fd)  # the link itself, never what it points to
            self.found.append({"path": relative, "kind": _kind(info) or "file"})
            os.mkdir(name, dir_fd=parent_fd)
            self.recreated.add(relative)  # where the spool's records, counts and output still go
            if relative == "outputs":
                fd = os.open(name, _DIRECTORY_FLAGS, dir_fd=parent_fd)
                try:
                    for stream in RECREATED_STREAMS:
                        _create_empty(fd, stream.rpartition("/")[2])
                finally:
                    os.close(fd)
        except OSError:
            return
        finally:
            if parent_fd != self.root_fd:
                os.close(parent_fd)

    def check_file(self, relative: str) -> None:
        parent, _, name = relative.rpartition("/")
        parent_fd = self.open_directory(parent) if parent else self.root_fd
        if parent_fd is None:
            return
        try:
            self._check_entry(parent_fd, name, relative, recreate=relative in RECREATED_STREAMS)
        finally:
            if parent_fd != self.root_fd:
                os.close(parent_fd)

    def check_entries(self, relative: str) -> None:
        """Every entry of a managed folder: files must be regular with one name; sub-folders are left alone."""
        fd = self.open_directory(relative)
        if fd is None:
            return
        try:
            for name in sorted(os.listdir(fd)):
                info = _lstat(fd, name)
                if info is not None and not stat.S_ISDIR(info.st_mode):
                    self._check_entry(
                        fd, name, f"{relative}/{name}", recreate=relative == "calls" and name.endswith(_DATA_SUFFIX)
                    )
        finally:
            os.close(fd)

    def _check_entry(self, dir_fd: int, name: str, relative: str, *, recreate: bool) -> None:
        info = _lstat(dir_fd, name)
        kind = None if info is None else _kind(info)
        if info is None or kind is None:
            if info is not None and relative == EXTRA_MANAGED_FILES[0]:
                kind = "planted"  # a proof before finalisation made one is the workload's
            else:
                return
        try:
            _remove(dir_fd, name, info)
        except OSError:
            return
        self.found.append({"path": relative, "kind": kind})
        if recreate:
            _create_empty(dir_fd, name)


def sweep_managed_entries(paths: CapsulePaths) -> list[dict[str, str]]:
    """Remove what the workload planted at managed paths (never following it); return what was removed.

    Folders first, parents before children, so each file is looked at inside a folder known to
    be the capsule's own. Never raises for what it finds; a root that cannot be opened as a real
    folder yields nothing (finalisation refuses such a root before calling this).
    """
    try:
        root_fd = os.open(paths.root, _DIRECTORY_FLAGS)
    except OSError:
        return []
    root = str(paths.root)
    sweep = _Sweep(root_fd)
    try:
        directories = [os.path.relpath(str(path), root) for path in paths.managed_directories()]
        for relative in directories:
            sweep.check_directory(relative)
        files = [os.path.relpath(str(path), root) for path in paths.managed_files()]
        for relative in [*files, *EXTRA_MANAGED_FILES]:
            sweep.check_file(relative)
        for relative in directories:
            sweep.check_entries(relative)
    finally:
        os.close(root_fd)
    return sweep.found
