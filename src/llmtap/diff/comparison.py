"""Comparing two runs: rollouts paired by key, calls aligned inside each, each classified, the run summed.

A call is `unchanged` when everything compared is equal (request projection, answer, tool calls,
finish reason, status and error, tokens in/out/reasoning), `changed` when it pairs with a call
that differs, `added` or `removed` when the alignment pairs it with nothing. Latency, TTFT and
cached tokens never make a call changed (they vary run to run) but are reported, per call and as
run percentiles. Rollouts are loaded one pair at a time; only rollouts that are not unchanged are
kept in the result, so memory stays flat however many identical rollouts the runs hold.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from .alignment import align
from .calls import CallView, call_view, compare_calls, describe_call
from .sources import DiffInputError, RolloutSide, Source

__all__ = [
    "AlignedRollout",
    "CallStatus",
    "RolloutComparison",
    "RunComparison",
    "SideTotals",
    "align_rollout",
    "compare_runs",
    "percentile",
]

CallStatus = Literal["unchanged", "changed", "added", "removed"]
STATUSES: tuple[CallStatus, ...] = ("unchanged", "changed", "added", "removed")


def percentile(values: array[float] | list[float], fraction: float) -> float | None:
    """Return the nearest-rank percentile of the values (None when there are none)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(round(fraction * len(ordered), 9)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass
class SideTotals:
    """One run's totals; a token total counts known values only, `tokens_unknown` the calls that did not report."""

    rollouts: int = 0
    calls: int = 0
    errors: int = 0
    tokens: dict[str, int] = field(default_factory=lambda: {"in": 0, "out": 0, "reasoning": 0, "cached": 0})
    tokens_unknown: dict[str, int] = field(default_factory=lambda: {"in": 0, "out": 0, "reasoning": 0, "cached": 0})
    latencies: array[float] = field(default_factory=lambda: array("d"))
    ttfts: array[float] = field(default_factory=lambda: array("d"))
    reward_sum: float = 0.0
    rewards: int = 0
    unreadable_lines: int = 0
    incomplete_rollouts: int = 0

    def add(self, side: RolloutSide) -> None:
        self.rollouts += 1
        self.unreadable_lines += side.unreadable_lines
        self.incomplete_rollouts += side.incomplete
        if side.reward is not None:
            self.reward_sum += side.reward
            self.rewards += 1
        for record in side.records:
            self.calls += 1
            self.errors += record.error_category is not None
            for name, attribute in (
                ("in", "tokens_in"),
                ("out", "tokens_out"),
                ("reasoning", "tokens_reasoning"),
                ("cached", "cached_tokens"),
            ):
                value = getattr(record, attribute)
                if value is None:
                    self.tokens_unknown[name] += 1
                else:
                    self.tokens[name] += value
            if record.latency_total_ms is not None:
                self.latencies.append(record.latency_total_ms)
            if record.latency_ttft_ms is not None:
                self.ttfts.append(record.latency_ttft_ms)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rollouts": self.rollouts,
            "calls": self.calls,
            "errors": self.errors,
            "tokens": dict(self.tokens),
            "tokens_unknown": dict(self.tokens_unknown),
            "latency_ms": {"p50": percentile(self.latencies, 0.5), "p95": percentile(self.latencies, 0.95)},
            "ttft_ms": {"p50": percentile(self.ttfts, 0.5), "p95": percentile(self.ttfts, 0.95)},
            "reward_mean": self.reward_sum / self.rewards if self.rewards else None,
            "unreadable_lines": self.unreadable_lines,
            "incomplete_rollouts": self.incomplete_rollouts,
        }


@dataclass
class RolloutComparison:
    """One rollout in both runs: its status, its calls' statuses and the details of those that are not unchanged."""

    key: str
    status: CallStatus
    rollout_a: str | None
    rollout_b: str | None
    counts: dict[str, int]
    calls: list[dict[str, Any]]
    call_count: dict[str, int | None]
    reward: dict[str, float | None]
    tool_sequence: dict[str, list[str]] | None
    file_a: str | None = None
    file_b: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "status": self.status,
            "rollout_a": self.rollout_a,
            "rollout_b": self.rollout_b,
            "counts": self.counts,
            "call_count": self.call_count,
            "reward": self.reward,
            "tool_sequence": self.tool_sequence,
            "file_a": self.file_a,
            "file_b": self.file_b,
            "calls": self.calls,
        }

    @property
    def reward_dropped(self) -> bool:
        before, after = self.reward["before"], self.reward["after"]
        return before is not None and after is not None and after < before


@dataclass
class RunComparison:
    """Two runs compared: what each side was, the rollouts that differ, counts and totals."""

    a: dict[str, Any]
    b: dict[str, Any]
    payloads: bool
    rollouts: list[RolloutComparison]
    rollout_counts: dict[str, int]
    call_counts: dict[str, int]
    totals_a: SideTotals
    totals_b: SideTotals
    notes: list[str]


def _views(side: RolloutSide | None, payloads: bool) -> list[CallView]:
    if side is None:
        return []
    lines = side.lines or [None] * len(side.records)  # type: ignore[list-item]
    return [call_view(record, payloads=payloads, line=line) for record, line in zip(side.records, lines)]


