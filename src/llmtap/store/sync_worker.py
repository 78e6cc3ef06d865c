"""The sync helper process: fdatasyncs files another process wrote, and says when each is durable.

Run as `python -I -S sync_worker.py` by `sync_offload.SyncOffload`, with requests on stdin and
acknowledgements on stdout; standard library only, so it starts in milliseconds. It exits once its
stdin closes and every request is answered; stdin also closes when the process that started it
dies. It runs in its own session, so a Ctrl-C meant for that process does not cut the syncs it
still owes.

Request: `<QQQHB` (job id, st_dev, st_ino, path length, flags) then the path (UTF-8, surrogate
escapes). Flag 1: the file is new, so sync its directory too. Acknowledgement: `<QI` (job id,
status): 0 when the file is durable, or when the path now names another file (a clear() unlinked
the one written, so there is nothing left to make durable); otherwise the errno of the failure.
Acknowledgements come in the order syncs finish, not the order of the requests.

A batch of several files on an ext4, xfs, btrfs, f2fs or tmpfs filesystem is made durable with one
`syncfs`: one journal commit and one cache flush instead of one per file (far less CPU and wait
for a batch: docs/benchmarks.md, "Capture store"). It also flushes what other
programs wrote to that filesystem, so while it is slower than syncing the files one by one would
be, the helper goes back to per-file syncs and tries again after `SYNCFS_RETRY_SECONDS`, twice as
long after each slow one in a row (at most `SYNCFS_LONGEST_RETRY_SECONDS`).

Otherwise, while syncs are fast (a recent average under `FAST_SYNC_SECONDS`), a batch is synced
right on the reading thread, file after file: no thread hand-offs, the cheapest path. Once they are slow,
files are synced in parallel on up to `MAX_THREADS` threads: concurrent fdatasyncs of different
files share the filesystem's journal commits, so on a slow disk 128 rollouts cost about one sync,
not 128 in a row. Requests for a file that is being synced wait for its next sync (their bytes
may have been written after the running one started), and share it.
"""

from __future__ import annotations

import errno
import os
import queue
import stat
import struct
import sys
import threading
import time
from collections import OrderedDict

TYPE_CHECKING = False  # importing typing would slow the helper's start-up (docs/benchmarks.md)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

REQUEST = struct.Struct("<QQQHB")
ACK = struct.Struct("<QI")
NEW_FILE = 1
MAX_THREADS = 32
FAST_SYNC_SECONDS = 0.0005
IDLE_FILES_KEPT_OPEN = 256
SYNCFS_MIN_FILES = 2
# A syncfs slower than this (and than per-file syncs would have been) is taken for other programs'
# writeback; a lower bar mistook an ordinary busy disk for that (docs/benchmarks.md, "Capture store").
SYNCFS_SLOW_SECONDS = 0.05
SYNCFS_RETRY_SECONDS = 5.0
SYNCFS_LONGEST_RETRY_SECONDS = 300.0

# Filesystems whose syncfs(2) commits their journal (or has nothing to commit) and flushes the
# disk's cache: afterwards every byte written before the call is durable, directory entries
# included. Network and FUSE filesystems are left to per-file syncs.
SYNCFS_FILESYSTEMS = frozenset({0xEF53, 0x58465342, 0x9123683E, 0xF2F52010, 0x01021994})


def parse_requests(buffer: bytearray) -> list[tuple[int, tuple[int, int], bytes, int]]:
    """Take every complete request off the front of `buffer`."""
    requests = []
    offset = 0
    while len(buffer) - offset >= REQUEST.size:
        job_id, device, inode, length, flags = REQUEST.unpack_from(buffer, offset)
        end = offset + REQUEST.size + length
        if end > len(buffer):
            break
        requests.append((job_id, (device, inode), bytes(buffer[offset + REQUEST.size : end]), flags))
        offset = end
    del buffer[:offset]
    return requests


