"""Two runs compared for the viewer: the run summary computed once, each rollout aligned when opened.

Everything comes from `llmtap.diff`: the sides are opened by `open_source`, the run summary is
`compare_runs` (run once in a background thread and cached, with its progress counted), the gate
is `evaluate_gate`, and a rollout's side-by-side rows are `align_rollout`'s pairs (the same
alignment `llmtap diff` prints). This module only cuts them into pages: runs of unchanged calls
collapse into one block, and a rollout of thousands of calls pages by blocks.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..diff.calls import CallView
from ..diff.comparison import AlignedRollout, RunComparison, align_rollout, check_comparable, compare_runs
from ..diff.sources import RolloutSide, Source, open_source
from ..errors import LlmtapError
from .index import natural_key

__all__ = ["BLOCKS_PER_PAGE", "Block", "CompareRuns", "PairRow", "RolloutPage", "check_pair", "rollout_page"]

BLOCKS_PER_PAGE = 100  # changed/added/removed calls, or runs of unchanged ones, on one page of a rollout
UNCHANGED_SHOWN = 10  # a collapsed run of unchanged calls lists this many at each end when opened
_ALIGNED_CACHE = 4  # rollouts kept aligned, so paging through one aligns it once


class _Counted(Source):
    """A source that counts its loads: the summary's progress, without changing `compare_runs`."""

    def __init__(self, inner: Source, counter: list[int]) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.path = inner.path
        self._counter = counter

    def keys(self) -> list[str]:
        return self.inner.keys()

    def load(self, key: str) -> RolloutSide:
        self._counter[0] += 1
        return self.inner.load(key)

    @property
    def has_payloads(self) -> bool:
        return self.inner.has_payloads

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()

    def close(self) -> None:
        self.inner.close()


def check_pair(path_a: str, path_b: str) -> list[str]:
    """Raise `DiffInputError` when two runs cannot be compared (as `llmtap diff` would); return its notes."""
    with open_source(path_a) as a, open_source(path_b) as b:
        return check_comparable(a, b)


class CompareRuns:
    """Two runs (viewer source ids and paths) compared: keys at once, the summary in the background.

    Opening raises `DiffInputError` (an `LlmtapError`) when the runs cannot be compared. The
    sources read by pages are guarded by a lock; the summary thread opens its own.
    """

    def __init__(self, sid_a: str, sid_b: str, path_a: str, path_b: str) -> None:
        self.sid_a, self.sid_b = sid_a, sid_b
        self.path_a, self.path_b = path_a, path_b
        self._lock = threading.Lock()
        self._aligned: OrderedDict[str, AlignedRollout] = OrderedDict()
        self._a = open_source(path_a)
        try:
            self._b = open_source(path_b)
        except LlmtapError:
            self._a.close()
            raise
        try:
            self.notes = check_comparable(self._a, self._b)
        except LlmtapError:
            self.close()
            raise
        self.payloads = self._a.has_payloads and self._b.has_payloads
        keys_a, keys_b = set(self._a.keys()), set(self._b.keys())
        self.keys = sorted(keys_a | keys_b, key=natural_key)
        self.known = frozenset(self.keys)
        self.in_a, self.in_b = keys_a, keys_b
        self.loaded = [0]
        self.to_load = len(keys_a) + len(keys_b)
        self.summary: RunComparison | None = None
        self.differing: dict[str, Any] = {}
        self.totals: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
        self.error: str | None = None
        self.seconds: float | None = None
        self.finished_at: float | None = None
        self._thread: threading.Thread | None = None

    @property
    def done(self) -> bool:
        """True once the summary is computed (or failed)."""
        return self.summary is not None or self.error is not None

    def start(self) -> None:
        """Compute the run summary in a background thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._summarise, name="llmtap-view-compare", daemon=True)
            self._thread.start()

    def _summarise(self) -> None:
        began = time.monotonic()
        try:
            with open_source(self.path_a) as a, open_source(self.path_b) as b:
                summary = compare_runs(_Counted(a, self.loaded), _Counted(b, self.loaded))
        except LlmtapError as exc:
            self.error = str(exc)
            return
        except OSError as exc:
            self.error = f"Reading the runs failed ({exc.strerror or exc}); check the files and reload."
            return
        self.differing = {rollout.key: rollout for rollout in summary.rollouts}
        self.totals = (summary.totals_a.to_dict(), summary.totals_b.to_dict())  # percentiles sort: once
        self.seconds = time.monotonic() - began
        self.finished_at = time.time()
        self.summary = summary

    def status_of(self, key: str) -> str | None:
        """A rollout's status once the summary is known: unchanged, changed, added or removed."""
        if self.summary is None:
            return None
        found = self.differing.get(key)
        return found.status if found is not None else "unchanged"

    def aligned(self, key: str) -> AlignedRollout:
        """The rollout `key` (one of `keys`) aligned, from the cache when it was opened lately."""
        with self._lock:
            cached = self._aligned.get(key)
            if cached is not None:
                self._aligned.move_to_end(key)
                return cached
            side_a = self._a.load(key) if key in self.in_a else None
            side_b = self._b.load(key) if key in self.in_b else None
            result = align_rollout(key, side_a, side_b, payloads=self.payloads)
            self._aligned[key] = result
            while len(self._aligned) > _ALIGNED_CACHE:
                self._aligned.popitem(last=False)
            return result

    def close(self) -> None:
        """Release the page-side sources (the summary thread closes its own)."""
        with self._lock:  # not while a page is reading them
            self._a.close()
            if hasattr(self, "_b"):
                self._b.close()
            self._aligned.clear()


