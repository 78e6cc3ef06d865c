"""Fuzzing capture: hostile streams, bodies and requests per dialect never break a record.

Each case runs through the stream tracker and the record builder the way `CaptureMiddleware`
runs them (see `fuzz_cases.check_case` for what is checked). `bench/fuzz.py` runs the same
cases by the hundred thousand; these run a few thousand per dialect.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtap.store import CaptureStore
from llmtap.store.readers import read_rollout_calls
from tests.reliability.fuzz_cases import (
    DIALECT_NAMES,
    SSE,
    CallCase,
    check_case,
    generated_case,
    mutated_case,
    vocabulary,
)

FUZZ_SETTINGS = settings(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
@settings(FUZZ_SETTINGS, max_examples=1000)
@given(rng=st.randoms(use_true_random=False))
def test_mutated_recordings_never_break_capture(dialect: str, rng: random.Random) -> None:
    check_case(mutated_case(rng, dialect))


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
@settings(FUZZ_SETTINGS, max_examples=500)
@given(rng=st.randoms(use_true_random=False))
def test_streams_made_from_the_dialects_vocabulary_never_break_capture(dialect: str, rng: random.Random) -> None:
    check_case(generated_case(rng, dialect))


JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def dialect_events(draw: st.DrawFn, dialect: str) -> dict[str, Any]:
    """An event object of the dialect's own keys and types, every value of any JSON type."""
    keys, types, _ = vocabulary(dialect)
    event: dict[str, Any] = draw(st.dictionaries(st.sampled_from(keys), JSON_VALUES, max_size=6))
    if draw(st.booleans()):
        event["type"] = draw(st.sampled_from(types))
    return event


@st.composite
def event_streams(draw: st.DrawFn, dialect: str) -> CallCase:
    """A stream of drawn events, named or not, sometimes with `[DONE]`, cut at drawn byte offsets."""
    _, types, _ = vocabulary(dialect)
    parts: list[bytes] = []
    for event in draw(st.lists(dialect_events(dialect), max_size=8)):
        name = draw(st.none() | st.sampled_from(types))
        head = b"" if name is None else b"event: " + name.encode() + b"\n"
        parts.append(head + b"data: " + json.dumps(event).encode() + b"\n\n")  # stdlib: ints past 64 bits too
        if draw(st.integers(0, 9)) == 0:
            parts.append(b"data: [DONE]\n\n")
    body = b"".join(parts)
    cuts = sorted(set(draw(st.lists(st.integers(0, len(body)), max_size=10))) | {0, len(body)})
    chunks = [body[a:b] for a, b in itertools.pairwise(cuts) if b > a]
    request = draw(st.dictionaries(st.sampled_from(vocabulary(dialect)[0]), JSON_VALUES, max_size=5))
    status = draw(st.sampled_from([200, 200, 400, 429, 500]))
    return CallCase(dialect, json.dumps({**request, "stream": True}).encode(), status, SSE, chunks, notes=["hypothesis"])


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
@settings(FUZZ_SETTINGS, max_examples=150)
@given(data=st.data())
def test_any_json_in_the_dialects_event_shapes_never_breaks_capture(dialect: str, data: st.DataObject) -> None:
    check_case(data.draw(event_streams(dialect)))


@pytest.mark.parametrize("dialect", DIALECT_NAMES)
def test_fuzzed_records_are_stored_and_read_back_by_the_strict_reader(dialect: str, tmp_path: Path) -> None:
    """The same cases through a real store: every line lands and the strict reader takes all of them."""
    rng = random.Random(f"store:{dialect}")
    lines = [check_case((mutated_case if i % 2 else generated_case)(rng, dialect)) for i in range(200)]
    with CaptureStore(tmp_path) as store:
        for line in lines:
            store.append("fuzzed", line)
        calls = read_rollout_calls(store, "fuzzed", strict=True)
    assert [record.call_index for record in calls.records] == list(range(len(lines)))
    assert not calls.unreadable_lines and not calls.torn_tail and not calls.incomplete
    assert [record.response_raw for record in calls.records] == [line.get("response_raw") for line in lines]
