"""A rollout's one-row summary for the home table, kept up to date from appended lines only."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable
from typing import Any

from ..records import ModelCallRecord
from .files import FileState
from .lines import CallLine

__all__ = ["OUTCOMES", "RolloutSummary", "call_outcome"]

# The timeline's colours, and the home table's status filter, in this order.
OUTCOMES = ("ok", "error", "truncated", "cancelled")


def call_outcome(record: ModelCallRecord | dict[str, Any]) -> str:
    """`ok`, `error`, `truncated` (a stream cut short, or output stopped by a length limit) or `cancelled`."""
    get = record.get if isinstance(record, dict) else lambda name: getattr(record, name, None)
    category = get("error_category")
    if category == "cancelled":
        return "cancelled"
    if category == "stream_truncated" or get("stream_truncated"):
        return "truncated"
    if category is not None:
        return "error"
    if get("finish_reason_normalized") == "length":
        return "truncated"
    return "ok"


class RolloutSummary:
    """Counts, tokens and times of one rollout's calls; `update` folds in lines read later.

    Token sums stay None until some call reports a value (null means unknown, never zero).
    `offset` and `next_index` say where the next read of the file starts.
    """

    __slots__ = (
        "cached_tokens",
        "calls",
        "errors",
        "first_start",
        "last_end",
        "models",
        "next_index",
        "offset",
        "outcomes",
        "rollout_id",
        "state",
        "tokens_in",
        "tokens_out",
        "tokens_reasoning",
        "torn_tail",
        "ttfts",
        "unreadable",
    )  # fmt: skip

    def __init__(self, rollout_id: str) -> None:
        self.rollout_id = rollout_id
        self.state: FileState | None = None
        self.offset = 0
        self.next_index = 0
        self.calls = 0
        self.unreadable = 0
        self.errors: dict[str, int] = {}
        self.outcomes: dict[str, int] = {}
        self.tokens_in: int | None = None
        self.tokens_out: int | None = None
        self.tokens_reasoning: int | None = None
        self.cached_tokens: int | None = None
        self.first_start: float | None = None
        self.last_end: float | None = None
        self.ttfts = array("d")  # unboxed: 100,000 rollouts' values would otherwise be a million float objects
        self.models: list[str] = []
        self.torn_tail = False

    def update(self, lines: Iterable[CallLine]) -> None:
        """Fold in lines read after the ones already counted."""
        for line in lines:
            record = line.record
            if record is None:
                self.unreadable += 1
                continue
            self.calls += 1
            outcome = call_outcome(record)
            if outcome != "ok":  # only the exceptions are shown, and most calls are ok
                self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            if record.error_category is not None:
                category = sys.intern(record.error_category)  # one string per category, not per call
                self.errors[category] = self.errors.get(category, 0) + 1
            self.tokens_in = _add(self.tokens_in, record.tokens_in)
            self.tokens_out = _add(self.tokens_out, record.tokens_out)
            self.tokens_reasoning = _add(self.tokens_reasoning, record.tokens_reasoning)
            self.cached_tokens = _add(self.cached_tokens, record.cached_tokens)
            if record.started_at is not None:
                self.first_start = (
                    record.started_at if self.first_start is None else min(self.first_start, record.started_at)
                )
            if record.completed_at is not None:
                self.last_end = (
                    record.completed_at if self.last_end is None else max(self.last_end, record.completed_at)
                )
            if record.latency_ttft_ms is not None:
                self.ttfts.append(record.latency_ttft_ms)
            if record.model and record.model not in self.models and len(self.models) < 8:
                self.models.append(sys.intern(record.model))

    @property
    def num_errors(self) -> int:
        """Calls with an error category."""
        return sum(self.errors.values())

    @property
    def wall_ms(self) -> float | None:
        """First start to last end, in milliseconds; None when either is unknown."""
        if self.first_start is None or self.last_end is None or self.last_end < self.first_start:
            return None
        return round((self.last_end - self.first_start) * 1000.0, 1)

    @property
    def ttft_p50(self) -> float | None:
        """Nearest-rank median time to first token over the calls that reported one."""
        if not self.ttfts:
            return None
        ordered = sorted(self.ttfts)
        return ordered[max(1, -(-len(ordered) // 2)) - 1]

    @property
    def status(self) -> str:
        """`error` when any call failed or a line is damaged, `empty` without calls, else `ok`."""
        if self.num_errors or self.unreadable:
            return "error"
        return "ok" if self.calls else "empty"


def _add(total: int | None, value: int | None) -> int | None:
    if value is None:
        return total
    return value if total is None else total + value
