"""The per-directory index behind the home table: file states from one directory listing,
summaries parsed once and then extended from appended lines only.

A page view never parses every line of every file, nor even `stat`s every file: `refresh` lists
the capture directory's names and types, and each row a page shows costs one `lstat` (size,
mtime, inode) and, when the file changed, a read of its appended lines. Summaries (calls,
errors, tokens, times) are parsed on demand for the rows a page shows and by a background
thread for the rest, which also `lstat`s every file on each live poll to find what grew. Sorting or filtering by a summarised column covers
the rollouts summarised so far, and the page says how many that is.
"""

from __future__ import annotations

import bisect
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from .files import FileState, file_state
from .lines import read_calls
from .summary import RolloutSummary

__all__ = ["DATA_SUFFIX", "MARKER_SUFFIX", "CaptureIndex", "natural_key"]

DATA_SUFFIX = ".capture.jsonl"  # the spec's file name, `<rollout_id>.capture.jsonl`
MARKER_SUFFIX = ".capture.incomplete"
_DIGITS = re.compile(r"(\d+)")
# The file stems that are their own rollout id (`llmtap.correlation.ids.rollout_id_from_file_stem`:
# every valid id but one with a leading dot, stored escaped), as one pattern for `filter` (no Python
# call per name).
_VALID_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,211}", re.ASCII)
_TASK_ROLLOUT = re.compile(r"(\d+)-(\d+)(\D.*)?", re.ASCII | re.DOTALL)


def natural_key(rollout_id: str) -> str:
    """Sort key that puts `2-0` before `10-0`: each digit run is prefixed with its length, so runs
    compare as numbers while the key stays one string (cheap to compare, for 100,000 ids)."""
    match = _TASK_ROLLOUT.fullmatch(rollout_id)
    if match is not None:  # the collector's `<task>-<rollout>[-a<n>]`: the same key, without a callback per run
        task, rollout, rest = match.groups()
        key = f"{len(task):03d}{task}-{len(rollout):03d}{rollout}"
        return key + _DIGITS.sub(_length_prefixed, rest) if rest else key
    return _DIGITS.sub(_length_prefixed, rollout_id)


def _length_prefixed(match: re.Match[str]) -> str:
    digits = match.group()
    return f"{len(digits):03d}{digits}"


@dataclass(slots=True)
class FileEntry:
    """One rollout as the directory listing shows it."""

    state: FileState | None  # None: not looked at yet, only an incomplete marker, or not a regular file
    incomplete: bool
    refused: bool  # a link or other non-regular file where a capture file should be