@dataclass
class PairRow:
    """One pair as drawn: the status, each side's call (None where absent) and the diff's detail."""

    status: str
    a: Any | None  # ModelCallRecord
    b: Any | None
    detail: dict[str, Any] | None = None


@dataclass
class Block:
    """A changed, added or removed call, or a run of unchanged calls (collapsed, with `omitted` not listed)."""

    status: str
    rows: list[PairRow]
    count: int
    omitted: int = 0
    a_range: tuple[int, int] | None = None
    b_range: tuple[int, int] | None = None


@dataclass
class RolloutPage:
    """One page of a rollout's side-by-side rows, with the rollout's comparison and the pager."""

    aligned: AlignedRollout
    blocks: list[Block]
    page: int
    pages: int
    total_blocks: int
    first_change_page: dict[str, int] = field(default_factory=dict)


def _spans(aligned: AlignedRollout) -> list[tuple[str, int, int, int]]:
    """(status, first pair, end pair, detail index) of each block, computed from the pairs alone."""
    views_a, views_b = aligned.views_a, aligned.views_b
    spans: list[tuple[str, int, int, int]] = []
    detail = 0
    run_start: int | None = None
    for position, (i, j) in enumerate(aligned.pairs):
        if i is not None and j is not None and views_a[i].exact == views_b[j].exact:
            if run_start is None:
                run_start = position
            continue
        if run_start is not None:
            spans.append(("unchanged", run_start, position, -1))
            run_start = None
        status = "changed" if i is not None and j is not None else "removed" if i is not None else "added"
        spans.append((status, position, position + 1, detail))
        detail += 1
    if run_start is not None:
        spans.append(("unchanged", run_start, len(aligned.pairs), -1))
    return spans


def _record(views: list[CallView], index: int | None) -> Any | None:
    return views[index].record if index is not None else None


def _block(aligned: AlignedRollout, span: tuple[str, int, int, int]) -> Block:
    status, start, end, detail = span
    pairs = aligned.pairs
    if status != "unchanged":
        i, j = pairs[start]
        row = PairRow(
            status, _record(aligned.views_a, i), _record(aligned.views_b, j), aligned.comparison.calls[detail]
        )
        return Block(status, [row], 1)
    count = end - start
    shown = list(range(start, end))
    omitted = 0
    if count > 2 * UNCHANGED_SHOWN:
        shown = [*range(start, start + UNCHANGED_SHOWN), *range(end - UNCHANGED_SHOWN, end)]
        omitted = count - 2 * UNCHANGED_SHOWN
    rows = [
        PairRow("unchanged", _record(aligned.views_a, pairs[p][0]), _record(aligned.views_b, pairs[p][1]))
        for p in shown
    ]
    first, last = pairs[start], pairs[end - 1]
    a_range = (aligned.views_a[first[0]].record.call_index, aligned.views_a[last[0]].record.call_index)  # type: ignore[index]
    b_range = (aligned.views_b[first[1]].record.call_index, aligned.views_b[last[1]].record.call_index)  # type: ignore[index]
    return Block("unchanged", rows, count, omitted, a_range, b_range)


def rollout_page(aligned: AlignedRollout, page: int) -> RolloutPage:
    """Cut one page of blocks; only that page's rows are built."""
    spans = _spans(aligned)
    pages = max(1, -(-len(spans) // BLOCKS_PER_PAGE))
    page = max(1, min(page, pages))
    chosen = spans[(page - 1) * BLOCKS_PER_PAGE : page * BLOCKS_PER_PAGE]
    first_change: dict[str, int] = {}
    for number, span in enumerate(spans):
        if span[0] != "unchanged" and span[0] not in first_change:
            first_change[span[0]] = number // BLOCKS_PER_PAGE + 1
    return RolloutPage(aligned, [_block(aligned, span) for span in chosen], page, pages, len(spans), first_change)
