"""Request matching for replay: match keys, the per-rollout occurrence order, and misses that say what differs."""

from __future__ import annotations

import copy
import os
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtap.dialects.projection import MATCH_KEY_VERSION, VOLATILE_FIELDS, endpoint_for_path, request_projection
from llmtap.records import ModelCallRecord
from llmtap.replay.matching import (
    SHORT_VALUE_CHARS,
    Miss,
    RecordedCall,
    RecordingError,
    RecordingIndex,
    json_differences,
    match_key,
)
from llmtap.store import CaptureStore
from tests.diff.runs import line_for, write_capsule, write_run
from tests.fixtures import RecordedExchange, all_fixtures, fixture

FIXTURES = [f for f in all_fixtures() if isinstance(f.request_json, dict)]
Path_ = tuple[Any, ...]


def key_of(recorded: RecordedExchange, body: dict[str, Any]) -> str:
    return match_key(request_projection(endpoint_for_path(recorded.request_path), body))


def leaves(value: Any, path: Path_ = ()) -> list[Path_]:
    if isinstance(value, dict) and value:
        return [leaf for key, item in value.items() for leaf in leaves(item, (*path, key))]
    if isinstance(value, list) and value:
        return [leaf for index, item in enumerate(value) for leaf in leaves(item, (*path, index))]
    return [path]


def get(value: Any, path: Path_) -> Any:
    for step in path:
        value = value[step]
    return value


def has(value: Any, path: Path_) -> bool:
    for step in path:
        if (
            isinstance(value, dict)
            and step in value
            or isinstance(value, list)
            and isinstance(step, int)
            and step < len(value)
        ):
            value = value[step]
        else:
            return False
    return True


def mutated(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + " (edited)"
    if value == []:
        return ["added"]
    if value == {}:
        return {"added": 1}
    return "was null"


def with_leaf(body: dict[str, Any], path: Path_, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(body)
    target = changed
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return changed


def shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {key: shuffled(item, rng) for key, item in items}
    if isinstance(value, list):
        return [shuffled(item, rng) for item in value]
    return value


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_key_changes_with_every_field_that_is_not_volatile(data: st.DataObject) -> None:
    recorded = data.draw(st.sampled_from(FIXTURES))
    body = recorded.request_json
    projected = request_projection(endpoint_for_path(recorded.request_path), body)["request"]
    path = data.draw(st.sampled_from([leaf for leaf in leaves(projected) if leaf and has(body, leaf)]))
    assert key_of(recorded, with_leaf(body, path, mutated(get(body, path)))) != key_of(recorded, body)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_key_ignores_volatile_fields_and_key_order(data: st.DataObject) -> None:
    recorded = data.draw(st.sampled_from(FIXTURES))
    body = recorded.request_json
    projected = request_projection(endpoint_for_path(recorded.request_path), body)["request"]
    changed = shuffled(body, random.Random(data.draw(st.integers(0, 2**32))))
    volatile = [leaf for leaf in leaves(body) if leaf and not has(projected, leaf)]
    for path in data.draw(st.lists(st.sampled_from(volatile), max_size=4)) if volatile else []:
        changed = with_leaf(changed, path, mutated(get(changed, path)))
    top_level = sorted(VOLATILE_FIELDS[endpoint_for_path(recorded.request_path) or "chat"]["top_level"])
    for name in data.draw(st.lists(st.sampled_from(top_level), max_size=3)):
        changed[name] = data.draw(
            st.one_of(
                st.text(max_size=8),
                st.integers(),
                st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
            )
        )
    assert key_of(recorded, changed) == key_of(recorded, body)


def test_volatile_places_are_trimmed_only_where_named() -> None:
    followup = fixture("messages/tool-result-followup-sonnet4").request_json
    projected = request_projection("messages", followup)["request"]
    tool_use = projected["messages"][1]["content"][1]
    assert tool_use == {"input": {"location": "Florence,Italy"}, "name": "weather", "type": "tool_use"}
    assert "tool_use_id" not in projected["messages"][2]["content"][0]
    # A tool argument named `id` is the model's input, not a provider id: it stays.
    with_id = copy.deepcopy(followup)
    with_id["messages"][1]["content"][1]["input"] = {"id": 1}
    assert request_projection("messages", with_id)["request"]["messages"][1]["content"][1]["input"] == {"id": 1}
    assert key_of(fixture("messages/tool-result-followup-sonnet4"), with_id) != key_of(
        fixture("messages/tool-result-followup-sonnet4"), followup
    )


def test_a_missing_stream_flag_is_false() -> None:
    recorded = fixture("chat/text-basic-gpt4o")
    body = recorded.request_json
    assert "stream" not in body
    assert key_of(recorded, {**body, "stream": False}) == key_of(recorded, body)
    assert key_of(recorded, {**body, "stream": True}) != key_of(recorded, body)


def test_the_key_names_its_version() -> None:
    projection = request_projection("chat", {"model": "m", "messages": []})
    assert MATCH_KEY_VERSION == 1 and len(match_key(projection)) == 64


def record(line: dict[str, Any], call_index: int) -> ModelCallRecord:
    return ModelCallRecord.from_raw_line(line, call_index)


def test_every_recorded_exchange_matches_its_own_recording(tmp_path: Path) -> None:
    rollouts = {f"r-{n}": [line_for(recorded, rollout_id=f"r-{n}")] for n, recorded in enumerate(all_fixtures())}
    index = RecordingIndex.from_store(CaptureStore(write_run(tmp_path / "calls", rollouts), create=False))
    for n, recorded in enumerate(all_fixtures()):
        found = index.match(f"r-{n}", recorded.request_json, endpoint=endpoint_for_path(recorded.request_path))
        assert isinstance(found, RecordedCall), recorded.id
        assert found.record.status_code == recorded.status and found.record.request == recorded.request_json


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2), max_size=12), st.randoms(use_true_random=False))
def test_identical_requests_are_served_in_recorded_order(choices: list[int], rng: random.Random) -> None:
    basic = fixture("chat/text-basic-gpt4o")
    requests = [{**basic.request_json, "messages": [{"role": "user", "content": f"question {n}"}]} for n in range(3)]
    lines = [line_for(basic, rollout_id="r", request=requests[choice]) for choice in choices]
    index = RecordingIndex.from_records({"r": [record(line, n) for n, line in enumerate(lines)]})
    asked = list(choices)
    rng.shuffle(asked)  # the replayed run may interleave its requests differently
    served: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for choice in asked:
        found = index.match("r", requests[choice], endpoint="chat")
        assert isinstance(found, RecordedCall)
        served[choice].append(found.call_index)
    for choice, indexes in served.items():
        assert indexes == [n for n, c in enumerate(choices) if c == choice]
        assert [index.calls("r")[i].occurrence for i in indexes] == list(range(len(indexes)))
    assert index.unserved() == []
    extra = index.match("r", requests[0], endpoint="chat")
    if choices.count(0):
        assert isinstance(extra, Miss) and extra.reason == "exhausted" and extra.occurrence == choices.count(0)
        assert "the recording has it" in extra.describe()


