"""fdatasync in a helper process, acknowledged through the event loop's own selector.

A thread that syncs for an event loop must take the interpreter lock again after every fsync
and every wake-up, and on a busy server each of those hand-offs stalls the loop: measured in
`llmtap serve`, they were most of what capture cost (docs/benchmarks.md). A helper process
(`sync_worker.py`) syncs with its own interpreter, and the loop reads its acknowledgements like any
other socket, so the loop's process runs no thread for it at all.

`submit` returns False whenever the helper cannot take a job (not started, gone, its pipe full,
called from a second event loop while the first still has jobs): the caller then syncs the
thread way, so the helper only ever makes things faster, never less safe.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from llmtap.store.durable import write_all
from llmtap.store.rollout_files import DESCRIPTORS
from llmtap.store.sync_worker import ACK, NEW_FILE, REQUEST

__all__ = ["SyncOffload"]

logger = logging.getLogger("llmtap.store")

T = TypeVar("T")
_WORKER = str(Path(__file__).with_name("sync_worker.py"))
_HELPER_EXIT_SECONDS = 30.0

# (token, status): 0 durable, an errno if the sync failed, None if the helper is gone before
# answering (the line is written but not known durable: sync it another way).
SyncResults = list[tuple[T, "int | None"]]


class SyncOffload(Generic[T]):
    """One helper process syncing for the event loop that submits to it.

    `on_synced(results)` runs on that loop's thread as acknowledgements arrive, or in `close()`.
    """

    def __init__(self, on_synced: Callable[[SyncResults[T]], None], *, enabled: bool = True) -> None:
        self._on_synced = on_synced
        self._lock = threading.Lock()  # pending jobs and the acknowledgement buffer
        self._pending: dict[int, T] = {}
        self._next_id = 0
        self._buffer = bytearray()
        self._process: subprocess.Popen[bytes] | None = None
        self._pipe = [-1, -1]  # request and acknowledgement descriptors; the finalizer shares this list
        self._loop: asyncio.AbstractEventLoop | None = None
        self._usable = enabled and bool(sys.executable)
        self._closed = False
        self._outbox: list[bytes] = []  # requests not yet written to the helper
        self._flush_scheduled = False
        self._finalizer: weakref.finalize[..., SyncOffload[T]] | None = None

    def submit(self, token: T, path: bytes, inode: tuple[int, int], new_file: bool, *, batched: bool = False) -> bool:
        """Ask the helper to sync `path` (which must still be `inode`); False to sync it another way.

        Call on the thread of a running event loop: its selector delivers the acknowledgement.
        The request is sent at the end of this turn of the loop, with the turn's others; a caller
        submitting a batch itself passes `batched=True` and calls `flush()` after the last one,
        which sends them a turn sooner.
        """
        if self._closed or not self._usable:
            return False
        loop = asyncio.get_running_loop()
        if loop is not self._loop and not self._attach(loop):
            return False
        with self._lock:
            job_id = self._next_id
            self._next_id += 1
            self._pending[job_id] = token
            self._outbox.append(REQUEST.pack(job_id, inode[0], inode[1], len(path), NEW_FILE if new_file else 0))
            self._outbox.append(path)
            if self._flush_scheduled or batched:
                return True
            self._flush_scheduled = True
        loop.call_soon(self.flush)
        return True

    def flush(self) -> None:
        """Send every request submitted so far (this turn of the loop's) with one write.

        One write per turn, not per call: under load the helper wakes once for many requests.
        Only the loop's thread writes, so a short write just leaves the rest for when the pipe
        drains; a request split across writes is reassembled by the helper.
        """
        with self._lock:
            self._flush_scheduled = False
            if not self._outbox or self._requests_fd < 0:
                return
            data = b"".join(self._outbox)
            self._outbox.clear()
            try:
                written = os.write(self._requests_fd, data)
            except BlockingIOError:
                written = 0
            except OSError as exc:  # the helper is gone: its reader's end of file hands the jobs back
                self._give_up("its request pipe failed", exc)
                return
            if written < len(data):
                self._outbox.append(data[written:])
                self._flush_scheduled = True
                if self._loop is not None:
                    self._loop.add_writer(self._requests_fd, self._flush_when_writable)

    def _flush_when_writable(self) -> None:
        if self._loop is not None:
            self._loop.remove_writer(self._requests_fd)
        self.flush()

    def _attach(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Start the helper if needed and read its answers on `loop`; False if another loop still owns it."""
        previous = self._loop
        if previous is not None and not previous.is_closed():
            if previous.is_running() or self._pending:
                return False
            previous.remove_reader(self._acks_fd)
        if self._process is None and not self._start():
            return False
        loop.add_reader(self._acks_fd, self._read_acks)
        self._loop = loop
        return True

    def _start(self) -> bool:
        requests_read, requests_write = DESCRIPTORS.pipe()
        acks_read, acks_write = DESCRIPTORS.pipe()
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-S", _WORKER],
                stdin=requests_read,
                stdout=acks_write,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C for this process must not cut syncs it still owes
            )
        except OSError as exc:
            DESCRIPTORS.close(requests_write)
            DESCRIPTORS.close(acks_read)
            self._give_up("it could not be started", exc)
            return False
        finally:
            DESCRIPTORS.close(requests_read)  # the helper has its own copies now
            DESCRIPTORS.close(acks_write)
        os.set_blocking(requests_write, False)
        os.set_blocking(acks_read, False)
        self._requests_fd, self._acks_fd = requests_write, acks_read
        # Dropped without close() (its store garbage-collected): the helper still finishes and exits.
        self._finalizer = weakref.finalize(self, _stop_helper, self._process, self._pipe)
        # At exit the store's own close() (registered by the store module) settles what is owed;
        # finalizers run before it and would close the pipes under it.
        self._finalizer.atexit = False
        return True

    @property
    def _requests_fd(self) -> int:
        return self._pipe[0]

    @_requests_fd.setter
    def _requests_fd(self, fd: int) -> None:
        self._pipe[0] = fd

    @property
    def _acks_fd(self) -> int:
        return self._pipe[1]

    @_acks_fd.setter
    def _acks_fd(self, fd: int) -> None:
        self._pipe[1] = fd

    def forget_after_fork(self) -> None:
        """In a forked child: the helper and its pipes belong to the parent (the pipes are already
        closed here); drop them without waiting or closing anything."""
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._process is not None:
            self._process.returncode = 0  # not this process's child: nothing to reap or warn about
        self._usable = False
        self._closed = True

    def _give_up(self, why: str, exc: BaseException | None) -> None:
        was_usable, self._usable = self._usable, False
        if was_usable and not self._closed:
            logger.warning(
                "The capture store's sync helper is not used any more because %s (%s); "
                "appends from event loops now sync on helper threads.",
                why,
                type(exc).__name__ if exc else "exited",
            )

    def _read_acks(self) -> None:
        """The loop's reader callback: settle what the helper has acknowledged."""
        results = self._take_acks()
        if results:
            self._on_synced(results)

    def _take_acks(self, *, until_exit: bool = False) -> SyncResults[T]:
        """Read the acknowledgements there are, or all of them up to the helper's exit (on a blocking descriptor)."""
        results: SyncResults[T] = []
        with self._lock:
            while True:
                try:
                    data = os.read(self._acks_fd, 1 << 16)
                except BlockingIOError:
                    break
                if not data:  # the helper exited: whatever it did not answer is not known durable
                    results.extend((token, None) for token in self._pending.values())
                    self._pending.clear()
                    self._detach_reader()
                    self._give_up("it exited", None)
                    break
                self._buffer += data
                usable = len(self._buffer) - len(self._buffer) % ACK.size
                for job_id, status in ACK.iter_unpack(self._buffer[:usable]):
                    token = self._pending.pop(job_id, None)
                    if token is not None:
                        results.append((token, status))
                del self._buffer[:usable]
                if not until_exit and len(data) < 1 << 16:
                    break  # that was all there was; the selector calls again for more
        return results

    def _detach_reader(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed() and self._acks_fd >= 0:
            loop.remove_reader(self._acks_fd)
        if self._acks_fd >= 0:
            DESCRIPTORS.close(self._acks_fd)
            self._acks_fd = -1
        if self._process is not None:
            self._process.wait()

    def close(self) -> None:
        """Stop taking jobs and see every submitted one synced and answered.

        Closing the request pipe lets the helper finish its last batch and exit. Its answers are
        read here, unless the loop reading them runs in another thread: then that loop settles
        them, and the lines are durable once the helper has exited, which this waits for.
        """
        if self._closed:
            return
        self._closed = True
        if self._process is None:
            return
        if self._finalizer is not None:
            self._finalizer.detach()
        loop = self._loop
        if loop is not None and not loop.is_closed() and (not loop.is_running() or _runs_on(loop)):
            loop.remove_writer(self._requests_fd)  # close() sends the rest itself
        with self._lock:  # what this turn of the loop has not sent yet goes now
            if self._outbox and self._usable:
                os.set_blocking(self._requests_fd, True)
                try:
                    write_all(self._requests_fd, b"".join(self._outbox))
                except OSError as exc:  # the helper is gone: its end of file hands the jobs back
                    self._give_up("its request pipe failed", exc)
            self._outbox.clear()
            if self._requests_fd >= 0:
                DESCRIPTORS.close(self._requests_fd)
                self._requests_fd = -1
        loop = self._loop
        if self._acks_fd < 0 or (loop is not None and loop.is_running() and not _runs_on(loop)):
            self._process.wait()  # answers already all read, or the running loop reads them
            return
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self._acks_fd)
            self._loop = None
        os.set_blocking(self._acks_fd, True)
        results = self._take_acks(until_exit=True)
        if results:
            self._on_synced(results)


def _stop_helper(process: subprocess.Popen[bytes], pipe: list[int]) -> None:
    """Close the helper's pipes still open so it finishes its last batch and exits, then reap it.

    Each closed descriptor is marked -1 in the shared list: closing a number twice could close
    whatever file reused it.
    """
    for index, fd in enumerate(pipe):
        if fd >= 0:
            pipe[index] = -1
            DESCRIPTORS.close(fd)
    try:
        process.wait(timeout=_HELPER_EXIT_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _runs_on(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