class _File:
    """One file's waiting requests, and its descriptor once opened; synced by one thread at a time."""

    __slots__ = ("path", "fd", "waiting", "syncing")

    def __init__(self, path: bytes) -> None:
        self.path = path
        self.fd: int | None = None
        self.waiting: list[tuple[int, int]] = []  # (job id, flags)
        self.syncing = False

    def sync(self, key: tuple[int, int]) -> int:
        """fdatasync this file; return 0 or the errno."""
        try:
            if self.fd is None:
                try:
                    # Never through a link, never blocking on a FIFO planted at the name.
                    fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
                except (FileNotFoundError, IsADirectoryError):
                    return 0  # unlinked by a clear(): nothing of it is left to sync
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENXIO):
                        return 0  # the name is a link or FIFO now: the file written was unlinked
                    raise
                found = os.fstat(fd)
                if (found.st_dev, found.st_ino) != key or not stat.S_ISREG(found.st_mode):
                    os.close(fd)
                    return 0
                self.fd = fd
            os.fdatasync(self.fd)
        except OSError as exc:
            return exc.errno or 5  # EIO when the error names none
        return 0

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _sync_directory(path: bytes) -> int:
    try:
        fd = os.open(os.path.dirname(path) or b".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        return exc.errno or 5
    return 0


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class FilesystemSync:
    """syncfs(2) through a directory descriptor per filesystem, where the filesystem allows it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._libc: _Libc | None = None
        self._libc_loaded = False
        self._directories: dict[int, int | None] = {}  # st_dev -> directory descriptor, None: not allowed
        self.average_seconds = 0.0
        self._retry_at = 0.0
        self._backoff = SYNCFS_RETRY_SECONDS

    def allowed(self) -> bool:
        return self.average_seconds < SYNCFS_SLOW_SECONDS or self._clock() >= self._retry_at

    def directory_for(self, device: int, path: bytes) -> int | None:
        """A descriptor to sync `device` through (the directory of `path`), or None if it may not be."""
        if device not in self._directories:
            self._directories[device] = self._open_directory(device, os.path.dirname(path) or b".")
        return self._directories[device]

    def sync(self, directory_fd: int, slower_than: float) -> int:
        """syncfs the filesystem of `directory_fd`; 0 or the errno. Backs off when it took longer
        than both `slower_than` (what per-file syncs would have taken) and `SYNCFS_SLOW_SECONDS`."""
        started = self._clock()
        assert self._libc is not None  # a directory was opened for it
        status = 0 if self._libc.syncfs(directory_fd) == 0 else (self._libc.get_errno() or 5)
        elapsed = self._clock() - started
        self.average_seconds += (elapsed - self.average_seconds) / 4
        if elapsed > max(SYNCFS_SLOW_SECONDS, slower_than):
            # Each slow one in a row waits twice as long before the next try, so a filesystem
            # that stays busy with other programs' writes costs one slow batch per few minutes.
            self.average_seconds = max(self.average_seconds, SYNCFS_SLOW_SECONDS)
            self._retry_at = started + self._backoff
            self._backoff = min(self._backoff * 2, SYNCFS_LONGEST_RETRY_SECONDS)
        elif self.average_seconds < SYNCFS_SLOW_SECONDS:
            self._backoff = SYNCFS_RETRY_SECONDS
        return status

    def _open_directory(self, device: int, directory: bytes) -> int | None:
        if not self._libc_loaded:
            self._libc, self._libc_loaded = _load_libc(), True
        if self._libc is None or self._libc.filesystem_type(directory) not in SYNCFS_FILESYSTEMS:
            return None
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        if os.fstat(fd).st_dev != device:
            os.close(fd)
            return None
        return fd

    def close(self) -> None:
        for fd in self._directories.values():
            if fd is not None:
                os.close(fd)
        self._directories.clear()


class _Libc:
    """The C library calls a filesystem sync needs, through ctypes (imported only when first needed)."""

    def __init__(self) -> None:
        import ctypes

        library = ctypes.CDLL(None, use_errno=True)
        self.syncfs: Any = library.syncfs  # AttributeError where the C library has none
        self.statfs: Any = library.statfs
        self.get_errno = ctypes.get_errno
        self._statfs_buffer = ctypes.create_string_buffer(256)  # larger than any struct statfs
        self._long = ctypes.c_long

    def filesystem_type(self, directory: bytes) -> int | None:
        """`f_type` from statfs(2): the struct's first field, a C long on Linux."""
        if self.statfs(directory, self._statfs_buffer) != 0:
            return None
        return int(self._long.from_buffer(self._statfs_buffer).value) & 0xFFFFFFFF


def _load_libc() -> _Libc | None:
    """None where syncfs cannot be trusted: before Linux 5.8 it did not report writeback errors."""
    if not _kernel_at_least(5, 8):
        return None
    try:
        return _Libc()
    except (ImportError, OSError, AttributeError):
        return None


def _kernel_at_least(major: int, minor: int) -> bool:
    system = os.uname()
    if system.sysname != "Linux":
        return False
    try:
        found = tuple(int(part) for part in system.release.split("-")[0].split(".")[:2])
    except ValueError:
        return False
    return found >= (major, minor)


class Syncer:
    """Syncs requested files on a pool of threads and writes each request's acknowledgement."""

    def __init__(self, acks_fd: int, max_threads: int = MAX_THREADS) -> None:
        self._acks_fd = acks_fd
        self._max_threads = max_threads
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._files: OrderedDict[tuple[int, int], _File] = OrderedDict()
        self._ready: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for a file
        self._backlog = 0  # files queued while every thread was busy
        self._unanswered = 0
        self._ack_lock = threading.Lock()
        self.average_sync_seconds = 0.0
        self.filesystem = FilesystemSync()

    def request(self, job_id: int, key: tuple[int, int], path: bytes, flags: int) -> None:
        with self._lock:
            self._unanswered += 1
            file = self._files.get(key)
            if file is None:
                file = self._files[key] = _File(path)
            self._files.move_to_end(key)
            file.waiting.append((job_id, flags))
            if file.syncing:
                return  # its thread takes the new request with its next sync
            file.syncing = True
            if self._idle:
                self._idle -= 1  # a waiting thread takes it
            elif len(self._threads) < self._max_threads:
                thread = threading.Thread(target=self._work, args=(key,), daemon=True)
                self._threads.append(thread)
                thread.start()
                return
            else:
                self._backlog += 1  # the next thread to finish takes it
        self._ready.put(key)

    def _work(self, key: tuple[int, int] | None) -> None:
        while key is not None:
            self._sync_file(key)
            with self._lock:
                if self._backlog:
                    self._backlog -= 1
                else:
                    self._idle += 1
            key = self._ready.get()

    def _sync_file(self, key: tuple[int, int]) -> None:
        while True:
            with self._lock:
                file = self._files[key]
                batch, file.waiting = file.waiting, []
                if not batch:
                    file.syncing = False
                    self._close_idle_files()
                    return
            status = self._sync_timed(file, key, batch)
            acks = b"".join(ACK.pack(job_id, status) for job_id, _ in batch)
            with self._ack_lock:
                _write_all(self._acks_fd, acks)
            with self._lock:
                self._unanswered -= len(batch)
                if not self._unanswered:
                    self._done.notify_all()

    def _sync_timed(self, file: _File, key: tuple[int, int], batch: list[tuple[int, int]]) -> int:
        """Sync a file (and its directory when new) for `batch`; fold the time into the average."""
        started = time.monotonic()
        directory_status = _sync_directory(file.path) if any(flags & NEW_FILE for _, flags in batch) else 0
        status = directory_status or file.sync(key)
        elapsed = time.monotonic() - started
        self.average_sync_seconds += (elapsed - self.average_sync_seconds) / 8  # a racy update only blurs it
        return status

    def sync_filesystem(self, requests: list[tuple[int, tuple[int, int], bytes, int]]) -> bool:
        """Make a batch of several files on one filesystem durable with one syncfs, when it may be
        used; False to sync the files one by one instead.

        A thread may be syncing one of these files meanwhile: the syncfs starts after every byte
        of this batch was written, so it covers them whatever that thread's sync does. While it
        runs, new requests queue in the pipe, and the next batch takes them all.
        """
        files = {key for _, key, _, _ in requests}
        devices = {device for device, _ in files}
        if len(files) < SYNCFS_MIN_FILES or len(devices) != 1 or not self.filesystem.allowed():
            return False
        directory_fd = self.filesystem.directory_for(devices.pop(), requests[0][2])
        if directory_fd is None:
            return False
        if self.filesystem.sync(directory_fd, slower_than=2 * len(files) * self.average_sync_seconds) != 0:
            return False  # the files one by one say which of them failed
        with self._ack_lock:
            _write_all(self._acks_fd, b"".join(ACK.pack(job_id, 0) for job_id, _, _, _ in requests))
        return True

    def sync_here(self, requests: list[tuple[int, tuple[int, int], bytes, int]]) -> bool:
        """Sync a batch on the calling thread, file after file, when syncs are fast and no thread
        is syncing (one could hold a file of this batch); False to hand it to the threads."""
        with self._lock:
            if self.average_sync_seconds >= FAST_SYNC_SECONDS or any(f.syncing for f in self._files.values()):
                return False
            by_file: dict[tuple[int, int], list[tuple[int, int]]] = {}
            for job_id, key, path, flags in requests:
                if key not in self._files:
                    self._files[key] = _File(path)
                self._files.move_to_end(key)
                by_file.setdefault(key, []).append((job_id, flags))
        acks = [
            ACK.pack(job_id, status)
            for key, batch in by_file.items()
            for status in (self._sync_timed(self._files[key], key, batch),)
            for job_id, _ in batch
        ]
        with self._ack_lock:
            _write_all(self._acks_fd, b"".join(acks))
        with self._lock:
            self._close_idle_files()
        return True

    def _close_idle_files(self) -> None:
        """Keep at most IDLE_FILES_KEPT_OPEN files known; the least recently requested idle ones go."""
        excess = len(self._files) - IDLE_FILES_KEPT_OPEN
        for key in list(self._files)[: max(0, excess)]:
            file = self._files[key]
            if not file.syncing and not file.waiting:
                file.close()
                del self._files[key]

    def finish(self) -> None:
        """Wait until every request is answered, then stop the threads."""
        with self._lock:
            while self._unanswered:
                self._done.wait()
        for _ in self._threads:
            self._ready.put(None)
        for thread in self._threads:
            thread.join()
        self.filesystem.close()


def serve(requests_fd: int, acks_fd: int, max_threads: int = MAX_THREADS) -> None:
    syncer = Syncer(acks_fd, max_threads)
    buffer = bytearray()
    try:
        while data := os.read(requests_fd, 1 << 16):
            buffer += data
            requests = parse_requests(buffer)
            if not syncer.sync_filesystem(requests) and not syncer.sync_here(requests):
                for job_id, key, path, flags in requests:
                    syncer.request(job_id, key, path, flags)
    finally:
        syncer.finish()


if __name__ == "__main__":
    try:
        serve(sys.stdin.fileno(), sys.stdout.fileno())
    except BrokenPipeError:  # the store's process went away: nobody to answer
        pass
