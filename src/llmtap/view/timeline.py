"""The rollout timeline's geometry: one bar per call in time order, first-token marks, labelled gaps.

Pure layout, no markup: the template draws the SVG from these numbers, so every label passes
through the template's escaping. Calls without a start time cannot be placed and are counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..records import ModelCallRecord
from .summary import call_outcome

__all__ = ["Bar", "Gap", "Timeline", "layout_timeline"]

WIDTH = 1000.0  # viewBox units of the plot area
LEFT = 48.0  # room for the call labels
ROW = 22.0
BAR = 14.0
_STEPS_MS = (
    1,
    2,
    5,
    10,
    20,
    50,
    100,
    200,
    500,
    1000,
    2000,
    5000,
    10_000,
    15_000,
    30_000,
    60_000,
    120_000,
    300_000,
    600_000,
    1_800_000,
    3_600_000,
)


@dataclass(frozen=True)
class Bar:
    """One call's bar: where it is, its outcome class, and where its first token came."""

    call_index: int
    x: float
    y: float
    width: float
    outcome: str
    ttft_x: float | None
    label: str
    title: str


@dataclass(frozen=True)
class Gap:
    """The time between one call's end and the next call's start, with what the agent did then."""

    x: float
    y: float
    width: float
    label: str


@dataclass
class Timeline:
    """Everything the template needs to draw the SVG."""

    bars: list[Bar] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    ticks: list[tuple[float, str]] = field(default_factory=list)
    height: float = 0.0
    width: float = LEFT + WIDTH + 8
    unplaced: int = 0
    span_ms: float = 0.0


def format_ms(ms: float | None) -> str:
    """`840 ms`, `1.24 s`, `2 m 05 s`; `-` when unknown."""
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.2f} s"
    minutes, seconds = divmod(ms / 1000, 60)
    return f"{minutes:.0f} m {seconds:02.0f} s"


def layout_timeline(records: Sequence[ModelCallRecord], tool_spans: Sequence[dict[str, Any]] = ()) -> Timeline:
    """Place the calls; `tool_spans` are the trajectory's tool calls with `started_at`/`tool_name`.

    A gap is labelled with the tool executions that started inside it when the agent reported
    them, else with the tools the call before it asked for.
    """
    placed = sorted((r for r in records if r.started_at is not None), key=lambda r: (_start(r), r.call_index))
    timeline = Timeline(unplaced=len(records) - len(placed))
    if not placed:
        return timeline
    start = min(_start(r) for r in placed)
    end = max(_end(r) for r in placed)
    span = max(end - start, 1e-3)
    timeline.span_ms = span * 1000.0
    scale = WIDTH / span
    for row, record in enumerate(placed):
        begin = _start(record)
        x = LEFT + (begin - start) * scale
        width = max(2.0, (_end(record) - begin) * scale)
        ttft_x = None
        if record.latency_ttft_ms is not None:
            ttft_x = x + min(width, record.latency_ttft_ms / 1000.0 * scale)
        outcome = call_outcome(record)
        duration = record.latency_total_ms if record.latency_total_ms is not None else (_end(record) - begin) * 1000
        title = f"#{record.call_index} {record.model or ''} · {outcome} · {format_ms(duration)}"
        if record.latency_ttft_ms is not None:
            title += f" · first token {format_ms(record.latency_ttft_ms)}"
        y = 20.0 + row * ROW
        timeline.bars.append(Bar(record.call_index, x, y, width, outcome, ttft_x, f"#{record.call_index}", title))
        if row:
            previous = placed[row - 1]
            gap_start = _end(previous)
            if begin - gap_start > span / 200:
                timeline.gaps.append(
                    Gap(LEFT + (gap_start - start) * scale, y - 3, (begin - gap_start) * scale,
                        _gap_label(previous, gap_start, begin, tool_spans))
                )  # fmt: skip
    timeline.height = 20.0 + len(placed) * ROW + 8
    timeline.ticks = _ticks(span * 1000.0, scale / 1000.0)
    return timeline


def _start(record: ModelCallRecord) -> float:
    return record.started_at if record.started_at is not None else 0.0


def _end(record: ModelCallRecord) -> float:
    if record.completed_at is not None:
        return record.completed_at
    if record.latency_total_ms is not None and record.started_at is not None:
        return record.started_at + record.latency_total_ms / 1000.0
    return record.started_at or 0.0


def _gap_label(previous: ModelCallRecord, begin: float, end: float, tool_spans: Sequence[dict[str, Any]]) -> str:
    names = [
        str(span.get("tool_name") or "tool")
        for span in tool_spans
        if isinstance(span.get("started_at"), (int, float)) and begin - 0.001 <= span["started_at"] <= end + 0.001
    ]
    if not names:
        names = [str(call.get("name") or "tool") for call in previous.tool_calls]
    duration = format_ms((end - begin) * 1000.0)
    if not names:
        return duration
    counted: dict[str, int] = {}
    for name in names:
        counted[name] = counted.get(name, 0) + 1
    tools = ", ".join(name if count == 1 else f"{name} ×{count}" for name, count in counted.items())
    return f"{tools} · {duration}"


def _ticks(span_ms: float, units_per_ms: float) -> list[tuple[float, str]]:
    step = next((s for s in _STEPS_MS if span_ms / s <= 8), _STEPS_MS[-1])
    ticks = []
    value = 0.0
    while value <= span_ms + 1e-9:
        ticks.append((LEFT + value * units_per_ms, format_ms(value) if value else "0"))
        value += step
    return ticks