def test_the_same_request_in_another_rollout_is_another_call() -> None:
    basic = fixture("chat/text-basic-gpt4o")
    index = RecordingIndex.from_records(
        {"a": [record(line_for(basic, rollout_id="a"), 0)], "b": [record(line_for(basic, rollout_id="b"), 0)]}
    )
    first = index.match("a", basic.request_json, endpoint="chat")
    assert isinstance(first, RecordedCall) and first.rollout_id == "a"
    assert [(call.rollout_id, call.call_index) for call in index.unserved()] == [("b", 0)]
    again = index.match("a", basic.request_json, endpoint="chat")
    assert isinstance(again, Miss) and again.reason == "exhausted"
    other = index.match("b", basic.request_json, endpoint="chat")
    assert isinstance(other, RecordedCall) and other.rollout_id == "b"


def test_a_miss_names_the_differing_field_as_a_pointer() -> None:
    basic = fixture("chat/text-basic-gpt4o")
    index = RecordingIndex.from_records({"r": [record(line_for(basic, rollout_id="r"), 0)]})
    found = index.match("r", {**basic.request_json, "temperature": 0.7}, endpoint="chat")
    assert isinstance(found, Miss) and found.reason == "no_matching_call"
    assert found.closest is not None and found.closest.call_index == 0
    assert [d.to_dict() for d in found.differences] == [
        {"pointer": "/request/temperature", "before": None, "after": "0.7"}
    ]
    assert found.to_dict()["differences"][0]["pointer"] == "/request/temperature"
    assert "/request/temperature: recorded (absent), now 0.7" in found.describe()


def test_the_closest_call_is_from_the_same_endpoint_and_model_first() -> None:
    basic = fixture("chat/text-basic-gpt4o")
    same_messages_other_model = line_for(basic, rollout_id="r")
    mini = {**basic.request_json, "model": "gpt-4o-mini", "messages": [{"role": "user", "content": "other"}]}
    index = RecordingIndex.from_records(
        {"r": [record(same_messages_other_model, 0), record(line_for(basic, rollout_id="r", request=mini), 1)]}
    )
    asked = {**basic.request_json, "model": "gpt-4o-mini", "max_tokens": 1}
    found = index.match("r", asked, endpoint="chat")
    assert isinstance(found, Miss) and found.closest is not None
    assert found.closest.call_index == 1 and found.closest.model == "gpt-4o-mini"


