"""The incomplete marker and the clear() fence: what says a rollout lost a record, and which writers are late.

The marker (`<id>.capture.incomplete`) is replaced by rename and counts failed appends, so
`llmtap records status` in another process can report them. clear() unlinks a rollout's files
under its lock and writes a tombstone holding the time: a later append of a call that started
before it goes to the late file, not into the new attempt's calls.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time

import orjson

from llmtap.correlation.ids import rollout_file_stem, validate_rollout_id
from llmtap.errors import StoreError
from llmtap.store.durable import open_regular, replace_file_synced, sync_directory
from llmtap.store.group_commit import PendingAppend
from llmtap.store.layout import (
    DATA_SUFFIX,
    LATE_SUFFIX,
    LOCK_SUFFIX,
    MARKER_SUFFIX,
    TOMBSTONE_SUFFIX,
    StoreLayout,
    _describe,
)
from llmtap.store.rollout_files import DESCRIPTORS

__all__ = ["MarkersAndFence", "split_at_fence"]

logger = logging.getLogger("llmtap.store.capture_store")  # the store's one logger, whichever part logs

_MARKER_READ_LIMIT = 65536  # a marker is a few dozen bytes; a bigger one is not ours


def split_at_fence(
    entries: list[PendingAppend], cleared_at: float | None
) -> tuple[list[PendingAppend], list[PendingAppend]]:
    """(current, late): lines of calls that started before the last clear() are late; lines
    without a start time never are."""
    if cleared_at is None:
        return entries, []
    late = [e for e in entries if e.started_at is not None and e.started_at < cleared_at]
    current = [e for e in entries if e.started_at is None or e.started_at >= cleared_at]
    return current, late


class MarkersAndFence(StoreLayout):
    """CaptureStore's marker and fence: marking a rollout incomplete, reading the fence, clearing."""

    _marker_lock: threading.Lock  # held across a marker's read, rewrite and sync
    _marker_failure_logged: bool

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
