"""Comparing rollouts built from real recorded calls: what is classified unchanged, changed, added, removed."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtap.diff.comparison import compare_rollout, percentile
from llmtap.diff.sources import RolloutSide
from llmtap.records import ModelCallRecord
from tests.diff.runs import answer_with, line_for
from tests.fixtures import fixture

BASIC = fixture("chat/text-basic-gpt4o")


def call_line(uid: int, *, answer: str | None = None, **changes: Any) -> dict[str, Any]:
    request = copy.deepcopy(BASIC.request_json)
    request["messages"][1]["content"] = f"Question number {uid}: say hi in Portuguese"
    request.update(changes)
    body = answer_with(BASIC, answer if answer is not None else f"Oi {uid}!")
    return line_for(BASIC, rollout_id="r", request=request, body=body, latency_ms=100.0)


def side(lines: list[dict[str, Any]]) -> RolloutSide:
    records = [ModelCallRecord.from_raw_line(line, n) for n, line in enumerate(lines)]
    return RolloutSide(key="r", rollout_id="r", records=records, lines=[n + 1 for n in range(len(records))])


EDITS = {
    "answer": lambda uid: call_line(uid, answer=f"Olá {uid}, tudo bem?"),
    "sampling": lambda uid: call_line(uid, temperature=0.2),
    "model": lambda uid: call_line(uid, model="gpt-4o-mini"),
    "tools": lambda uid: call_line(uid, tool_choice="none"),
}


Plan = tuple[int, list[tuple[int, str | None]], list[str]]


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    """Run A's call count, run B's calls as (uid, edit or None), and the statuses B's diff must give, in order.

    Run B is run A with calls removed, edited and inserted. A removal and an insertion never meet
    without a surviving call between them (see test_alignment: such a pair is a call changed in place).
    """
    count = draw(st.integers(0, 8))
    b: list[tuple[int, str | None]] = []
    expected: list[str] = []
    last = "kept"
    fresh = iter(range(1000, 2000))
    for uid in range(count):
        if last != "removed" and draw(st.integers(0, 4)) == 0:
            b.append((next(fresh), None))
            expected.append("added")
            last = "added"
        action = draw(st.sampled_from(["keep", "keep", "edit", "remove"]))
        if action == "remove" and last != "added":
            expected.append("removed")
            last = "removed"
            continue
        b.append((uid, draw(st.sampled_from(sorted(EDITS))) if action == "edit" else None))
        expected.append("changed" if action == "edit" else "unchanged")
        last = "kept"
    if last != "removed" and draw(st.booleans()):
        b.append((next(fresh), None))
        expected.append("added")
    return count, b, expected


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
def test_random_edits_of_real_calls_are_classified_exactly(plan: Plan) -> None:
    count, b_plan, expected = plan
    a = [call_line(uid) for uid in range(count)]
    b = [call_line(uid) if edit is None else EDITS[edit](uid) for uid, edit in b_plan]
    result = compare_rollout("r", side(a), side(b), payloads=True)
    assert result.counts == {status: expected.count(status) for status in ("unchanged", "changed", "added", "removed")}
    assert [call["status"] for call in result.calls] == [status for status in expected if status != "unchanged"]
    assert result.status == ("unchanged" if set(expected) <= {"unchanged"} else "changed")


def test_a_changed_call_names_the_request_part_and_the_answer_diff() -> None:
    result = compare_rollout("r", side([call_line(1)]), side([EDITS["tools"](1)]), payloads=True)
    (call,) = result.calls
    assert call["request"]["parts"] == ["tools"]
    assert call["response_text_diff"] == []
    result = compare_rollout("r", side([call_line(1)]), side([EDITS["answer"](1)]), payloads=True)
    (call,) = result.calls
    assert call["request"]["parts"] == [] and call["response_text_diff"][-2:] == ["-Oi 1!", "+Olá 1, tudo bem?"]


def test_a_long_answer_diff_is_cut() -> None:
    long_a = "\n".join(f"line {n}" for n in range(500))
    long_b = "\n".join(f"other {n}" for n in range(500))
    result = compare_rollout(
        "r", side([call_line(1, answer=long_a)]), side([call_line(1, answer=long_b)]), payloads=True
    )
    diff_lines = result.calls[0]["response_text_diff"]
    assert len(diff_lines) == 41 and diff_lines[-1] == "… (diff cut)"


def test_a_missing_side_makes_every_call_added_or_removed() -> None:
    removed = compare_rollout("r", side([call_line(1), call_line(2)]), None, payloads=True)
    assert removed.status == "removed" and removed.counts["removed"] == 2
    added = compare_rollout("r", None, side([call_line(1)]), payloads=True)
    assert added.status == "added" and added.call_count == {"before": None, "after": 1}


def test_percentiles_are_nearest_rank() -> None:
    values = [float(n) for n in range(1, 21)]
    assert percentile(values, 0.5) == 10.0 and percentile(values, 0.95) == 19.0
    assert percentile([], 0.95) is None and percentile([7.0], 0.95) == 7.0
