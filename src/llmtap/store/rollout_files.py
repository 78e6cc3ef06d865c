"""The lock and data descriptors of the rollouts a process is writing, kept open between appends.

Opening, locking and closing two files per append cost more than the write itself, so a
`RolloutFiles` keeps a rollout's descriptors open while it is active, and `RolloutFileCache`
closes the least recently used ones past a limit set by the process's descriptor budget.

Inside one process, a rollout's `mutex` stands in for its flock: an flock belongs to an open
file, so threads sharing the cached descriptor would not exclude each other with it. Across
processes the flock still does, taken around each write.

Every descriptor opened here is registered in `DESCRIPTORS`, which closes them all in a forked
child: an flock lasts until the last descriptor sharing it is closed, so a copy left open in the
child would hold a parent commit's lock for the child's whole life.
"""

from __future__ import annotations

import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Callable

from llmtap.errors import StoreError
from llmtap.store.durable import FILE_MODE, open_for_append, open_regular

__all__ = ["DESCRIPTORS", "RolloutFileCache", "RolloutFiles", "SyncDescriptors"]


class ForkClosedDescriptors:
    """The descriptors this process opened for capture files (and their sync helper), so a forked
    child can close its copies."""

    def __init__(self) -> None:
        self._guard = threading.Lock()  # held across fork(), so no descriptor is half-registered
        self._open: set[int] = set()

    def open(self, path: str, flags: int, dir_fd: int | None = None) -> int:
        with self._guard:
            fd = os.open(path, flags | os.O_CLOEXEC, FILE_MODE, dir_fd=dir_fd)
            self._open.add(fd)
        return fd

    def open_regular(self, name: str, flags: int, dir_fd: int, *, single_link: bool = False) -> int:
        """`open_regular` (never a link, FIFO or, with `single_link`, a second name), registered here."""
        return open_regular(name, flags, dir_fd=dir_fd, single_link=single_link, open_file=self.open)

    def pipe(self) -> tuple[int, int]:
        """A pipe (read end, write end), both closed in a forked child."""
        with self._guard:
            read_end, write_end = os.pipe()
            self._open.update((read_end, write_end))
        return read_end, write_end

    def close(self, fd: int) -> None:
        """Close `fd`, releasing any flock held through it."""
        with self._guard:
            self._open.discard(fd)
            os.close(fd)

    def before_fork(self) -> None:
        self._guard.acquire()

    def after_fork_in_parent(self) -> None:
        self._guard.release()

    def after_fork_in_child(self) -> None:
        for fd in self._open:
            try:
                os.close(fd)
            except OSError:
                pass
        self._open.clear()
        self._guard.release()


DESCRIPTORS = ForkClosedDescriptors()
os.register_at_fork(
    before=DESCRIPTORS.before_fork,
    after_in_parent=DESCRIPTORS.after_fork_in_parent,
    after_in_child=DESCRIPTORS.after_fork_in_child,
)


class RolloutFiles:
    """One rollout's open lock file and (once it has lines) data file; use only while holding `mutex`.

    `cleared_at` is the clear() fence read when the data file was opened. It stays exact while
    that file is still linked: clear() unlinks the data file, so a descriptor whose file has no
    links left means a clear() since, and the file and the fence are looked up again.
    """

    __slots__ = ("cleared_at", "closed", "data_fd", "data_path", "dir_fd", "lock_fd", "mutex")

    def __init__(self, dir_fd: int, lock_name: str) -> None:
        self.mutex = threading.Lock()
        self.closed = False
        self.dir_fd = dir_fd
        self.lock_fd = DESCRIPTORS.open_regular(lock_name, os.O_RDWR | os.O_CREAT, dir_fd, single_link=True)
        self.data_fd: int | None = None
        self.cleared_at: float | None = None
        self.data_path: bytes | None = None  # the data file's path encoded once, for the sync helper

    def open_data(self, name: str) -> int:
        """Open (creating) the data file `name` for append; the caller has checked the fence first."""
        self.forget_data()
        self.data_fd = open_for_append(name, dir_fd=self.dir_fd, open_file=DESCRIPTORS.open)
        return self.data_fd

    def forget_data(self) -> None:
        if self.data_fd is not None:
            fd, self.data_fd = self.data_fd, None
            DESCRIPTORS.close(fd)

    def close(self) -> None:
        self.closed = True
        self.forget_data()
        DESCRIPTORS.close(self.lock_fd)


