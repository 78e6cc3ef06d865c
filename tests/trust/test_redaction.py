"""Redaction keeps every line valid: secrets leave, everything else stays byte for byte."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtap.dialects import DIALECTS
from llmtap.records import StreamTracker
from llmtap.trust import redact_record_line, redact_stream, scan_text
from llmtap.trust.secrets import marker
from tests.fixtures import RecordedExchange, fixture, fixtures_for
from tests.trust.corpus import BENIGN, SECRETS, Sample, embeddings
from tests.trust.streams import capture_line, plant_split

CHAT = fixture("chat/tool-call-gpt4o")


def _has_text_deltas(recorded: RecordedExchange) -> bool:
    try:
        plant_split(recorded, "x" * 8, pieces=4)
    except ValueError:
        return False
    return True


# Every recorded stream that carries text deltas enough to split a key over (chat, Responses, Messages).
STREAMS = [
    recorded
    for dialect in ("chat", "responses", "messages")
    for recorded in fixtures_for(dialect, stream=True)
    if recorded.status == 200 and _has_text_deltas(recorded)
]


def _places(text: str) -> dict[str, dict[str, Any]]:
    """Request bodies that carry `text` where agents put such things."""
    places = {name: {"role": "user", "content": value} for name, value in embeddings(text).items()}
    places["tool_arguments"] = {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "call_kX9vTz3Yd2Qh8LmN1oPa4RsU",
                "type": "function",
                "function": {"name": "deploy", "arguments": json.dumps({"note": f'use "{text}"\n', "n": 1})},
            }
        ],
    }
    places["env_tool_result"] = {
        "role": "tool",
        "tool_call_id": "call_kX9vTz3Yd2Qh8LmN1oPa4RsU",
        "content": embeddings(text)["env_file"],
    }
    return places


def _line_with(message: dict[str, Any]) -> bytes:
    request = dict(CHAT.request_json)
    request["messages"] = [*request["messages"], message]
    return orjson.dumps(capture_line(CHAT, request=request))


def _redacted(line: bytes) -> tuple[bytes, list[tuple[str, ...]]]:
    found: list[tuple[str, ...]] = []
    return redact_record_line(line, lambda rule, secret, where, offset, length: found.append((rule, secret))), found


@pytest.mark.parametrize("sample", SECRETS, ids=lambda s: s.rule_id)
def test_every_sample_leaves_every_place_of_a_capture_line(sample: Sample) -> None:
    for place, message in _places(sample.in_context()).items():
        line = _line_with(message)
        out, found = _redacted(line)
        assert sample.secret.encode() not in out, place
        assert sample.secret not in out.decode("unicode_escape", "ignore"), place
        assert (sample.rule_id, sample.secret) in found, place
        record = orjson.loads(out)
        assert set(record) == set(orjson.loads(line))
        assert marker(sample.rule_id) in json.dumps(record), place


@pytest.mark.parametrize("value", BENIGN, ids=lambda v: v[:24])
def test_benign_values_in_every_place_leave_the_line_untouched(value: str) -> None:
    for place, message in _places(value).items():
        line = _line_with(message)
        out, found = _redacted(line)
        assert out is line and found == [], place


def test_the_recorded_fixtures_hold_no_secret_and_come_back_unchanged() -> None:
    for recorded in [*fixtures_for("chat"), *fixtures_for("responses"), *fixtures_for("messages")]:
        line = orjson.dumps(capture_line(recorded))
        assert redact_record_line(line) is line, recorded.id


def test_escapes_around_a_key_do_not_hide_it() -> None:
    key = SECRETS[0].secret
    escaped = "".join(f"\\u{ord(c):04x}" for c in key[:12]) + key[12:]
    line = b'{"request":{"messages":[{"content":"a \\"' + escaped.encode() + b'\\"\\n"}]},"call_index":3}'
    out, found = _redacted(line)
    assert [rule for rule, _ in found] == ["openai-project-key"]
    assert orjson.loads(out) == {
        "request": {"messages": [{"content": 'a "[REDACTED:openai-project-key]"\n'}]},
        "call_index": 3,
    }


def test_only_the_token_holding_a_secret_is_re_encoded() -> None:
    key = SECRETS[0].secret
    line = ('{"a": 1.50,  "b" : "caf\\u00e9", "c": "k=' + key + '", "d": [1e3, null]}\n').encode()
    out, _ = _redacted(line)
    assert out == b'{"a": 1.50,  "b" : "caf\\u00e9", "c": "k=[REDACTED:openai-project-key]", "d": [1e3, null]}\n'


def test_a_damaged_line_is_redacted_as_text_and_stays_damaged() -> None:
    key = SECRETS[0].secret
    line = b'{"request": {"content": "' + key.encode() + b'"'
    out, found = _redacted(line)
    assert key.encode() not in out and found
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(out)


def _reassembled(recorded: RecordedExchange, raw: str) -> Any:
    tracker = StreamTracker(DIALECTS[recorded.dialect])
    tracker.feed(raw.encode())
    outcome = tracker.outcome()
    assert outcome is not None
    return outcome.response


@pytest.mark.parametrize("recorded", STREAMS, ids=lambda r: r.id)
@pytest.mark.parametrize("sample", [SECRETS[0], SECRETS[6], SECRETS[18], SECRETS[-4]], ids=lambda s: s.rule_id)
def test_a_secret_split_across_stream_deltas_is_cut_from_every_piece(
    recorded: RecordedExchange, sample: Sample
) -> None:
    body = plant_split(recorded, f"here: {sample.in_context()} done", pieces=4)
    line = orjson.dumps(capture_line(recorded, body=body))
    out, found = _redacted(line)
    record = orjson.loads(out)
    raw = record["response_raw"]
    for start in range(0, len(sample.secret) - 8, 4):
        assert sample.secret[start : start + 8] not in raw  # no piece of it survives in any event
    assert sample.rule_id in {rule for rule, _ in found}
    assert _reassembled(recorded, raw) == record["response"]  # the raw stream still reassembles, to the same
    assert marker(sample.rule_id) in json.dumps(record["response"])
    assert redact_record_line(out) is out  # and a second pass finds nothing


def _interleaved_choices(key: str) -> str:
    """A chat stream with n=2 whose choice 0 streams `key` in two pieces around a delta of choice 1."""
    events = [
        {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": key[:20]}}]},
        {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 1, "delta": {"content": " "}}]},
        {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": key[20:]}}]},
        {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"


def test_a_key_split_around_another_choices_delta_is_cut_from_its_pieces() -> None:
    key = SECRETS[0].secret
    raw = _interleaved_choices(key)  # the field-wise join reads "<piece> <piece>": only the dialect sees the key
    found: list[tuple[str, str]] = []
    out = redact_stream(raw, "chat", lambda rule, secret, *_: found.append((rule, secret)))
    assert key[:20] not in out and key[20:] not in out
    assert found == [("openai-project-key", key)]
    response = _reassembled(fixture("chat/text-stream-no-usage-gpt4"), out)
    assert response["choices"][0]["message"]["content"] == "[REDACTED:openai-project-key]"
    assert response["choices"][1]["message"]["content"] == " "


def test_a_stream_the_dialect_still_reads_a_secret_from_is_replaced_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmtap.trust import redaction

    monkeypatch.setattr(redaction, "_cut_chain", lambda *args: False)  # as if no sequence of values spelled it
    found: list[str] = []
    out = redact_stream(_interleaved_choices(SECRETS[0].secret), "chat", lambda rule, secret, *_: found.append(secret))
    assert out == "[REDACTED:stream-unverified]"
    assert found == [""]  # reported, with nothing to hash


@settings(max_examples=150, deadline=None)
@given(
    prefix=st.text(max_size=30),
    suffix=st.text(max_size=30),
    which=st.sampled_from(SECRETS),
    call_index=st.integers(min_value=0, max_value=10**6),
    escape=st.booleans(),
)
def test_redacted_lines_parse_keep_call_index_and_are_idempotent(
    prefix: str, suffix: str, which: Sample, call_index: int, escape: bool
) -> None:
    text = f"{prefix} {which.in_context()} {suffix}"
    record = {"call_index": call_index, "request": {"messages": [{"content": text}]}, "tags": [prefix]}
    line = json.dumps(record, ensure_ascii=escape).encode() + b"\n"
    out, found = _redacted(line)
    parsed = orjson.loads(out)
    assert parsed["call_index"] == call_index and parsed["tags"] == [prefix]
    assert which.secret not in parsed["request"]["messages"][0]["content"]
    assert found and out.endswith(b"\n")
    assert redact_record_line(out) is out


@settings(max_examples=100, deadline=None)
@given(positions=st.lists(st.integers(min_value=0, max_value=200), max_size=8), which=st.sampled_from(SECRETS[:40]))
def test_unicode_escaping_any_characters_cannot_hide_a_key(positions: list[int], which: Sample) -> None:
    text = which.in_context()
    chosen = {p % len(text) for p in positions}
    encoded = "".join(f"\\u{ord(c):04x}" if i in chosen else json.dumps(c)[1:-1] for i, c in enumerate(text))
    line = ('{"call_index": 1, "content": "' + encoded + '"}').encode()
    out, _ = _redacted(line)
    assert which.secret not in orjson.loads(out)["content"]


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_text_without_secrets_comes_back_as_the_same_object(text: str) -> None:
    line = orjson.dumps({"call_index": 0, "content": text})
    if not scan_text(text):
        assert redact_record_line(line) is line


def test_json_nested_in_strings_past_the_depth_bound_is_still_scanned_as_text() -> None:
    key = SECRETS[0].secret
    value: object = {"api": key}
    for _ in range(7):  # JSON in a string in a string ..., deeper than the four levels decoded
        value = {"inner": json.dumps(value)}
    line = orjson.dumps({"call_index": 0, "request": value})
    out, found = _redacted(line)
    assert key.encode() not in out and [rule for rule, _ in found] == ["openai-project-key"]
    assert orjson.loads(out)["call_index"] == 0

