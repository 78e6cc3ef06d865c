"""The sync helper process: fdatasyncs files another process wrote, and says when each is durable.

Run as `python -I -S _sync_worker.py` by `_sync_offload.SyncOffload`, with requests on stdin and
acknowledgements on stdout; standard library only, so it starts in milliseconds. It exits once its
stdin closes and every request is answered; stdin also closes when the process that started it
dies. It runs in its own session, so a Ctrl-C meant for that process does not cut the syncs it
still owes.

Request: `<QQQHB` (job id, st_dev, st_ino, path length, flags) then the path (UTF-8, surrogate
escapes). Flag 1: the file is new, so sync its directory too. Acknowledgement: `<QI` (job id,
status): 0 when the file is durable, or when the path now names another file (a clear() unlinked
the one written, so there is nothing left to make durable); otherwise the errno of the failure.
Acknowledgements come in the order syncs finish, not the order of the requests.

While syncs are fast (a recent average under `FAST_SYNC_SECONDS`), a batch is synced right on
the reading thread, file after file: no thread hand-offs, the cheapest path. Once they are slow,
files are synced in parallel on up to `MAX_THREADS` threads: concurrent fdatasyncs of different
files share the filesystem's journal commits, so on a slow disk 128 rollouts cost about one sync,
not 128 in a row. Requests for a file that is being synced wait for its next sync (their bytes
may have been written after the running one started), and share it.
"""

from __future__ import annotations

import os
import queue
import struct
import sys
import threading
import time
from collections import OrderedDict

REQUEST = struct.Struct("<QQQHB")
ACK = struct.Struct("<QI")
NEW_FILE = 1
MAX_THREADS = 32
FAST_SYNC_SECONDS = 0.0005
IDLE_FILES_KEPT_OPEN = 256


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
                    fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
                except FileNotFoundError:
                    return 0  # unlinked by a clear(): nothing of it is left to sync
                found = os.fstat(fd)
                if (found.st_dev, found.st_ino) != key:
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


def serve(requests_fd: int, acks_fd: int, max_threads: int = MAX_THREADS) -> None:
    syncer = Syncer(acks_fd, max_threads)
    buffer = bytearray()
    try:
        while data := os.read(requests_fd, 1 << 16):
            buffer += data
            requests = parse_requests(buffer)
            if not syncer.sync_here(requests):
                for job_id, key, path, flags in requests:
                    syncer.request(job_id, key, path, flags)
    finally:
        syncer.finish()


if __name__ == "__main__":
    try:
        serve(sys.stdin.fileno(), sys.stdout.fileno())
    except BrokenPipeError:  # the store's process went away: nobody to answer
        pass