def _cache_limit() -> int:
    """Rollouts kept open: two descriptors each, within an eighth of the process's descriptor limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1024
    return max(8, min(1024, soft // 16))


class RolloutFileCache:
    """The open `RolloutFiles` of one store directory, least recently used closed first."""

    def __init__(self, dir_fd: int, lock_name_for: Callable[[str], str], limit: int | None = None) -> None:
        self._dir_fd = dir_fd
        self._lock_name_for = lock_name_for
        self._limit = limit if limit is not None else _cache_limit()
        self._guard = threading.Lock()
        self._files: OrderedDict[str, RolloutFiles] = OrderedDict()
        self._closed = False

    def acquire(self, rollout_id: str, *, blocking: bool) -> RolloutFiles | None:
        """The rollout's files with their `mutex` held (release it when done), opened on first use.

        None when `blocking` is false and another thread is using them. Raises StoreError once
        the cache is closed.
        """
        while True:
            files = self._get(rollout_id)
            if not files.mutex.acquire(blocking):
                return None
            if not files.closed:
                return files
            files.mutex.release()  # evicted between the lookup and the lock: look again

    def _get(self, rollout_id: str) -> RolloutFiles:
        with self._guard:
            files = self._files.get(rollout_id)
            if files is not None:
                self._files.move_to_end(rollout_id)
                return files
            self._refuse_if_closed(rollout_id)
        files = RolloutFiles(self._dir_fd, self._lock_name_for(rollout_id))
        with self._guard:
            existing = self._files.get(rollout_id)
            if existing is not None or self._closed:  # another thread opened it first, or closing
                files.close()
                self._refuse_if_closed(rollout_id)
                assert existing is not None
                return existing
            self._files[rollout_id] = files
            self._evict()
        return files

    def _refuse_if_closed(self, rollout_id: str) -> None:
        if self._closed:
            raise StoreError(f"Could not open the files of rollout {rollout_id!r}: its store is closed.")

    def _evict(self) -> None:
        """Close idle rollouts past the limit (the caller holds the guard); busy ones are skipped."""
        excess = len(self._files) - self._limit
        if excess <= 0:
            return
        for rollout_id in list(self._files)[: excess * 2]:
            files = self._files[rollout_id]
            if not files.mutex.acquire(blocking=False):
                continue
            try:
                del self._files[rollout_id]
                files.close()
            finally:
                files.mutex.release()
            excess -= 1
            if excess == 0:
                return

    def close(self) -> None:
        """Close every cached descriptor; callers have finished their commits first."""
        with self._guard:
            self._closed = True
            cached, self._files = list(self._files.values()), OrderedDict()
        for files in cached:
            with files.mutex:
                files.close()


class SyncDescriptors:
    """The helper threads' own descriptors of data files, by inode, for syncing lines written elsewhere.

    fdatasync through any descriptor of a file makes all of its written bytes durable, so the
    thread that syncs need not share the writer's descriptor (whose lifetime the writer owns).
    A file found under its path with another inode was unlinked by a clear() after the write.
    """

    def __init__(self, dir_fd: int, limit: int | None = None) -> None:
        self._dir_fd = dir_fd
        self._limit = limit if limit is not None else _cache_limit()
        self._guard = threading.Lock()
        self._fds: OrderedDict[tuple[int, int], int] = OrderedDict()

    def fd_for(self, name: str, inode: tuple[int, int]) -> int | None:
        """A descriptor of `inode`, opened through `name` in the store's directory on first use;
        None if `name` names another file now (one that is not a regular file included)."""
        with self._guard:
            fd = self._fds.get(inode)
            if fd is not None:
                self._fds.move_to_end(inode)
                return fd
        try:
            fd = DESCRIPTORS.open_regular(name, os.O_WRONLY | os.O_APPEND, self._dir_fd)
        except (FileNotFoundError, StoreError):  # unlinked, or replaced by something that is not ours
            return None
        found = os.fstat(fd)
        if (found.st_dev, found.st_ino) != inode:
            DESCRIPTORS.close(fd)
            return None
        with self._guard:
            if inode in self._fds:  # another thread opened it meanwhile
                DESCRIPTORS.close(fd)
                return self._fds[inode]
            self._fds[inode] = fd
            while len(self._fds) > self._limit:
                _, stale = self._fds.popitem(last=False)
                DESCRIPTORS.close(stale)
        return fd

    def close(self) -> None:
        """Close every descriptor; callers have finished syncing."""
        with self._guard:
            fds, self._fds = list(self._fds.values()), OrderedDict()
        for fd in fds:
            DESCRIPTORS.close(fd)