class CaptureIndex:
    """File states and summaries of one capture directory, safe to use from several threads."""

    def __init__(self, root: str) -> None:
        self.root = root
        # Every listed rollout; None until something looked at its file (see `entry`), so a listing
        # of 100,000 names does not build 100,000 objects.
        self.files: dict[str, FileEntry | None] = {}
        self.order: list[str] = []  # ids in natural order
        self.rank: dict[str, int] = {}  # id -> position in `order`, the tie-break of every sort
        self.summaries: dict[str, RolloutSummary] = {}
        self.version = 0  # bumped whenever a file or summary changes
        self.scan_seconds = 0.0  # how long the last listing took
        self.look_seconds = 0.0  # how long the last listing with an lstat per file took
        self.scanned_at = 0.0
        self.looked_at = 0.0
        self.error: str | None = None
        self._lock = threading.RLock()
        self._cursor = 0  # where summarise_some goes on in `order`
        # Orders computed by `query.run_query`, with the version they were computed at.
        self.query_cache: dict[tuple[Any, ...], tuple[int, tuple[list[str], int, int]]] = {}
        self._listed: set[str] = set()  # every stem the last listing showed, valid or not
        self._markers: set[str] = set()

    def entry(self, rollout_id: str) -> FileEntry | None:
        """The listing's entry for a rollout (made on first use); None when it is not listed."""
        if rollout_id not in self.files:
            return None
        found = self.files[rollout_id]
        if found is None:
            found = self.files[rollout_id] = FileEntry(None, False, False)
        return found

    def path_for(self, rollout_id: str) -> str:
        """The capture file of a rollout id already checked against the id pattern."""
        return os.path.join(self.root, rollout_id + DATA_SUFFIX)

    def refresh(self, *, max_age: float = 0.0, look_inside: bool = False) -> None:
        """List the directory's names again (unless listed less than `max_age` seconds ago).

        A listing reads names only (no `stat` per file): what a page view pays.
        `look_inside=True` also `lstat`s every capture file and extends the summaries of the
        files that grew, by reading their appended lines: what the live poll pays, in the
        background.
        """
        now = time.monotonic()
        if max_age and now - (self.looked_at if look_inside else self.scanned_at) < max_age:
            return
        started = time.perf_counter()
        try:
            names = os.listdir(self.root)
            error = None
        except OSError as exc:
            names = []
            error = f"Could not list '{self.root}' ({exc.strerror}); check that it exists and is readable."
        # Set operations in C over the names: on 100,000 rollouts a per-name Python loop costs more than the listing.
        data = {name[: -len(DATA_SUFFIX)] for name in names if name.endswith(DATA_SUFFIX)}
        markers = {name[: -len(MARKER_SUFFIX)] for name in names if name.endswith(MARKER_SUFFIX)}
        with self._lock:
            self.error = error
            self._apply_listing(data, markers)
        self.scan_seconds = time.perf_counter() - started
        self.scanned_at = time.monotonic()
        if look_inside:
            self._look_inside()
            self.look_seconds = time.perf_counter() - started
            self.looked_at = time.monotonic()

    def _look_inside(self) -> None:
        """`lstat` every listed capture file; extend the summaries of those that changed."""
        changed = []
        for rollout_id in list(self.files):
            entry = self.entry(rollout_id)
            if entry is None or entry.refused:
                continue
            path = self.path_for(rollout_id)
            state = file_state(path)
            if state is None and os.path.lexists(path):
                entry.refused = True
            if state != entry.state:
                with self._lock:
                    entry.state = state
                    self._bump(rollout_id)
                changed.append(rollout_id)
        for rollout_id in changed:
            if rollout_id in self.summaries:
                self.summary(rollout_id)

    def _apply_listing(self, data: set[str], markers: set[str]) -> None:
        """Add the rollouts that appeared, drop those that went, note marker changes (lock held)."""
        listed = data | markers
        added = set(filter(_VALID_ID.fullmatch, listed - self._listed))  # the id check, run in C per name
        removed = (self._listed - listed) & self.files.keys()
        self.files.update(dict.fromkeys(added))
        if added:
            self.version += 1
        for rollout_id in removed:
            del self.files[rollout_id]
            self.summaries.pop(rollout_id, None)
            self._bump(rollout_id)
        for rollout_id in (markers ^ self._markers) & self.files.keys():
            self.entry(rollout_id).incomplete = rollout_id in markers  # type: ignore[union-attr]
            self._bump(rollout_id)
        if removed or len(added) > 1000:
            self.order = sorted(self.files, key=natural_key)
        else:
            for rollout_id in added:
                bisect.insort(self.order, rollout_id, key=natural_key)
        if added or removed:
            self.rank = {rollout_id: position for position, rollout_id in enumerate(self.order)}
        self._listed, self._markers = listed, markers

    def _bump(self, rollout_id: str) -> None:
        """Note that something about `rollout_id` changed: live pages compare versions."""
        self.version += 1

    def summary(self, rollout_id: str) -> RolloutSummary | None:
        """The rollout's summary after one `lstat` of its file, extended by reading only what was
        appended since; None when the directory listing has no such rollout."""
        with self._lock:
            entry = self.entry(rollout_id)
            if entry is None:
                return None
        path = self.path_for(rollout_id)
        state = None if entry.refused else file_state(path)
        if state is None and not entry.refused and os.path.lexists(path):
            entry.refused = True  # a link, FIFO or directory where the capture file should be: never read
        with self._lock:
            if state != entry.state:
                entry.state = state
                self._bump(rollout_id)
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
        summary.state = entry.state if entry.state == batch.state else batch.state  # one object when they agree
        return summary

    def summary_now(self, rollout_id: str) -> RolloutSummary | None:
        """The rollout's summary, looking at its file alone (no directory listing), so a file
        created since the last listing is found too: what a live rollout page polls."""
        with self._lock:
            if rollout_id not in self.files:
                if file_state(self.path_for(rollout_id)) is None:
                    return None
                self._apply_listing(self._listed | {rollout_id}, self._markers)
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
