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
write and sync steps in `durable`; this module decides which file each line goes to.

The root is resolved once, at construction, and opened: every file is opened relative to that
directory's descriptor, so a directory swapped in later under the same name never receives a
line. Nothing is followed there: a capture file that is a symbolic link, FIFO, hard link or
other special file is refused (`durable.open_regular`), and the append fails as a counted,
logged capture failure that marks the rollout incomplete; the marker itself replaces whatever
stood at its name, by rename. The marker keeps the number of failures, so `llmtap records
status` in another process can report them (`ReadResult.capture_failures`).

Reads take no lock: lines land whole, by one `write()`. An unterminated last segment (a write in
progress, or a crashed writer) is reported as `torn_tail` and not counted; the next committer ends
it with a newline first, so it becomes one damaged line and the new record stays intact. Blank
lines are skipped and take no `call_index`; damaged lines take one, so they never shift the others.
"""

from __future__ import annotations

import asyncio
import atexit
import errno
import fcntl
import logging
import os
import stat
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson

from llmtap.correlation.ids import rollout_file_stem, rollout_id_from_file_stem, validate_rollout_id
from llmtap.errors import (
    CaptureDirectoryError,
    CaptureRecordError,
    StoreError,
    UnsafeCaptureFileError,
)
from llmtap.store.durable import (
    SAFE_FLAGS,
    append_lines_durably,
    append_whole,
    open_regular,
    replace_file_synced,
    sync_data,
    sync_directory,
    write_all,
)
from llmtap.store.group_commit import BatchedSyncs, CommitThreads, GroupCommitter, PendingAppend, settle
from llmtap.store.results import AppendResult, ReadResult, append_result
from llmtap.store.rollout_files import DESCRIPTORS, RolloutFileCache, RolloutFiles, SyncDescriptors
from llmtap.store.sync_offload import SyncOffload

__all__ = ["CaptureStore"]

logger = logging.getLogger(__name__)

DATA_SUFFIX = ".capture.jsonl"
MARKER_SUFFIX = ".capture.incomplete"
LOCK_SUFFIX = ".capture.lock"
TOMBSTONE_SUFFIX = ".capture.cleared"
LATE_SUFFIX = ".capture.late.jsonl"

_MARKER_READ_LIMIT = 65536  # a marker is a few dozen bytes; a bigger one is not ours
_TURN_WAIT_SECONDS = 30.0  # how long close() waits for another thread's loop to write what it accepted

_JSON_TYPE_NAMES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


def _scan_lines(data: bytes) -> Iterator[tuple[int, int, dict[str, Any] | None, str]]:
    """Yield (1-based line number, call_index, record or None, problem) per complete non-blank line.

    The one parse path behind strict and tolerant reads.
    """
    start = line_number = call_index = 0
    while (end := data.find(b"\n", start)) >= 0:
        segment = data[start:end]
        start = end + 1
        line_number += 1
        if not segment.strip():
            continue
        try:
            value = orjson.loads(segment)
        except orjson.JSONDecodeError as exc:
            yield line_number, call_index, None, f"it is not valid JSON ({exc})"
        else:
            kind = "object" if isinstance(value, dict) else _JSON_TYPE_NAMES.get(type(value), "null")
            yield line_number, call_index, value if kind == "object" else None, f"it holds a JSON {kind}, not an object"
        call_index += 1


def _started_at(record: Mapping[str, Any]) -> float | None:
    value = record.get("started_at")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _split_at_fence(
    entries: list[PendingAppend], cleared_at: float | None
) -> tuple[list[PendingAppend], list[PendingAppend]]:
    """(current, late): lines of calls that started before the last clear() are late; lines
    without a start time never are."""
    if cleared_at is None:
        return entries, []
    late = [e for e in entries if e.started_at is not None and e.started_at < cleared_at]
    current = [e for e in entries if e.started_at is None or e.started_at >= cleared_at]
    return current, late


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"


class _SyncJob:
    """Lines an event loop wrote to the data file `inode` with one write, waiting for its fdatasync."""

    __slots__ = ("entries", "inode", "new_file", "rollout_id")

    def __init__(self, rollout_id: str, inode: tuple[int, int], new_file: bool, entries: list[PendingAppend]) -> None:
        self.rollout_id = rollout_id
        self.inode = inode
        self.new_file = new_file
        self.entries = entries


class _InlineSyncGate:
    """Whether an append may fdatasync on the event loop itself instead of handing the sync off.

    Only for a caller that says nothing else is in flight (nobody waits behind the loop then,
    and the hand-off to a helper and back costs two process wake-ups, more than a fast disk's
    sync), and only while this disk's syncs stay fast: once their moving average passes
    `SLOW_SECONDS` the helper takes them again, and the loop tries one again after
    `RETRY_SECONDS`.
    """

    SLOW_SECONDS = 0.002
    RETRY_SECONDS = 1.0

    def __init__(self) -> None:
        self._average = 0.0
        self._retry_at = 0.0

    def allows(self) -> bool:
        return self._average < self.SLOW_SECONDS or time.monotonic() >= self._retry_at

    def took(self, seconds: float) -> None:
        self._average += (seconds - self._average) * 0.2
        if self._average >= self.SLOW_SECONDS:
            self._retry_at = time.monotonic() + self.RETRY_SECONDS


class CaptureStore:
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
        self._syncs: BatchedSyncs[_SyncJob] = BatchedSyncs(self._sync_batch, self._threads)
        self._offload: SyncOffload[_SyncJob] = SyncOffload(self._offloaded, enabled=self._sync_process)
        self._turn = threading.local()  # `lines`: what this thread's event loop appended in its current turn
        self._inline_syncs = _InlineSyncGate()
        # Guards the count of lines accepted by append_async and not yet written or queued; a
        # plain lock (taken on every append), with a condition on it that only close() waits on.
        self._turn_lines_lock = threading.Lock()
        self._turn_lines_cond = threading.Condition(self._turn_lines_lock)
        self._turn_lines_waiting = 0
        self._closing = False

    def __repr__(self) -> str:
        return f"CaptureStore('{self.root}')"

    def path_for(self, rollout_id: str) -> Path:
        """Return `<root>/<rollout_id>.capture.jsonl`, after validating the id."""
        return self.root / f"{rollout_file_stem(validate_rollout_id(rollout_id))}{DATA_SUFFIX}"

    def marker_path_for(self, rollout_id: str) -> Path:
        """Return `<root>/<rollout_id>.capture.incomplete`, after validating the id."""
        return self.root / f"{rollout_file_stem(validate_rollout_id(rollout_id))}{MARKER_SUFFIX}"

    def _sibling(self, rollout_id: str, suffix: str) -> str:
        """A path as a plain string: pathlib's cost shows on the append path."""
        return f"{self._directory}{os.sep}{rollout_file_stem(rollout_id)}{suffix}"

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

    async def append_async(self, rollout_id: str, record: Mapping[str, Any], *, alone: bool = False) -> AppendResult:
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
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[AppendResult] = loop.create_future()
        rollout_id = validate_rollout_id(rollout_id)
        if self._dir_fd < 0:
            self._refuse_missing_directory(rollout_id)
        entry = PendingAppend(self._encode(rollout_id, record), _started_at(record), future)
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
                current, late = _split_at_fence(entries, cleared_at)
                if not current:
                    return late
                fd, inode, new_file = self._write_lines(rollout_id, files, data, [entry.line for entry in current])
                job = _SyncJob(rollout_id, inode, new_file, current)
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

    def _sync_here(self, job: _SyncJob, fd: int) -> None:
        began = time.perf_counter()
        try:
            sync_data(fd)
        except OSError as exc:
            self._fail(job.rollout_id, job.entries, exc)
            return
        finally:
            self._inline_syncs.took(time.perf_counter() - began)
        self._settle_durable([job])

    def _sync_on_threads(self, job: _SyncJob) -> None:
        if not self._syncs.submit(job):  # closed meanwhile: sync here rather than lose the line
            self._sync_batch([job])

    def _offloaded(self, results: list[tuple[_SyncJob, int | None]]) -> None:
        """Settle what the sync helper answered: durable, failed with an errno, or not synced."""
        durable: list[_SyncJob] = []
        for job, status in results:
            if status == 0:
                durable.append(job)
            elif status is None:
                self._sync_on_threads(job)
            else:
                self._fail(job.rollout_id, job.entries, OSError(status, os.strerror(status)))
        self._settle_durable(durable)

    def _settle_durable(self, jobs: list[_SyncJob]) -> None:
        entries: list[PendingAppend] = []
        results: list[AppendResult] = []
        for job in jobs:
            entries += job.entries
            results += [append_result(self._sibling(job.rollout_id, DATA_SUFFIX), False)] * len(job.entries)
        settle(entries, results)

    def _sync_batch(self, jobs: list[_SyncJob]) -> None:
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
        durable: list[_SyncJob] = []
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
        current, late = _split_at_fence(batch, cleared_at)
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

    def _lock(self, rollout_id: str) -> int:
        """Open the rollout's lock file on its own and take its flock; `DESCRIPTORS.close` releases it.

        Used by clear(): a second open file, so its flock also excludes this process's writers.
        """
        fd = DESCRIPTORS.open_regular(rollout_file_stem(rollout_id) + LOCK_SUFFIX, os.O_RDWR | os.O_CREAT, self._dir_fd, single_link=True)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            DESCRIPTORS.close(fd)
            raise
        return fd

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

    def _cleared_at(self, rollout_id: str) -> float | None:
        tombstone = rollout_file_stem(rollout_id) + TOMBSTONE_SUFFIX
        # The usual case, and cheaper than a failed open(); a planted link counts as present and is refused below.
        if not os.access(tombstone, os.F_OK, dir_fd=self._dir_fd, follow_symlinks=False):
            return None
        try:
            fd = open_regular(tombstone, os.O_RDONLY, dir_fd=self._dir_fd, single_link=True)
        except FileNotFoundError:
            return None
        try:
            raw, mtime = os.read(fd, 4096), os.fstat(fd).st_mtime
        finally:
            os.close(fd)
        try:
            value = orjson.loads(raw)["cleared_at"]
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
        except (orjson.JSONDecodeError, KeyError, TypeError):
            pass
        return mtime  # an unreadable tombstone still fences, at its file time

    def mark_incomplete(self, rollout_id: str, reason: str, *, failures: int = 1) -> None:
        """Create or refresh the rollout's `.capture.incomplete` marker, durably; never raises.

        `reason` is stored in the marker: pass a short cause, never prompt text. The marker also
        counts `failures`, added to those it already counts (two processes marking at the same
        moment may count one fewer: the count is a lower bound). It is replaced by rename, so a
        link planted at its name is replaced, never followed. A failure to write the marker is
        logged once per store.
        """
        try:
            name = rollout_file_stem(validate_rollout_id(rollout_id)) + MARKER_SUFFIX
            if self._dir_fd < 0:
                raise FileNotFoundError(2, "the capture directory does not exist", self._directory)
            with self._marker_lock:  # one marker update at a time in this process
                earlier = self._marker_failures(name)
                content = orjson.dumps(
                    {"marked_at": time.time(), "reason": str(reason), "failures": earlier + max(1, failures)},
                    option=orjson.OPT_APPEND_NEWLINE,
                )
                try:
                    replace_file_synced(name, content, dir_fd=self._dir_fd)
                except OSError as exc:
                    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    # A full disk has no block for the count, but an empty marker needs none: it
                    # still says the rollout lost a record (read as one failure).
                    replace_file_synced(name, b"", dir_fd=self._dir_fd)
            sync_directory(self._dir_fd)
        except Exception as exc:
            if not self._marker_failure_logged:
                self._marker_failure_logged = True
                logger.error(
                    "Could not mark rollout %r incomplete under '%s' (%s); later marker failures "
                    "in this store are not logged.",
                    rollout_id,
                    self.root,
                    _describe(exc),
                )

    def _marker_failures(self, name: str) -> int:
        """The failures a marker counts: 0 when there is none, 1 for a marker without a count (or not ours)."""
        try:
            fd = open_regular(name, os.O_RDONLY, dir_fd=self._dir_fd, single_link=True)
        except FileNotFoundError:
            return 0
        except (OSError, StoreError):  # a link or FIFO at the marker's name: still a marked rollout
            return 1
        try:
            value = orjson.loads(os.read(fd, _MARKER_READ_LIMIT)).get("failures")
        except (OSError, orjson.JSONDecodeError, AttributeError):
            return 1
        finally:
            os.close(fd)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1

    def clear(self, rollout_id: str) -> None:
        """Delete the rollout's capture and fence out writers whose calls started before now.

        Under the rollout lock, unlinks the data file, marker and late file, and writes and syncs
        a tombstone holding `time.time()`. A later append whose record's `started_at` is earlier
        goes to `<id>.capture.late.jsonl`, not into the new attempt's calls. Records without a
        numeric `started_at` are never diverted.

        Clock skew: the fence compares this host's clock with the writer's `started_at`. Across
        hosts, a writer whose clock lags by more than the time between the clear and its call's
        start is wrongly diverted, and a stale writer whose clock runs ahead slips through. Keep
        hosts NTP-synced; on one host the fence is exact.
        """
        rollout_id = validate_rollout_id(rollout_id)
        try:
            lock_fd = self._lock(rollout_id)
            try:
                for suffix in (DATA_SUFFIX, MARKER_SUFFIX, LATE_SUFFIX):
                    try:
                        os.unlink(rollout_file_stem(rollout_id) + suffix, dir_fd=self._dir_fd)  # a planted link goes, not its target
                    except FileNotFoundError:
                        pass
                self._write_tombstone(rollout_id, time.time())
                sync_directory(self._dir_fd)
            finally:
                DESCRIPTORS.close(lock_fd)
        except OSError as exc:
            raise StoreError(
                f"Could not clear the capture of rollout {rollout_id!r} under '{self.root}' "
                f"({_describe(exc)}); check that the directory is writable."
            ) from exc

    def _write_tombstone(self, rollout_id: str, cleared_at: float) -> None:
        """Write the tombstone through a synced temp file and a rename; the caller syncs the directory."""
        content = orjson.dumps({"cleared_at": cleared_at}, option=orjson.OPT_APPEND_NEWLINE)
        replace_file_synced(rollout_file_stem(rollout_id) + TOMBSTONE_SUFFIX, content, dir_fd=self._dir_fd)

    def rollouts(self) -> list[str]:
        """Return the sorted ids that have a data file or an incomplete marker."""
        if self._dir_fd < 0:
            return []
        try:
            names = os.listdir(self._dir_fd)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(
                f"Could not list the capture directory '{self.root}' ({_describe(exc)}); check that it is readable."
            ) from exc
        found: set[str] = set()
        for name in names:
            for suffix in (DATA_SUFFIX, MARKER_SUFFIX):
                rollout_id = rollout_id_from_file_stem(name[: -len(suffix)]) if name.endswith(suffix) else None
                if rollout_id is not None:
                    found.add(rollout_id)
        return sorted(found)

    def size_of(self, rollout_id: str) -> int:
        """Return the size in bytes of a rollout's capture file (0 when it has none)."""
        name = rollout_file_stem(validate_rollout_id(rollout_id)) + DATA_SUFFIX
        if self._dir_fd < 0:
            return 0
        try:
            found = os.stat(name, dir_fd=self._dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise StoreError(
                f"Could not stat '{self.path_for(rollout_id)}' ({_describe(exc)}); check its permissions."
            ) from exc
        return found.st_size if stat.S_ISREG(found.st_mode) else 0

    def read(self, rollout_id: str, *, strict: bool = False) -> ReadResult:
        """Read a rollout's capture without locking; damaged lines are skipped and counted.

        With `strict=True`, the first damaged line raises CaptureRecordError with its 1-based
        line number instead. Neither mode treats a torn tail as damage: it may be a write in
        progress.
        """
        rollout_id = validate_rollout_id(rollout_id)
        path = self.root / f"{rollout_file_stem(rollout_id)}{DATA_SUFFIX}"
        data = self._read_bytes(rollout_file_stem(rollout_id) + DATA_SUFFIX)
        entries: list[tuple[int, dict[str, Any]]] = []
        invalid_lines: list[int] = []
        for line_number, call_index, record, problem in _scan_lines(data or b""):
            if record is not None:
                entries.append((call_index, record))
            elif strict:
                raise CaptureRecordError(path, line_number, problem)
            else:
                invalid_lines.append(call_index)
        late = self._read_bytes(rollout_file_stem(rollout_id) + LATE_SUFFIX)
        marker = rollout_file_stem(rollout_id) + MARKER_SUFFIX
        marked = self._dir_fd >= 0 and os.access(marker, os.F_OK, dir_fd=self._dir_fd, follow_symlinks=False)
        return ReadResult(
            rollout_id=rollout_id,
            exists=data is not None,
            entries=entries,
            invalid_lines=invalid_lines,
            torn_tail=data is not None and data[-1:] not in (b"", b"\n"),
            incomplete=marked,
            late_writes=sum(1 for _ in _scan_lines(late or b"")),
            capture_failures=self._marker_failures(marker) if marked else 0,
        )

    def _read_bytes(self, name: str) -> bytes | None:
        """A file's bytes, None when it does not exist; StoreError (caused by UnsafeCaptureFileError)
        for a link, FIFO or other non-regular file, which is never followed or read."""
        if self._dir_fd < 0:
            return None
        try:
            fd = open_regular(name, os.O_RDONLY, dir_fd=self._dir_fd)
        except FileNotFoundError:
            return None
        except UnsafeCaptureFileError as exc:  # a StoreError like any unreadable file; the cause says why
            raise StoreError(
                f"Could not read '{self._sibling('', name)}': {exc.found} stands there, not a regular file; "
                "it was not opened. Remove it and check who else writes to the capture directory."
            ) from exc
        except OSError as exc:
            raise StoreError(f"Could not read '{self._sibling('', name)}' ({_describe(exc)}); check its permissions.") from exc
        try:
            with open(fd, "rb", closefd=False) as handle:
                return handle.read()
        except OSError as exc:
            raise StoreError(f"Could not read '{self._sibling('', name)}' ({_describe(exc)}); check its permissions.") from exc
        finally:
            os.close(fd)

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
