"""The regression gate: the reasons a comparison fails CI, each one listed.

A run regresses when a call was removed, a call was added (unless allowed; an allowed new call
still may not fail), a call that succeeded now fails, a rollout's reward dropped, or a threshold is passed: total tokens, or the p95 of call
latency, grew by more than the given fraction. A threshold that cannot be checked (no known token
counts, no latencies) is reported as unchecked, never as passed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .comparison import RunComparison, percentile

__all__ = ["GateOptions", "GateReason", "GateResult", "evaluate_gate", "parse_fraction"]

# How many reasons of one kind are listed one by one before the rest are summed up.
MAX_LISTED_PER_CODE = 20


def parse_fraction(text: str) -> float:
    """Parse a threshold such as `10%` or `0.1` into a fraction (0.1); ValueError when it is not one."""
    value = text.strip()
    try:
        number = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise ValueError(
            f"'{text}' is not a threshold; write a percentage such as 10% or a fraction such as 0.1."
        ) from None
    if not number >= 0 or number == float("inf"):
        raise ValueError(f"'{text}' is not a threshold; it must be a finite value of 0 or more.")
    return number


@dataclass(frozen=True)
class GateOptions:
    """What the gate checks: added calls fail unless `allow_added`; thresholds are fractions (0.1 for 10%)."""

    allow_added: bool = False
    max_token_increase: float | None = None
    max_latency_p95_increase: float | None = None


@dataclass(frozen=True)
class GateReason:
    """One reason the gate fails: a code, a sentence, and where: rollout key, call index, file and line.

    The place is in run B, except for a removed call, which only run A has.
    """

    code: str
    message: str
    rollout: str | None = None
    call_index: int | None = None
    file: str | None = None
    line: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "message": self.message,
            "rollout": self.rollout,
            "call_index": self.call_index,
            "file": self.file,
            "line": self.line,
        }


@dataclass
class GateResult:
    """The gate's verdict: `passed` when there is no reason; `unchecked` lists thresholds it could not check."""

    reasons: list[GateReason] = field(default_factory=list)
    unlisted: dict[str, int] = field(default_factory=dict)
    unchecked: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.reasons and not self.unlisted

    def add(self, reason: GateReason) -> None:
        listed = sum(1 for existing in self.reasons if existing.code == reason.code)
        if listed >= MAX_LISTED_PER_CODE:
            self.unlisted[reason.code] = self.unlisted.get(reason.code, 0) + 1
        else:
            self.reasons.append(reason)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "reasons": [reason.to_dict() for reason in self.reasons],
            "unlisted": self.unlisted,
            "unchecked": self.unchecked,
        }


def _increase(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or before <= 0:
        return None
    return (after - before) / before


def _check_calls(comparison: RunComparison, options: GateOptions, result: GateResult) -> None:
    for rollout in comparison.rollouts:
        where = f"rollout '{rollout.key}'"
        for call in rollout.calls:
            status = call["status"]
            if status == "removed":
                result.add(
                    GateReason(
                        "call_removed",
                        f"{where}: call {call['call_index']} of run A has no counterpart in run B.",
                        rollout.key,
                        call["call_index"],
                        rollout.file_a,
                        call["line"],
                    )
                )
            elif status == "added" and options.allow_added and call["error_category"] is not None:
                result.add(
                    GateReason(
                        "added_call_error",
                        f"{where}: call {call['call_index']} of run B is new and failed ({call['error_category']}).",
                        rollout.key,
                        call["call_index"],
                        rollout.file_b,
                        call["line"],
                    )
                )
            elif status == "added" and not options.allow_added:
                result.add(
                    GateReason(
                        "call_added",
                        f"{where}: call {call['call_index']} of run B is new.",
                        rollout.key,
                        call["call_index"],
                        rollout.file_b,
                        call["line"],
                    )
                )
            elif status == "changed" and call["became_error"]:
                error = call["error"] or {}
                result.add(
                    GateReason(
                        "became_error",
                        f"{where}: call {call['b_call_index']} succeeded in run A and failed in run B ({error.get('after')}).",
                        rollout.key,
                        call["b_call_index"],
                        rollout.file_b,
                        call["b_line"],
                    )
                )
        if rollout.reward_dropped:
            result.add(
                GateReason(
                    "reward_dropped",
                    f"{where}: reward dropped from {rollout.reward['before']} to {rollout.reward['after']}.",
                    rollout.key,
                )
            )


def _check_thresholds(comparison: RunComparison, options: GateOptions, result: GateResult) -> None:
    a, b = comparison.totals_a, comparison.totals_b
    if options.max_token_increase is not None:
        before = a.tokens["in"] + a.tokens["out"]
        after = b.tokens["in"] + b.tokens["out"]
        growth = _increase(before, after) if a.calls - a.tokens_unknown["in"] > 0 else None
        if growth is None:
            result.unchecked.append("max-token-increase: run A has no known token counts")
        elif growth > options.max_token_increase:
            result.add(
                GateReason(
                    "token_increase",
                    f"Tokens in+out grew {growth:.1%} ({before} to {after}), above the {options.max_token_increase:.1%} allowed.",
                )
            )
    if options.max_latency_p95_increase is not None:
        p95_a, p95_b = percentile(a.latencies, 0.95), percentile(b.latencies, 0.95)
        growth = _increase(p95_a, p95_b)
        if growth is None:
            result.unchecked.append("max-latency-p95-increase: a run has no call latencies")
        elif growth > options.max_latency_p95_increase:
            result.add(
                GateReason(
                    "latency_p95_increase",
                    f"Call latency p95 grew {growth:.1%} ({p95_a:.1f} ms to {p95_b:.1f} ms), "
                    f"above the {options.max_latency_p95_increase:.1%} allowed.",
                )
            )


def evaluate_gate(comparison: RunComparison, options: GateOptions) -> GateResult:
    """Return every reason the comparison is a regression under `options` (an empty list: it passes)."""
    result = GateResult()
    _check_calls(comparison, options, result)
    _check_thresholds(comparison, options, result)
    return result