def test_a_miss_for_an_unknown_rollout_looks_in_the_others() -> None:
    basic = fixture("chat/text-basic-gpt4o")
    index = RecordingIndex.from_records({"r": [record(line_for(basic, rollout_id="r"), 0)]})
    found = index.match("elsewhere", basic.request_json, endpoint="chat")
    assert isinstance(found, Miss) and found.reason == "unknown_rollout"
    assert found.closest is not None and found.closest.rollout_id == "r" and found.differences == ()


def test_miss_values_are_short_excerpts_around_the_change_never_the_whole_prompt() -> None:
    basic = fixture("chat/text-basic-gpt4o")
    prompt = "word " * 2000
    recorded = {**basic.request_json, "messages": [{"role": "user", "content": prompt}]}
    index = RecordingIndex.from_records({"r": [record(line_for(basic, rollout_id="r", request=recorded), 0)]})
    changed = prompt[:5000] + "CHANGED" + prompt[5007:]
    found = index.match("r", {**recorded, "messages": [{"role": "user", "content": changed}]}, endpoint="chat")
    assert isinstance(found, Miss)
    (difference,) = found.differences
    assert difference.pointer == "/request/messages/0/content"
    assert difference.after is not None and difference.before is not None
    assert "CHANGED" in difference.after and "(10000 chars)" in difference.after
    assert len(difference.after) <= SHORT_VALUE_CHARS + 30 and len(difference.before) <= SHORT_VALUE_CHARS + 30
    assert len(found.describe()) < 1000


def test_json_differences_are_bounded_and_counted() -> None:
    before = {f"k{n}": n for n in range(100)}
    after = {f"k{n}": n + 1 for n in range(100)}
    listed, total = json_differences(before, after, limit=5)
    assert len(listed) == 5 and total == 100
    listed, _ = json_differences({"a/b": {"c~d": 1}}, {"a/b": {"c~d": 2}})
    assert listed[0].pointer == "/a~1b/c~0d"


def test_an_index_opens_a_capsule_and_refuses_a_link(tmp_path: Path) -> None:
    basic = fixture("chat/text-basic-gpt4o")
    capsule = write_capsule(tmp_path / "run", {"r": [line_for(basic, rollout_id="r")]})
    index = RecordingIndex.from_path(capsule)
    assert index.rollouts() == ["r"] and isinstance(index.match("r", basic.request_json, endpoint="chat"), RecordedCall)
    link = tmp_path / "link"
    os.symlink(capsule, link)
    with pytest.raises(RecordingError, match="link"):
        RecordingIndex.from_path(link)
    os.symlink(capsule / "calls", tmp_path / "other-calls")
    fake = tmp_path / "fake"
    fake.mkdir()
    os.symlink(capsule / "calls", fake / "calls")
    with pytest.raises(RecordingError, match="link"):
        RecordingIndex.from_path(fake)
    with pytest.raises(RecordingError, match="does not exist"):
        RecordingIndex.from_path(tmp_path / "missing")


def test_concurrent_requests_of_one_rollout_each_get_a_distinct_recorded_call() -> None:
    from concurrent.futures import ThreadPoolExecutor

    basic = fixture("chat/text-basic-gpt4o")
    index = RecordingIndex.from_records({"r": [record(line_for(basic, rollout_id="r"), n) for n in range(64)]})
    with ThreadPoolExecutor(8) as pool:
        found = list(pool.map(lambda _: index.match("r", basic.request_json, endpoint="chat"), range(64)))
    assert sorted(call.call_index for call in found if isinstance(call, RecordedCall)) == list(range(64))


def test_a_hostile_nesting_depth_ends_as_one_difference() -> None:
    from llmtap.replay.matching import MAX_POINTER_DEPTH

    def nested(depth: int, leaf: Any) -> Any:
        value = leaf
        for _ in range(depth):
            value = {"x": value}
        return value

    listed, total = json_differences(nested(500, 1), nested(500, 2))
    assert total == 1 and listed[0].pointer == "/x" * MAX_POINTER_DEPTH
    assert listed[0].before is not None and len(listed[0].before) <= SHORT_VALUE_CHARS


def test_an_index_from_a_store_keeps_each_persisted_line(tmp_path: Path) -> None:
    recorded = fixture("chat/text-stream-include-usage-gpt4")
    index = RecordingIndex.from_path(write_run(tmp_path / "calls", {"r": [line_for(recorded, rollout_id="r")]}))
    found = index.match("r", recorded.request_json, endpoint="chat")
    assert isinstance(found, RecordedCall) and found.line is not None
    assert found.line["status_code"] == 200 and found.line["response_raw"] == recorded.body_text
    assert found.line["http"]["response_headers"]["content-type"].startswith("text/event-stream")
