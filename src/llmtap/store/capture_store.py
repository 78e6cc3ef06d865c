"""CaptureStore: the only code that reads or writes capture files.

Files under the store root, per rollout id:

    <id>.capture.jsonl       one JSON object per line, append-only (the spec's file)
    <id>.capture.incomplete  marker: at least one record could not be written
    <id>.capture.lock        what writers and clear() flock; never deleted, so no unlink race
    <id>.capture.cleared     tombstone with the time of the last clear(): the late-writer fence
    <id>.capture.late.jsonl  records of calls that started before the last clear()

Every line is written with one `write()` under an exclusive `flock` on the rollout's lock file,
so threads, processes and hosts sharing a POSIX directory never interleave or lose a line, and an
append returns only once its line is durable. Blocking appends are group-committed per rollout:
the first appender with no commit in flight writes and syncs every queued line at once. An
awaited append writes its line on the event loop when the rollout's locks are free (a page-cache
write, microseconds) and leaves only the fdatasync to a sync helper process (`sync_offload`) or
a helper thread, which syncs everything queued meanwhile as one batch; otherwise it joins the
group commit. An append whose caller has nothing else in flight is synced on the loop itself
while the disk is fast: a hand-off would only add two wake-ups. The batching and helper
threads live in `group_commit`, the descriptors kept open per rollout in `rollout_files`, the
write and sync steps in `durable`; `append_path` decides which file each line goes to, `markers`
keeps the incomplete marker and the clear() fence, `reading` reads without a lock (`scan` splits
the lines), and this module opens the root and holds the public methods.

The root is resolved once, at construction, and opened: every file is opened relative to that
directory's descriptor, so a directory swapped in later under the same name never receives a
line. Nothing is followed there: a capture file that is a symbolic link, FIFO, hard link or
other special file is refused (`durable.open_regular`), and the append fails as a counted,
logged capture failure that marks the rollout incomplete; the marker itself replaces whatever
stood at its name, by rename. The marker keeps the number of failures, so `llmtap records
status` in another process can report them (`ReadResult.capture_failures`).

Reads take no lock: lines land whole, by one `write()`. An unterminated last segment (a write in
progress, or a crashed writer) is reported as `torn_tail` and not counted, unless it is a whole
JSON object (a record that lost only its newline); the next committer ends it with a newline
first, so it becomes one line and the new record stays intact. Blank
lines are skipped and take no `call_index`; damaged lines take one, so they never shift the others.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from llmtap.correlation.ids import rollout_file_stem, validate_rollout_id
from llmtap.errors import CaptureDirectoryError
from llmtap.store.append_path import AppendPath, SyncJob
from llmtap.store.durable import SAFE_FLAGS, sync_data, write_all
from llmtap.store.group_commit import BatchedSyncs, CommitThreads, GroupCommitter, PendingAppend
from llmtap.store.inline_sync import InlineSyncGate
from llmtap.store.layout import LOCK_SUFFIX, _describe
from llmtap.store.reading import CaptureReads
from llmtap.store.results import AppendResult
from llmtap.store.rollout_files import RolloutFileCache, SyncDescriptors
from llmtap.store.sync_offload import SyncOffload

__all__ = ["CaptureStore"]

logger = logging.getLogger(__name__)

_TURN_WAIT_SECONDS = 30.0  # how long close() waits for another thread's loop to write what it accepted


def _started_at(record: Mapping[str, Any]) -> float | None:
    value = record.get("started_at")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)



class CaptureStore(AppendPath, CaptureReads):
    """Durable, group-committed, per-rollout JSONL capture files under one root directory.

    Safe to share between threads and asyncio tasks, and between processes and hosts that mount
    the root on a filesystem with working `flock`. Close it (or use it as a context manager) to
    wait for in-flight commits and stop its helper threads; open stores are also closed at exit.

        with CaptureStore("/data/model-calls") as store:
            store.append("4-2", record)
            calls = store.read("4-2").entries
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        create: bool = True,
        sync_process: bool = True,
        refuse_links: bool = False,
    ) -> None:
        """Open the store at `root`, resolved once (the operator's own links are followed then).

        `refuse_links=True` is for a directory another program could have replaced (a run
        capsule's `calls/`): no component of `root` may be a symbolic link. Raises
        CaptureDirectoryError when `root` cannot be created or is not a directory (or is a
        refused link); with `create=False` a missing `root` reads as empty and refuses appends.
        """
        given = Path(os.fspath(root)).expanduser()
        self.root = Path(os.path.abspath(given)) if refuse_links else given.resolve()
        # Awaited appends have their fdatasyncs done by a helper process (see `sync_offload`);
        # False keeps them on this process's helper threads.
        self._sync_process = sync_process
        self._directory = str(self.root)
        if create:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CaptureDirectoryError(
                    f"Could not create the capture directory '{self.root}' ({_describe(exc)}); "
                    "choose a writable path."
                ) from exc
        self._dir_fd = self._open_directory(refuse_links)
        if self._dir_fd >= 0:
            weakref.finalize(self, os.close, self._dir_fd)
        self._marker_failure_logged = False
        self._failures_lock = threading.Lock()
        self._failures: dict[str, int] = {}
        self._marker_lock = threading.Lock()  # held across a marker's read, rewrite and sync
        self._reset_concurrency_state()
        _OPEN_STORES.add(self)

    def _open_directory(self, refuse_links: bool) -> int:
        """The root's descriptor, which every file is opened relative to; -1 when it does not exist."""
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (os.O_NOFOLLOW if refuse_links else 0)
        try:
            fd = os.open(self._directory, flags)
        except FileNotFoundError:
            return -1
        except OSError as exc:
            found = "a symbolic link" if os.path.islink(self._directory) else _describe(exc)
            raise CaptureDirectoryError(
                f"Could not open the capture directory '{self.root}' ({found}); "
                "pass a real directory the store may write to."
            ) from exc
        if refuse_links and os.path.realpath(self._directory) != self._directory:
            os.close(fd)
            raise CaptureDirectoryError(
                f"Refused the capture directory '{self.root}': a directory on its path is a symbolic link, "
                "which another program may have put there; capture into a directory with no links on its path."
            )
        return fd

    def check_writable(self) -> None:
        """Raise CaptureDirectoryError unless a file can be created, written and synced in the root.

        What a server calls at start, so an unwritable capture directory is refused up front
        rather than found at the first call. Leaves nothing behind.
        """
        if self._dir_fd < 0:
            raise CaptureDirectoryError(
                f"The capture directory '{self.root}' does not exist; create it or let the store create it."
            )
        probe = f".llmtap-write-check.{os.getpid()}.{os.urandom(4).hex()}"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | SAFE_FLAGS, 0o600, dir_fd=self._dir_fd)
            try:
                write_all(fd, b"\n")
                sync_data(fd)
            finally:
                os.close(fd)
                os.unlink(probe, dir_fd=self._dir_fd)
        except OSError as exc:
            raise CaptureDirectoryError(
                f"Could not write to the capture directory '{self.root}' ({_describe(exc)}); "
                "make it writable by this user or choose another directory."
            ) from exc

    def failure_counts(self) -> dict[str, int]:
        """Failed appends of this store so far, by kind (`unsafe_file`, `write_failed`, ...)."""
        with self._failures_lock:
            return dict(self._failures)

    def _reset_concurrency_state(self) -> None:
        """Start with no queues, threads or open files (at construction, and in a forked child,
        where the parent's descriptors are already closed and its threads do not exist)."""
        previous = getattr(self, "_offload", None)
        if previous is not None:  # a forked child: the parent's sync helper is not ours
            previous.forget_after_fork()
        self._threads = CommitThreads()
        self._files = RolloutFileCache(self._dir_fd, lambda rollout_id: rollout_file_stem(rollout_id) + LOCK_SUFFIX)
        self._sync_fds = SyncDescriptors(self._dir_fd)
        self._committer = GroupCommitter(self._commit, self._threads)
        self._syncs: BatchedSyncs[SyncJob] = BatchedSyncs(self._sync_batch, self._threads)
        self._offload: SyncOffload[SyncJob] = SyncOffload(self._offloaded, enabled=self._sync_process)
        self._turn = threading.local()  # `lines`: what this thread's event loop appended in its current turn
        self._inline_syncs = InlineSyncGate()
        # Guards the count of lines accepted by append_async and not yet written or queued; a
        # plain lock (taken on every append), with a condition on it that only close() waits on.
        self._turn_lines_lock = threading.Lock()
        self._turn_lines_cond = threading.Condition(self._turn_lines_lock)
        self._turn_lines_waiting = 0
        self._closing = False

    def __repr__(self) -> str:
        return f"CaptureStore('{self.root}')"


    def append(self, rollout_id: str, record: Mapping[str, Any]) -> AppendResult:
        """Append `record` as one line and return once it is durable.

        Blocks the calling thread (on an event loop, use `append_async`). Concurrent appends to
        one rollout share a write and an fdatasync. Raises InvalidRolloutIdError for a bad id,
        and StoreError (chaining the cause) when the record could not be made durable, after
        trying to mark the rollout incomplete; after a failed fdatasync the line may still be
        in the file, so the marker, not the file, says the capture is incomplete.
        """
        rollout_id = validate_rollout_id(rollout_id)
        if self._dir_fd < 0:
            self._refuse_missing_directory(rollout_id)
        entry = PendingAppend(self._encode(rollout_id, record), _started_at(record), None)
        self._enqueue(rollout_id, entry)
        return entry.wait()

    async def append_async(
        self, rollout_id: str, record: Mapping[str, Any], *, alone: bool = False, encoded: bytes | None = None
    ) -> AppendResult:
        """Append `record` and await its durability without blocking the event loop.

        The record is encoded here. At the end of the loop's current turn, the lines each rollout
        received during it are written with one write when the rollout's locks are free (a
        page-cache write), and a sync helper process, or failing that a store-owned thread,
        fdatasyncs them; when the locks are busy the lines join the group commit on a thread.
        Never the loop's default executor. Cancelling the await does not cancel the write: the
        record is still committed.

        `alone=True` says nothing else is in flight on this loop (a server with one request in
        progress): with no turn's lines to share a write with, the line is written at once, and
        while the disk's syncs are fast the loop fdatasyncs the file itself, sparing the two
        wake-ups of a hand-off.

        `encoded` is the record already encoded, newline included (`records.encode_line`, which
        a capture point has run anyway to check the line's depth): written as given, not encoded
        again. It must be the encoding of `record`.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[AppendResult] = loop.create_future()
        rollout_id = validate_rollout_id(rollout_id)
        if self._dir_fd < 0:
            self._refuse_missing_directory(rollout_id)
        data = self._encode(rollout_id, record) if encoded is None else encoded
        entry = PendingAppend(data, _started_at(record), future)
        with self._turn_lines_lock:
            if self._closing:
                self._enqueue(rollout_id, entry)  # raises the closed store's error
            self._turn_lines_waiting += 1
        turn: dict[str, list[PendingAppend]] | None = getattr(self._turn, "lines", None)
        if turn is None and alone:  # nothing to share a write with: write (and maybe sync) right now
            self._write_turn({rollout_id: [entry]}, alone=True)
            return await future
        if turn is None:
            turn = self._turn.lines = {}
            loop.call_soon(self._write_turn, turn)
        turn.setdefault(rollout_id, []).append(entry)
        return await future


    def close(self) -> None:
        """Wait for in-flight commits and syncs, stop the helper threads and close the rollouts'
        files; later appends raise StoreError. Appends already accepted are written first."""
        with self._turn_lines_lock:
            self._closing = True
        own_turn = getattr(self._turn, "lines", None)
        if own_turn:  # closed from the loop that appended them, before its turn ended
            self._write_turn(own_turn)
        with self._turn_lines_cond:
            if not self._turn_lines_cond.wait_for(lambda: not self._turn_lines_waiting, timeout=_TURN_WAIT_SECONDS):
                logger.error(
                    "Closing '%s' with %d appended records never written: their event loop stopped first.",
                    self.root,
                    self._turn_lines_waiting,
                )
        self._committer.close()
        self._offload.close()
        self._syncs.close()
        self._threads.close()
        self._files.close()
        self._sync_fds.close()
        _OPEN_STORES.discard(self)

    def __enter__(self) -> CaptureStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


_OPEN_STORES: weakref.WeakSet[CaptureStore] = weakref.WeakSet()


def _close_open_stores() -> None:
    """At exit, let in-flight commits finish so no awaited record is cut short."""
    for store in list(_OPEN_STORES):
        store.close()


def _reset_after_fork() -> None:
    """A forked child has none of the parent's threads: its stores start with fresh queues."""
    for store in list(_OPEN_STORES):
        store._reset_concurrency_state()


atexit.register(_close_open_stores)
os.register_at_fork(after_in_child=_reset_after_fork)
