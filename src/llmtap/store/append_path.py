"""CaptureStore's append path: which file each line goes to, its one write, and its sync.

An awaited append writes its line on the event loop when the rollout's locks are free (a
page-cache write) and leaves only the fdatasync to a sync helper process (`sync_offload`) or a
helper thread; otherwise it joins the group commit (`group_commit`), where the first appender
with no commit in flight writes and syncs every queued line at once. Every line is written with
one `write()` under an exclusive `flock` on the rollout's lock file.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

import orjson

from llmtap.correlation.ids import rollout_file_stem
from llmtap.errors import CaptureDirectoryError, StoreError, UnsafeCaptureFileError
from llmtap.store.durable import append_lines_durably, append_whole, sync_data, sync_directory
from llmtap.store.group_commit import BatchedSyncs, GroupCommitter, PendingAppend, settle
from llmtap.store.inline_sync import InlineSyncGate
from llmtap.store.layout import DATA_SUFFIX, LATE_SUFFIX, _describe
from llmtap.store.markers import MarkersAndFence, logger, split_at_fence
from llmtap.store.results import AppendResult, append_result
from llmtap.store.rollout_files import RolloutFileCache, RolloutFiles, SyncDescriptors
from llmtap.store.sync_offload import SyncOffload

__all__ = ["AppendPath", "SyncJob"]


class SyncJob:
    """Lines an event loop wrote to the data file `inode` with one write, waiting for its fdatasync."""

    __slots__ = ("entries", "inode", "new_file", "rollout_id")

    def __init__(self, rollout_id: str, inode: tuple[int, int], new_file: bool, entries: list[PendingAppend]) -> None:
        self.rollout_id = rollout_id
        self.inode = inode
        self.new_file = new_file
        self.entries = entries


class AppendPath(MarkersAndFence):
    """CaptureStore's write and sync steps; `CaptureStore.append`/`append_async` enter here."""

    _files: RolloutFileCache
    _sync_fds: SyncDescriptors
    _committer: GroupCommitter
    _syncs: BatchedSyncs[SyncJob]
    _offload: SyncOffload[SyncJob]
    _turn: threading.local  # `lines`: what this thread's event loop appended in its current turn
    _inline_syncs: InlineSyncGate
    _turn_lines_cond: threading.Condition
    _turn_lines_waiting: int
    _failures_lock: threading.Lock
    _failures: dict[str, int]

    def _write_turn(self, turn: dict[str, list[PendingAppend]], *, alone: bool = False) -> None:
        """Write what one turn of the loop appended, a write per rollout; the rest goes to the group commit.

        `alone`: one append made with `alone=True` outside any turn, which may also sync here.
        """
        if getattr(self._turn, "lines", None) is turn:
            self._turn.lines = None
        try:
            for rollout_id, entries in turn.items():
                for entry in self._write_now(rollout_id, entries, sync_here=alone):
                    self._enqueue(rollout_id, entry)
        finally:
            self._offload.flush()  # the turn's sync requests, in one write, without waiting a turn
            with self._turn_lines_cond:
                self._turn_lines_waiting -= sum(len(entries) for entries in turn.values())
                self._turn_lines_cond.notify_all()

    def _enqueue(self, rollout_id: str, entry: PendingAppend) -> None:
        """Queue a line for the group commit (a blocking append commits it on its own thread)."""
        if self._committer.enqueue(rollout_id, entry):
            return
        self.mark_incomplete(rollout_id, "a record arrived after the store was closed")
        raise StoreError(
            f"Could not append to rollout {rollout_id!r}: {self!r} is closed; "
            "open a new CaptureStore for further appends."
        )

    def _refuse_missing_directory(self, rollout_id: str) -> None:
        self._count_failure("directory_missing", rollout_id, None)
        raise CaptureDirectoryError(
            f"Could not append to rollout {rollout_id!r}: the capture directory '{self.root}' did not exist "
            "when the store was opened; open the store with create=True."
        )

    def _encode(self, rollout_id: str, record: Mapping[str, Any]) -> bytes:
        try:
            plain = record if isinstance(record, dict) else dict(record)
            return orjson.dumps(plain, option=orjson.OPT_APPEND_NEWLINE)
        except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
            self.mark_incomplete(rollout_id, "a record could not be encoded as JSON")
            raise StoreError(
                f"Could not encode a record for rollout {rollout_id!r} as JSON ({exc}); "
                "pass a mapping with string keys and JSON-able values."
            ) from exc

    def _write_now(self, rollout_id: str, entries: list[PendingAppend], *, sync_here: bool = False) -> list[PendingAppend]:
        """Write awaited lines on the loop's thread and queue their sync; return those left to group-commit.

        Only what cannot block: the in-process mutex and the flock are tried without waiting, and
        lines the clear() fence diverts go the long way. Lines written are settled by their sync;
        a failed write settles them with its StoreError here. With `sync_here` (see `append_async`)
        the sync of an existing file may run here too.
        """
        if self._committer.closed:
            return entries
        try:
            files = self._files.acquire(rollout_id, blocking=False)
        except (StoreError, OSError):
            return entries  # closing, or the lock file cannot be opened: the group commit reports it
        if files is None:
            return entries
        try:
            try:
                fcntl.flock(files.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return entries  # another process (or clear()) holds the rollout
            try:
                cleared_at, data = self._current_data(rollout_id, files)
                current, late = split_at_fence(entries, cleared_at)
                if not current:
                    return late
                fd, inode, new_file = self._write_lines(rollout_id, files, data, [entry.line for entry in current])
                job = SyncJob(rollout_id, inode, new_file, current)
            finally:
                fcntl.flock(files.lock_fd, fcntl.LOCK_UN)
            if sync_here and not new_file and self._inline_syncs.allows():
                self._sync_here(job, fd)  # still this rollout's open data file: the mutex is held
                return late
            if files.data_path is None:
                files.data_path = os.fsencode(self._sibling(rollout_id, DATA_SUFFIX))
            path = files.data_path
        except Exception as exc:
            self._fail(rollout_id, [entry for entry in entries if entry.outcome is None], exc)
            return []
        finally:
            files.mutex.release()
        if not self._offload.submit(job, path, job.inode, job.new_file, batched=True):
            self._sync_on_threads(job)
        return late

    def _sync_here(self, job: SyncJob, fd: int) -> None:
        began = time.perf_counter()
        try:
            sync_data(fd)
        except OSError as exc:
            self._fail(job.rollout_id, job.entries, exc)
            return
        finally:
            self._inline_syncs.took(time.perf_counter() - began)
        self._settle_durable([job])

    def _sync_on_threads(self, job: SyncJob) -> None:
        if not self._syncs.submit(job):  # closed meanwhile: sync here rather than lose the line
            self._sync_batch([job])

    def _offloaded(self, results: list[tuple[SyncJob, int | None]]) -> None:
        """Settle what the sync helper answered: durable, failed with an errno, or not synced."""
        durable: list[SyncJob] = []
        for job, status in results:
            if status == 0:
                durable.append(job)
            elif status is None:
                self._sync_on_threads(job)
            else:
                self._fail(job.rollout_id, job.entries, OSError(status, os.strerror(status)))
        self._settle_durable(durable)

    def _settle_durable(self, jobs: list[SyncJob]) -> None:
        entries: list[PendingAppend] = []
        results: list[AppendResult] = []
        for job in jobs:
            entries += job.entries
            results += [append_result(self._sibling(job.rollout_id, DATA_SUFFIX), False)] * len(job.entries)
        settle(entries, results)

    def _sync_batch(self, jobs: list[SyncJob]) -> None:
        """Sync the files of lines written on a loop, then settle them: one sync per file and batch."""
        errors: dict[tuple[int, int], OSError | None] = {}
        directory_error: OSError | None = None
        try:
            if any(job.new_file for job in jobs):
                try:
                    sync_directory(self._dir_fd)
                except OSError as exc:
                    directory_error = exc
            for job in jobs:
                if job.inode not in errors:
                    errors[job.inode] = self._sync_inode(job.rollout_id, job.inode)
        except BaseException as exc:
            for job in jobs:
                self._fail(job.rollout_id, job.entries, exc)
            raise
        durable: list[SyncJob] = []
        for job in jobs:
            error = directory_error if job.new_file and directory_error else errors[job.inode]
            if error is None:
                durable.append(job)
            else:
                self._fail(job.rollout_id, job.entries, error)
        self._settle_durable(durable)

    def _sync_inode(self, rollout_id: str, inode: tuple[int, int]) -> OSError | None:
        """fdatasync one data file, or the error; a file a clear() has unlinked since needs none."""
        try:
            fd = self._sync_fds.fd_for(rollout_file_stem(rollout_id) + DATA_SUFFIX, inode)
            if fd is not None:
                sync_data(fd)
        except OSError as exc:
            return exc
        return None

    def _commit(self, rollout_id: str, batch: list[PendingAppend]) -> None:
        """Write one batch durably under the rollout's locks; settle every entry, whatever happens."""
        try:
            files = self._files.acquire(rollout_id, blocking=True)
            assert files is not None
            try:
                fcntl.flock(files.lock_fd, fcntl.LOCK_EX)
                try:
                    self._commit_locked(rollout_id, files, batch)
                finally:
                    fcntl.flock(files.lock_fd, fcntl.LOCK_UN)
            finally:
                files.mutex.release()
        except BaseException as exc:
            self._fail(rollout_id, [entry for entry in batch if entry.outcome is None], exc)
            if not isinstance(exc, Exception):
                raise

    def _commit_locked(self, rollout_id: str, files: RolloutFiles, batch: list[PendingAppend]) -> None:
        cleared_at, data = self._current_data(rollout_id, files)
        current, late = split_at_fence(batch, cleared_at)
        if current:
            fd, _, new_file = self._write_lines(rollout_id, files, data, [entry.line for entry in current])
            if new_file:
                sync_directory(self._dir_fd)
            sync_data(fd)
            settle(current, [append_result(self._sibling(rollout_id, DATA_SUFFIX), False)] * len(current))
        if late:
            path = self._sibling(rollout_id, LATE_SUFFIX)
            append_lines_durably(rollout_file_stem(rollout_id) + LATE_SUFFIX, self._dir_fd, [entry.line for entry in late])
            settle(late, [append_result(path, True)] * len(late))

    def _current_data(self, rollout_id: str, files: RolloutFiles) -> tuple[float | None, os.stat_result | None]:
        """The clear() fence that applies now, and the open data file's status if it is still linked.

        A data file with no links left was unlinked by a clear() since it was opened: it is
        dropped, and the fence is read again from the tombstone.
        """
        if files.data_fd is not None:
            data = os.fstat(files.data_fd)
            if data.st_nlink:
                return files.cleared_at, data
            files.forget_data()
        files.cleared_at = self._cleared_at(rollout_id)
        return files.cleared_at, None

    def _write_lines(
        self, rollout_id: str, files: RolloutFiles, data: os.stat_result | None, lines: list[bytes]
    ) -> tuple[int, tuple[int, int], bool]:
        """Append whole lines with one write; return the data descriptor, its inode and whether it was new.

        An unterminated last segment (a crashed writer's partial line) is ended with a newline
        first, so it becomes one damaged line and the new lines stay intact. The caller holds the
        rollout's mutex and flock, and syncs.
        """
        if data is None or files.data_fd is None:
            fd = files.open_data(rollout_file_stem(rollout_id) + DATA_SUFFIX)
            data = os.fstat(fd)
        else:
            fd = files.data_fd
        payload = b"".join(lines)
        size = data.st_size
        # Read the last byte every time: a size alone cannot tell this process's own last line
        # from a file another tool rewrote to the same length.
        if size and os.pread(fd, 1, size - 1) != b"\n":
            payload = b"\n" + payload
        append_whole(fd, payload, size)
        return fd, (data.st_dev, data.st_ino), size == 0

    def _fail(self, rollout_id: str, entries: list[PendingAppend], exc: BaseException) -> None:
        unsafe = isinstance(exc, UnsafeCaptureFileError)
        self._count_failure("unsafe_file" if unsafe else "write_failed", rollout_id, exc)
        self.mark_incomplete(rollout_id, f"an append failed: {_describe(exc)}", failures=max(1, len(entries)))
        path = self._sibling(rollout_id, DATA_SUFFIX)
        advice = "remove what was planted there" if unsafe else "check free space and permissions"
        message = (
            f"Could not append a record to '{path}' ({_describe(exc)}); the rollout is marked "
            f"incomplete: {advice} under '{self.root}'."
        )
        errors = [StoreError(message) for _ in entries]  # one each: a shared one would mix tracebacks
        for error in errors:
            error.__cause__ = exc
        settle(entries, errors)

    def _count_failure(self, kind: str, rollout_id: str, exc: BaseException | None) -> None:
        """Count a failed append by kind; the first of each kind in this store is logged."""
        with self._failures_lock:
            first = kind not in self._failures
            self._failures[kind] = self._failures.get(kind, 0) + 1
        if first:
            logger.error(
                "Capture failure (%s) for rollout %r under '%s': %s; later ones of this kind are counted, not logged.",
                kind,
                rollout_id,
                self.root,
                _describe(exc) if exc is not None else "no directory",
            )
