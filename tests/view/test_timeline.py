"""The timeline's layout: bars in time order, first-token marks inside them, gaps labelled with what ran."""

from __future__ import annotations

from llmtap import ModelCallRecord
from llmtap.view.timeline import LEFT, WIDTH, format_ms, layout_timeline


def _call(index: int, start: float | None, ms: float, ttft: float | None = None, **extra: object) -> ModelCallRecord:
    end = None if start is None else start + ms / 1000
    return ModelCallRecord(
        model_call_id=f"c{index}", call_index=index, started_at=start, completed_at=end,
        latency_total_ms=ms, latency_ttft_ms=ttft, **extra,  # type: ignore[arg-type]
    )  # fmt: skip


def test_bars_follow_start_times_not_file_order_and_marks_stay_inside() -> None:
    calls = [_call(0, 100.0, 500, 100), _call(1, 99.0, 400, 900), _call(2, None, 10)]
    timeline = layout_timeline(calls)
    assert [bar.call_index for bar in timeline.bars] == [1, 0] and timeline.unplaced == 1
    late, early = timeline.bars[1], timeline.bars[0]
    assert early.x == LEFT and abs(late.x + late.width - (LEFT + WIDTH)) < 1e-6
    assert early.ttft_x == early.x + early.width  # a TTFT past the end is drawn at the end, never outside
    assert late.x < late.ttft_x < late.x + late.width  # type: ignore[operator]


def test_gaps_name_the_tool_runs_the_agent_reported_else_the_tools_asked_for() -> None:
    asked = _call(0, 10.0, 1000, tool_calls=[{"name": "search"}, {"name": "search"}])
    calls = [asked, _call(1, 13.0, 500), _call(2, 14.0, 500)]
    spans = [{"tool_name": "bash", "started_at": 13.6}, {"tool_name": "bash", "started_at": 13.7}]
    timeline = layout_timeline(calls, spans)
    assert [gap.label for gap in timeline.gaps] == ["search ×2 · 2.00 s", "bash ×2 · 500 ms"]
    first = timeline.gaps[0]
    assert (
        first.x == timeline.bars[0].x + timeline.bars[0].width
        and abs(first.x + first.width - timeline.bars[1].x) < 1e-6
    )


def test_times_read_as_people_read_them() -> None:
    assert [format_ms(v) for v in (None, 12.4, 999, 1234, 61_000)] == ["-", "12 ms", "999 ms", "1.23 s", "1 m 01 s"]
    assert [label for _, label in layout_timeline([_call(0, 0.0, 5000)]).ticks] == [
        "0",
        "1.00 s",
        "2.00 s",
        "3.00 s",
        "4.00 s",
        "5.00 s",
    ]