def _tools(views: list[CallView]) -> list[str]:
    return [name for view in views for name in view.tool_names]


@dataclass
class AlignedRollout:
    """A rollout compared with its alignment kept: every pair in order and the calls the indexes name.

    `comparison.calls` holds one detail per pair that is not unchanged, in the order of `pairs`.
    """

    comparison: RolloutComparison
    views_a: list[CallView]
    views_b: list[CallView]
    pairs: list[tuple[int | None, int | None]]


def compare_rollout(key: str, a: RolloutSide | None, b: RolloutSide | None, *, payloads: bool) -> RolloutComparison:
    """Align and compare one rollout's calls in the two runs (either side may be missing)."""
    return align_rollout(key, a, b, payloads=payloads).comparison


def align_rollout(key: str, a: RolloutSide | None, b: RolloutSide | None, *, payloads: bool) -> AlignedRollout:
    """Compare one rollout as `compare_rollout` does, keeping every pair (unchanged ones too) for a side-by-side view."""
    views_a, views_b = _views(a, payloads), _views(b, payloads)
    if [view.exact for view in views_a] == [view.exact for view in views_b]:
        pairs: list[tuple[int | None, int | None]] = [(i, i) for i in range(len(views_a))]
    else:
        pairs = align([view.signature for view in views_a], [view.signature for view in views_b])
    counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
    calls: list[dict[str, Any]] = []
    for i, j in pairs:
        if i is not None and j is not None:
            if views_a[i].exact == views_b[j].exact:
                counts["unchanged"] += 1
                continue
            counts["changed"] += 1
            calls.append({"status": "changed", **compare_calls(views_a[i], views_b[j])})
        elif i is not None:
            counts["removed"] += 1
            calls.append({"status": "removed", **describe_call(views_a[i])})
        else:
            assert j is not None
            counts["added"] += 1
            calls.append({"status": "added", **describe_call(views_b[j])})
    reward = {"before": a.reward if a else None, "after": b.reward if b else None}
    tools_a, tools_b = _tools(views_a), _tools(views_b)
    status: CallStatus
    if a is None:
        status = "added"
    elif b is None:
        status = "removed"
    elif calls or reward["before"] != reward["after"]:
        status = "changed"
    else:
        status = "unchanged"
    comparison = RolloutComparison(
        key=key,
        status=status,
        rollout_a=a.rollout_id if a else None,
        rollout_b=b.rollout_id if b else None,
        counts=counts,
        calls=calls,
        call_count={"before": len(views_a) if a else None, "after": len(views_b) if b else None},
        reward=reward,
        tool_sequence={"before": tools_a, "after": tools_b} if tools_a != tools_b else None,
        file_a=a.file if a else None,
        file_b=b.file if b else None,
    )
    return AlignedRollout(comparison, views_a, views_b, pairs)


def _paired_keys(a: Source, b: Source) -> Iterator[tuple[str, bool, bool]]:
    keys_a, keys_b = set(a.keys()), set(b.keys())
    for key in sorted(keys_a | keys_b):
        yield key, key in keys_a, key in keys_b


def check_comparable(a: Source, b: Source) -> list[str]:
    """Raise `DiffInputError` when two runs cannot be compared; return notes on what limits the comparison."""
    keys_a, keys_b = set(a.keys()), set(b.keys())
    if not keys_a and not keys_b:
        raise DiffInputError(f"Neither '{a.path}' nor '{b.path}' holds a rollout; pass runs that captured calls.")
    if keys_a and keys_b and not keys_a & keys_b:
        raise DiffInputError(
            f"The runs share no rollout id ('{a.path}' has {len(keys_a)}, '{b.path}' {len(keys_b)}); "
            "compare runs of the same rollouts, or align collect/attach rows with --key."
        )
    notes = []
    if not (a.has_payloads and b.has_payloads):
        notes.append("request and response payloads are absent on one side: calls compare on normalized fields only")
    return notes


def compare_runs(a: Source, b: Source) -> RunComparison:
    """Compare two runs rollout by rollout; raises `DiffInputError` when they are not comparable."""
    notes = check_comparable(a, b)
    payloads = a.has_payloads and b.has_payloads
    totals_a, totals_b = SideTotals(), SideTotals()
    rollout_counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
    call_counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
    kept: list[RolloutComparison] = []
    for key, in_a, in_b in _paired_keys(a, b):
        side_a = a.load(key) if in_a else None
        side_b = b.load(key) if in_b else None
        if side_a is not None:
            totals_a.add(side_a)
        if side_b is not None:
            totals_b.add(side_b)
        result = compare_rollout(key, side_a, side_b, payloads=payloads)
        rollout_counts[result.status] += 1
        for status, count in result.counts.items():
            call_counts[status] += count
        if result.status != "unchanged":
            kept.append(result)
    return RunComparison(
        a=a.describe(),
        b=b.describe(),
        payloads=payloads,
        rollouts=kept,
        rollout_counts=rollout_counts,
        call_counts=call_counts,
        totals_a=totals_a,
        totals_b=totals_b,
        notes=notes,
    )
