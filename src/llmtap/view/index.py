"""The per-directory index behind the home table: file states from one directory listing,
summaries parsed once and then extended from appended lines only.

A page view never parses every line of every file. `refresh` lists the capture directory and
`lstat`s each capture file (size, mtime, inode): cheap next to parsing, and all the home table
needs to show ids and sort by recency. Summaries (calls, errors, tokens, times) are parsed on
demand for the rows a page shows, and by a background thread for the rest; a file whose size
grew is read from where its summary stopped. Sorting or filtering by a summarised column covers
the rollouts summarised so far, and the page says how many that is.
"""

from __future__ import annotations

import bisect
import os
import re
import threading
import time
from dataclasses import dataclass

from ..store import ROLLOUT_ID_PATTERN
from .files import FileState, file_state
from .lines import read_calls
from .summary import RolloutSummary

__all__ = ["DATA_SUFFIX", "MARKER_SUFFIX", "CaptureIndex", "natural_key"]

DATA_SUFFIX = ".capture.jsonl"  # the spec's file name, `<rollout_id>.capture.jsonl`
MARKER_SUFFIX = ".capture.incomplete"
MAX_ID_LENGTH = 200
_DIGITS = re.compile(r"(\d+)")


def natural_key(rollout_id: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that puts `2-0` before `10-0`: digit runs compare as numbers."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in _DIGITS.split(rollout_id) if part)


@dataclass(slots=True)
class FileEntry:
    """One rollout as the directory listing shows it."""

    state: FileState | None  # None: only an incomplete marker, or not a regular file
    incomplete: bool
    refused: bool  # a link or other non-regular file where a capture file should be


class CaptureIndex:
    """File states and summaries of one capture directory, safe to use from several threads."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.files: dict[str, FileEntry] = {}
        self.order: list[str] = []  # ids in natural order
        self.summaries: dict[str, RolloutSummary] = {}
        self.version = 0  # bumped whenever a file or summary changes
        self.changed: dict[str, int] = {}  # rollout id -> version of its last change
        self.scan_seconds = 0.0
        self.scanned_at = 0.0
        self.error: str | None = None
        self._lock = threading.RLock()
        self._cursor = 0  # where summarise_some goes on in `order`

    def path_for(self, rollout_id: str) -> str:
        """The capture file of a rollout id already checked against the id pattern."""
        return os.path.join(self.root, rollout_id + DATA_SUFFIX)

    def refresh(self, *, max_age: float = 0.0) -> None:
        """List the directory again (unless listed less than `max_age` seconds ago) and extend the
        summaries of files that grew."""
        if max_age and time.monotonic() - self.scanned_at < max_age:
            return
        started = time.perf_counter()
        found: dict[str, FileEntry] = {}
        try:
            with os.scandir(self.root) as entries:
                for entry in entries:
                    self._take(entry, found)
            error = None
        except OSError as exc:
            error = f"Could not list '{self.root}' ({exc.strerror}); check that it exists and is readable."
        with self._lock:
            self.error = error
            added = found.keys() - self.files.keys()
            if added or len(found) != len(self.files):
                self.order = sorted(found, key=natural_key)
            for rollout_id, listed in found.items():
                old = self.files.get(rollout_id)
                if old is None or old.state != listed.state or old.incomplete != listed.incomplete:
                    self._bump(rollout_id)
            for rollout_id in self.files.keys() - found.keys():
                self.summaries.pop(rollout_id, None)
                self._bump(rollout_id)
            self.files = found
        for rollout_id in [rid for rid, summary in list(self.summaries.items()) if self._stale(rid, summary)]:
            self.summary(rollout_id)
        self.scan_seconds = time.perf_counter() - started
        self.scanned_at = time.monotonic()

    def _take(self, entry: os.DirEntry[str], found: dict[str, FileEntry]) -> None:
        name = entry.name
        for suffix in (DATA_SUFFIX, MARKER_SUFFIX):
            if not name.endswith(suffix):
                continue
            stem = name[: -len(suffix)]
            if len(stem) > MAX_ID_LENGTH or ROLLOUT_ID_PATTERN.fullmatch(stem) is None:
                return
            current = found.get(stem) or FileEntry(None, False, False)
            if suffix == MARKER_SUFFIX:
                current.incomplete = True
            else:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    return
                if entry.is_file(follow_symlinks=False):
                    current.state = FileState(info.st_size, info.st_mtime_ns, (info.st_dev, info.st_ino))
                else:
                    current.refused = True
            found[stem] = current
            return

    def _bump(self, rollout_id: str) -> None:
        self.version += 1
        self.changed[rollout_id] = self.version

    def _stale(self, rollout_id: str, summary: RolloutSummary) -> bool:
        entry = self.files.get(rollout_id)
        return entry is not None and entry.state != summary.state

    def summary(self, rollout_id: str) -> RolloutSummary | None:
        """The rollout's summary, brought up to date by reading only what was appended; None when
        the directory listing has no such rollout."""
        with self._lock:
            entry = self.files.get(rollout_id)
            if entry is None:
                return None
            summary = self.summaries.get(rollout_id)
            if summary is not None and summary.state == entry.state:
                return summary
        updated = self._read_summary(rollout_id, summary, entry)
        with self._lock:
            if rollout_id in self.files:
                if summary is None or updated.calls != summary.calls or updated.unreadable != summary.unreadable:
                    self._bump(rollout_id)
                self.summaries[rollout_id] = updated
        return updated

    def _read_summary(self, rollout_id: str, summary: RolloutSummary | None, entry: FileEntry) -> RolloutSummary:
        if entry.state is None:
            return RolloutSummary(rollout_id)
        if (
            summary is None
            or summary.state is None
            or summary.state.inode != entry.state.inode
            or entry.state.size < summary.offset
        ):
            summary = RolloutSummary(rollout_id)  # new, replaced or cleared: start over
        try:
            batch = read_calls(
                self.path_for(rollout_id), offset=summary.offset, first_index=summary.next_index, keep_lines=False
            )
        except FileNotFoundError:
            summary.state = entry.state
            return summary
        except OSError:  # a link or FIFO swapped in since the listing: shown as refused, never read
            entry.refused = True
            summary.state = entry.state
            return summary
        if summary.state is not None and batch.state.inode != summary.state.inode:
            return self._read_summary(rollout_id, None, FileEntry(batch.state, entry.incomplete, entry.refused))
        summary.update(batch.lines)
        summary.offset = batch.next_offset
        summary.next_index = batch.next_index
        summary.torn_tail = batch.torn_tail
        summary.state = batch.state
        return summary

    def summary_now(self, rollout_id: str) -> RolloutSummary | None:
        """The rollout's summary after looking at its file alone (no directory listing): what a live
        rollout page polls."""
        state = file_state(self.path_for(rollout_id))
        with self._lock:
            entry = self.files.get(rollout_id)
            if entry is None:
                if state is None:
                    return None
                entry = self.files[rollout_id] = FileEntry(state, False, False)
                bisect.insort(self.order, rollout_id, key=natural_key)
                self._bump(rollout_id)
            elif entry.state != state:
                entry.state = state
                self._bump(rollout_id)
        return self.summary(rollout_id)

    def summarise_some(self, limit: int) -> int:
        """Summarise up to `limit` rollouts that have none yet; return how many were done."""
        todo: list[str] = []
        with self._lock:
            order = self.order
            while self._cursor < len(order) and len(todo) < limit:
                if order[self._cursor] not in self.summaries:
                    todo.append(order[self._cursor])
                self._cursor += 1
            if self._cursor >= len(order) and len(self.summaries) < len(self.files):
                self._cursor = 0  # the order changed under the cursor: go round once more
        for rollout_id in todo:
            self.summary(rollout_id)
        return len(todo)

    @property
    def summarised(self) -> int:
        """How many of the listed rollouts have a summary."""
        return len(self.summaries)
