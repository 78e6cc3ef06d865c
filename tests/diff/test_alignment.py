"""The call alignment: random inserts, removals and edits of a run's calls are recovered exactly."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from llmtap.diff.alignment import MAX_CELLS, CallSignature, align, signature, similarity


@dataclass
class Call:
    uid: int
    endpoint: str
    model: str
    settings: str
    rest: list[str]
    answer: str

    def signature(self) -> CallSignature:
        request = f"{self.endpoint}|{self.model}|{self.settings}|{self.uid}|{'|'.join(self.rest)}"
        return signature(
            self.endpoint,
            self.model,
            ["system", f"task-{self.uid}", *self.rest],
            prefix_length=2,
            settings=self.settings,
            request_key=request,
            exact=f"{request}->{self.answer}",
        )


def _call(uid: int, draw: st.DrawFn) -> Call:
    rest = [f"item-{uid}-{k}" for k in range(draw(st.integers(0, 4)))]
    return Call(
        uid=uid,
        endpoint=draw(st.sampled_from(["chat", "responses"])),
        model=draw(st.sampled_from(["m1", "m2"])),
        settings=draw(st.sampled_from(["s1", "s2"])),
        rest=rest,
        answer=f"answer-{uid}",
    )


def _edit(call: Call, draw: st.DrawFn) -> Call:
    kinds = ["answer", "model", "settings"] + (["item"] if call.rest else [])
    kind = draw(st.sampled_from(kinds))
    edited = Call(call.uid, call.endpoint, call.model, call.settings, list(call.rest), call.answer)
    if kind == "answer":
        edited.answer += "-edited"
    elif kind == "model":
        edited.model = "m3"
    elif kind == "settings":
        edited.settings = "s3"
    else:
        position = draw(st.integers(0, len(call.rest) - 1))
        edited.rest[position] += "-edited"
    return edited


@dataclass
class Scenario:
    a: list[Call]
    b: list[Call]
    pairs: set[tuple[int, int]]
    removed: set[int]
    added: set[int]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    """A run, and a second run made from it by removing, editing and inserting calls.

    A removal and an insertion never meet without a surviving call between them: a call removed
    and another inserted at the same place is a call changed in place, and the diff reports it so.
    """
    uids = iter(range(10_000))
    a = [_call(next(uids), draw) for _ in range(draw(st.integers(0, 25)))]
    b: list[Call] = []
    pairs: set[tuple[int, int]] = set()
    removed: set[int] = set()
    added: set[int] = set()
    last = "kept"  # what the previous position in the merged sequence was

    def maybe_insert() -> None:
        nonlocal last
        if last != "removed" and draw(st.integers(0, 4)) == 0:
            for _ in range(draw(st.integers(1, 2))):
                added.add(len(b))
                b.append(_call(next(uids), draw))
            last = "added"

    for index, call in enumerate(a):
        maybe_insert()
        action = draw(st.sampled_from(["keep", "keep", "edit", "remove"]))
        if action == "remove" and last != "added":
            removed.add(index)
            last = "removed"
            continue
        pairs.add((index, len(b)))
        b.append(_edit(call, draw) if action == "edit" else call)
        last = "kept"
    maybe_insert()
    return Scenario(a, b, pairs, removed, added)


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_random_inserts_removals_and_edits_are_recovered_exactly(scenario: Scenario) -> None:
    result = align([c.signature() for c in scenario.a], [c.signature() for c in scenario.b])
    assert {(i, j) for i, j in result if i is not None and j is not None} == scenario.pairs
    assert {i for i, j in result if j is None} == scenario.removed
    assert {j for i, j in result if i is None} == scenario.added
    # Every call appears exactly once, in order on both sides.
    assert [i for i, _ in result if i is not None] == list(range(len(scenario.a)))
    assert [j for _, j in result if j is not None] == list(range(len(scenario.b)))


def test_long_rollouts_past_the_full_programme_are_recovered_through_anchors() -> None:
    a = [Call(n, "chat", "m1", "s1", [f"item-{n}"], f"answer-{n}") for n in range(1500)]
    assert len(a) ** 2 > MAX_CELLS
    b = list(a)
    b[700] = Call(700, "chat", "m1", "s1", ["item-700"], "another answer")
    del b[900]  # a removal
    b.insert(300, Call(5000, "chat", "m1", "s1", ["new"], "new"))  # an insertion
    result = align([c.signature() for c in a], [c.signature() for c in b])
    removed = [i for i, j in result if j is None]
    added = [j for i, j in result if i is None]
    assert removed == [900] and added == [300]
    assert (700, 701) in result
    assert sum(1 for i, j in result if i is not None and j is not None) == 1499


def test_a_prompt_template_edit_still_pairs_calls_replaced_in_place() -> None:
    a = [Call(n, "chat", "m1", "s1", [f"tool-{n}"], f"answer-{n}") for n in range(3)]
    b = [Call(n + 100, "chat", "m1", "s1", [f"tool-{n}"], f"answer-{n}") for n in range(3)]  # every task prefix differs
    result = align([c.signature() for c in a], [c.signature() for c in b])
    assert result == [(0, 0), (1, 1), (2, 2)]


def test_calls_to_different_endpoints_never_pair() -> None:
    chat = Call(1, "chat", "m1", "s1", [], "x").signature()
    responses = Call(1, "responses", "m1", "s1", [], "x").signature()
    assert similarity(chat, responses) == 0.0
    assert align([chat], [responses]) == [(0, None), (None, 0)]


def test_identical_runs_pair_every_call_in_order() -> None:
    calls = [Call(n, "chat", "m1", "s1", [], "a").signature() for n in range(5000)]
    assert align(calls, list(calls)) == [(n, n) for n in range(5000)]
