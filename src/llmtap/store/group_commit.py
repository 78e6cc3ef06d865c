"""Group commit: lines made durable in batches, off the appender's event loop.

Two paths share the store's helper threads (`CommitThreads`):

- `GroupCommitter`, per-rollout queues: the first appender to a rollout with no commit in flight
  becomes its committer and commits batches until its own line is settled, then hands whatever
  is left to a helper thread. What a batch's commit does (which files, which lock) is the store's
  business: the committer only calls the `commit` it was built with, which must settle every
  entry it is given.
- `BatchedSyncs`, for lines an event loop has already written: whatever is queued when a helper
  thread gets to it is synced as one batch and settled with one wake-up per loop, so under load
  one thread hop serves many calls instead of one each.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Generic, TypeAlias, TypeVar

from llmtap.errors import StoreError

if TYPE_CHECKING:
    from llmtap.store.results import AppendResult

__all__ = ["BatchedSyncs", "CommitThreads", "GroupCommitter", "PendingAppend", "settle"]

logger = logging.getLogger("llmtap.store")  # these are the store's commits, logged under its name

_BATCH_MAX_RECORDS = 1024
_BATCH_MAX_BYTES = 8 * 1024 * 1024  # a single larger record still goes out, alone
_IDLE_THREAD_SECONDS = 5.0

Outcome: TypeAlias = "AppendResult | StoreError"
JobT = TypeVar("JobT")


class PendingAppend:
    """One queued line and how its appender hears the outcome: a thread gate, or a loop's future."""

    __slots__ = ("line", "started_at", "outcome", "gate", "future")

    def __init__(self, line: bytes, started_at: float | None, future: asyncio.Future[AppendResult] | None) -> None:
        self.line = line
        self.started_at = started_at
        self.outcome: Outcome | None = None
        self.future = future
        self.gate: threading.Lock | None = None
        if future is None:
            self.gate = threading.Lock()
            self.gate.acquire()

    def wait(self) -> AppendResult:
        """Block until the line is settled; return where it landed or raise its StoreError."""
        assert self.gate is not None
        self.gate.acquire()
        if isinstance(self.outcome, StoreError):
            raise self.outcome
        assert self.outcome is not None
        return self.outcome


def settle(entries: Sequence[PendingAppend], outcomes: Sequence[Outcome]) -> None:
    """Wake every appender: threads one by one, and each event loop once for all its futures
    (directly when called on that loop's own thread)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[PendingAppend]] = {}
    last_loop: asyncio.AbstractEventLoop | None = None
    same_loop: list[PendingAppend] = []
    for entry, outcome in zip(entries, outcomes):
        entry.outcome = outcome
        if entry.future is not None:
            if entry.future.get_loop() is not last_loop:  # nearly always one loop: one list lookup
                last_loop = entry.future.get_loop()
                same_loop = by_loop.setdefault(last_loop, [])
            same_loop.append(entry)
        elif entry.gate is not None:
            entry.gate.release()
    if not by_loop:
        return
    try:
        current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        current = None
    for loop, settled in by_loop.items():
        if loop is current:
            _settle_futures(settled)
            continue
        try:
            loop.call_soon_threadsafe(_settle_futures, settled)
        except RuntimeError:  # the loop is closed: nobody awaits any more; the lines are durable
            pass


def _settle_futures(settled: list[PendingAppend]) -> None:
    for entry in settled:
        future, outcome = entry.future, entry.outcome
        assert future is not None and outcome is not None  # settle() set it
        if future.done():  # the awaiting task was cancelled; its record was still written
            continue
        if isinstance(outcome, StoreError):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


class _RolloutQueue:
    """Lines waiting for one rollout's committer; guarded by the committer's mutex."""

    __slots__ = ("rollout_id", "pending", "committing")

    def __init__(self, rollout_id: str) -> None:
        self.rollout_id = rollout_id
        self.pending: deque[PendingAppend] = deque()
        self.committing = False


class CommitThreads:
    """Store-owned threads that grow on demand and retire when idle.

    A job never waits for a free thread, so one rollout stuck in a slow fsync cannot hold up
    another rollout's commits, whatever the size of the event loop's default executor.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._jobs: deque[Callable[[], None]] = deque()
        self._idle = 0
        self._threads: set[threading.Thread] = set()
        self._closed = False

    def submit(self, job: Callable[[], None]) -> None:
        with self._cond:
            self._jobs.append(job)
            if self._idle >= len(self._jobs):
                self._cond.notify()
                return
            thread = threading.Thread(target=self._work, name="llmtap-store-commit", daemon=True)
            self._threads.add(thread)
            thread.start()

    def _work(self) -> None:
        while True:
            with self._cond:
                self._idle += 1
                while not self._jobs and not self._closed:
                    if not self._cond.wait(_IDLE_THREAD_SECONDS):
                        break
                self._idle -= 1
                if not self._jobs:
                    self._threads.discard(threading.current_thread())
                    return
                job = self._jobs.popleft()
            try:
                job()
            except Exception:  # commit jobs settle their own entries; this only guards against bugs
                logger.exception("A capture store commit job failed unexpectedly.")

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join()


class GroupCommitter:
    """Queues lines per rollout and has each queue committed by one thread at a time.

    `commit(rollout_id, batch)` writes a batch and settles every entry in it, whatever happens;
    an exception that escapes it (only a BaseException should) reaches the committing appender.
    A forked child needs a new committer: the parent's threads are not there.
    """

    def __init__(self, commit: Callable[[str, list[PendingAppend]], None], threads: CommitThreads) -> None:
        self._commit = commit
        self._mutex = threading.Lock()
        self._idle = threading.Condition(self._mutex)
        self._queues: dict[str, _RolloutQueue] = {}
        self._threads = threads
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def enqueue(self, rollout_id: str, entry: PendingAppend) -> bool:
        """Queue `entry` and see that it gets committed; False, with nothing queued, once closed.

        With no commit in flight for the rollout, a blocking entry (no future) is committed on
        the calling thread before this returns; an awaited one is handed to a helper thread so
        the event loop never blocks. Either way the appender then waits on the entry itself.
        """
        with self._mutex:
            if self._closed:
                return False
            queue = self._queues.get(rollout_id)
            if queue is None:
                queue = self._queues[rollout_id] = _RolloutQueue(rollout_id)
            queue.pending.append(entry)
            lead = not queue.committing
            queue.committing = True
        if lead:
            if entry.future is None:
                self._lead(queue, entry)
            else:
                self._threads.submit(functools.partial(self._lead, queue, None))
        return True

    def _lead(self, queue: _RolloutQueue, own: PendingAppend | None) -> None:
        """Commit batches until `own` is durable, then leave the rest to a helper thread.

        A helper thread passes None and commits until the queue is empty; an appender never
        keeps committing for others once its own line is durable.
        """
        try:
            while own is None or own.outcome is None:
                with self._mutex:
                    batch = self._take_batch(queue)
                    if not batch:
                        self._step_down(queue)
                        return
                self._commit(queue.rollout_id, batch)
        except BaseException:
            self._hand_off(queue)
            raise
        self._hand_off(queue)

    def _take_batch(self, queue: _RolloutQueue) -> list[PendingAppend]:
        batch: list[PendingAppend] = []
        size = 0
        while queue.pending and len(batch) < _BATCH_MAX_RECORDS:
            if batch and size + len(queue.pending[0].line) > _BATCH_MAX_BYTES:
                break
            entry = queue.pending.popleft()
            size += len(entry.line)
            batch.append(entry)
        return batch

    def _hand_off(self, queue: _RolloutQueue) -> None:
        with self._mutex:
            if not queue.pending:
                self._step_down(queue)
                return
        self._threads.submit(functools.partial(self._lead, queue, None))

    def _step_down(self, queue: _RolloutQueue) -> None:
        """Mark `queue` idle and forget it (the caller holds the mutex)."""
        queue.committing = False
        if self._queues.get(queue.rollout_id) is queue:
            del self._queues[queue.rollout_id]
        self._idle.notify_all()

    def close(self) -> None:
        """Refuse new entries and wait for in-flight commits (the store stops the threads)."""
        with self._mutex:
            self._closed = True
            while any(queue.committing for queue in self._queues.values()):
                self._idle.wait()


class BatchedSyncs(Generic[JobT]):
    """Jobs queued from event loops, handed in batches to `sync_batch` on the store's threads.

    A batch is everything queued when a drain takes it, and a drain keeps taking batches until
    the queue is empty, so under load one thread wake-up serves many calls. Up to `max_drains`
    drain at once, so one slow fsync does not hold up every later batch. `sync_batch` must
    settle every entry of every job it is given.
    """

    def __init__(self, sync_batch: Callable[[list[JobT]], None], threads: CommitThreads, max_drains: int = 4) -> None:
        self._sync_batch = sync_batch
        self._threads = threads
        self._max_drains = max_drains
        self._cond = threading.Condition(threading.Lock())
        self._queued: list[JobT] = []
        self._drains = 0  # drain jobs submitted and not yet returned
        self._syncing = 0  # of those, the ones inside `sync_batch`
        self._in_flight = 0
        self._closed = False

    def submit(self, job: JobT) -> bool:
        """Queue `job`; False, with nothing queued, once closed."""
        with self._cond:
            if self._closed:
                return False
            self._queued.append(job)
            self._in_flight += 1
            if self._drains > self._syncing or self._drains >= self._max_drains:
                return True  # a drain about to take a batch, or the next one free, takes it
            self._drains += 1
        self._threads.submit(self._drain)
        return True

    def _drain(self) -> None:
        while True:
            with self._cond:
                batch, self._queued = self._queued, []
                if not batch:
                    self._drains -= 1
                    return
                self._syncing += 1
            try:
                self._sync_batch(batch)
            finally:
                with self._cond:
                    self._syncing -= 1
                    self._in_flight -= len(batch)
                    if not self._in_flight:
                        self._cond.notify_all()

    def close(self) -> None:
        """Refuse new jobs and wait until every queued one is synced."""
        with self._cond:
            self._closed = True
            while self._in_flight:
                self._cond.wait()
