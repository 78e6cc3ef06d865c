"""Readers: records back from the store, strict and tolerant, with stable call_index."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtap.cli import main
from llmtap.errors import CaptureRecordError
from llmtap.exchange import Exchange
from llmtap.records import raw_line_from_exchange
from llmtap.records.fingerprint import continuation_fingerprint
from llmtap.rollouts.terminal_reading import EntryView
from llmtap.store import CaptureStore
from llmtap.store.readers import aggregate_model_call_metrics, json_objects, read_model_call_records, read_rollout_calls
from tests.fixtures import fixture


def _line(i: int, tokens: int | None = None) -> dict[str, object]:
    response = {"id": f"chatcmpl-{i}", "choices": [], "usage": {"prompt_tokens": tokens, "completion_tokens": 1}}
    return {"model_call_id": f"c{i}", "dialect": "chat", "started_at": 1.0 + i, "completed_at": 2.0 + i,
            "latency_ms": 10.0, "status_code": 200, "error_category": None, "request": {}, "response": response}


def test_damaged_and_foreign_lines_keep_the_other_indices(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.append("r", _line(0, 5))
    with store.path_for("r").open("ab") as handle:
        handle.write(b"{not json\n\n")
    store.append("r", {"something": "else"})
    store.append("r", _line(3, 7))
    calls = read_rollout_calls(store, "r")
    assert [r.call_index for r in calls.records] == [0, 3]
    assert calls.unreadable_lines == [1, 2]
    assert aggregate_model_call_metrics(store, "r")["tokens_in"] == 12


def test_strict_read_names_the_damaged_line(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.append("r", _line(0))
    with store.path_for("r").open("ab") as handle:
        handle.write(b"\n{not json\n")
    with pytest.raises(CaptureRecordError, match="Line 3 of"):
        read_model_call_records(store, "r")


def test_strict_read_names_a_foreign_record_by_call_index(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.append("r", _line(0))
    store.append("r", {"not": "a capture record"})
    with pytest.raises(CaptureRecordError, match="call_index 1") as raised:
        read_model_call_records(store, "r")
    assert raised.value.call_index == 1 and raised.value.line_number is None
    assert [r.model_call_id for r in read_model_call_records(store, "r", strict=False)] == ["c0"]


def test_aggregate_needs_a_rollout_id_with_a_store(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="rollout id"):
        aggregate_model_call_metrics(CaptureStore(tmp_path))


# The reference system's own files -------------------------------------------------------------
# Lines as the reference's CaptureStore writes them (orjson, no schema_version), with the fields
# its newer model servers add that llmtap does not read.

REFERENCE_TRUNCATED_STREAM = (
    b'{"model_call_id":"5f0c2a9e7b8d4c1e9a3f6b2d8e4c7a10","dialect":"responses",'
    b'"model_ref":{"type":"responses_api_models","name":"policy_model"},'
    b'"started_at":1767225600.125,"completed_at":1767225601.5,"latency_ms":1375.02,"latency_ttft_ms":210.4,'
    b'"status_code":200,"error_category":"stream_truncated",'
    b'"request":{"model":"policy","input":"Say hi","stream":true},'
    b'"response":{"id":"resp_1","object":"response","status":"in_progress","output":[]},'
    b'"response_raw":"event: response.created\\ndata: {\\"type\\":\\"response.created\\"}\\n\\n",'
    b'"client_session_id":"sess-7","upstream_attempted":true,"response_source":"upstream",'
    b'"upstream_status_code":200,"local_response_reason":null}'
)
REFERENCE_CHAT_CALL = (
    b'{"model_call_id":"0b6e4d2c9a1f4e8b8c7d6e5f4a3b2c1d","dialect":"chat","model_ref":null,'
    b'"started_at":1767225602.0,"completed_at":1767225602.25,"latency_ms":250.0,"latency_ttft_ms":null,'
    b'"status_code":200,"error_category":null,'
    b'"request":{"model":"policy","messages":[{"role":"user","content":"2+2?"}]},'
    b'"response":{"id":"chatcmpl-9","object":"chat.completion","model":"policy",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"4"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}},'
    b'"client_session_id":"sess-7","upstream_attempted":true,"response_source":"upstream"}'
)
REFERENCE_EXTRA = {
    "client_session_id": "sess-7",
    "upstream_attempted": True,
    "response_source": "upstream",
    "upstream_status_code": 200,
    "local_response_reason": None,
}


def _status_output(directory: Path) -> str:
    result = CliRunner().invoke(main, ["records", "status", str(directory)])
    assert result.exit_code == 0, result.output
    return result.output


def test_a_reference_line_with_a_truncated_stream_reads_as_a_truncated_stream(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.path_for("r").write_bytes(REFERENCE_TRUNCATED_STREAM + b"\n" + REFERENCE_CHAT_CALL + b"\n")
    truncated, chat = read_model_call_records(store, "r")
    assert (truncated.schema_version, truncated.error_category) == (0, "stream_truncated")
    assert (truncated.stream, truncated.stream_truncated) == (True, True)
    assert (chat.stream, chat.stream_truncated) == (False, False)  # no category to derive them from


def test_llmtap_lines_keep_the_stream_flags_they_wrote(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.append("r", {**_line(0), "schema_version": 1, "error_category": "stream_truncated"})
    store.append("r", {**_line(1), "schema_version": 1, "stream": True, "stream_truncated": False})
    first, second = read_model_call_records(store, "r")
    assert (first.stream, first.stream_truncated) == (False, False)  # a versioned line says what it means
    assert (second.stream, second.stream_truncated) == (True, False)


def test_a_last_line_that_lost_only_its_newline_is_a_record(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.path_for("r").write_bytes(REFERENCE_TRUNCATED_STREAM + b"\n" + REFERENCE_CHAT_CALL)
    calls = read_rollout_calls(store, "r", strict=True)
    assert [(r.call_index, r.response_id) for r in calls.records] == [(0, "resp_1"), (1, "chatcmpl-9")]
    assert not calls.torn_tail and calls.unreadable_lines == []
    assert "calls: 2" in (output := _status_output(tmp_path))
    assert "damaged lines: 0 (torn tails: 0)" in output

    store.append("r", _line(2))  # the next committer ends the unterminated line first
    assert [r.call_index for r in read_model_call_records(store, "r")] == [0, 1, 2]
    assert store.path_for("r").read_bytes().count(b"\n") == 3


@pytest.mark.parametrize("cut", [1, 40, len(REFERENCE_CHAT_CALL) - 1])
def test_a_cut_off_last_line_is_still_a_torn_tail(tmp_path: Path, cut: int) -> None:
    store = CaptureStore(tmp_path)
    store.path_for("r").write_bytes(REFERENCE_TRUNCATED_STREAM + b"\n" + REFERENCE_CHAT_CALL[:cut])
    calls = read_rollout_calls(store, "r", strict=True)  # a torn tail is no damage to a strict read either
    assert [r.call_index for r in calls.records] == [0]
    assert calls.torn_tail and calls.unreadable_lines == []
    assert "damaged lines: 1 (torn tails: 1)" in _status_output(tmp_path)


@pytest.mark.parametrize("tail", [b"[1, 2]", b"17", b'"text"', b"null", b"   "])
def test_a_last_segment_that_is_not_an_object_is_a_torn_tail(tmp_path: Path, tail: bytes) -> None:
    store = CaptureStore(tmp_path)
    store.path_for("r").write_bytes(REFERENCE_CHAT_CALL + b"\n" + tail)
    read = store.read("r", strict=True)
    assert len(read.entries) == 1 and read.torn_tail and read.invalid_lines == []


def test_fields_llmtap_does_not_know_are_kept_on_the_record(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.path_for("r").write_bytes(REFERENCE_TRUNCATED_STREAM + b"\n")
    (record,) = read_model_call_records(store, "r")
    assert record.extra == REFERENCE_EXTRA
    assert record.to_dict(include_payloads=False)["extra"] == REFERENCE_EXTRA


def test_llmtap_lines_have_nothing_extra(tmp_path: Path) -> None:
    recorded = fixture("chat/text-basic-gpt4o")
    exchange = Exchange(method="POST", path=recorded.request_path, request_body=json.dumps(recorded.request_json).encode())
    exchange.status_code = recorded.status
    exchange.response_headers = {"content-type": recorded.content_type}
    exchange.add_response_chunk(recorded.body_bytes)
    exchange.extra["capture"] = {"point": "in-process", "hook": "httpx", "pid": 1}
    store = CaptureStore(tmp_path)
    store.append("r", raw_line_from_exchange(exchange))
    (record,) = read_model_call_records(store, "r")
    assert record.extra == {}


def test_a_stored_continuation_fingerprint_is_read_with_its_version(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    stored = "ab" * 32
    store.append("r", {**_line(0), "continuation_fingerprint": stored, "fingerprint_version": 2})
    store.append("r", {**_line(1), "continuation_fingerprint": 7, "fingerprint_version": "2"})  # not ours
    store.append("r", _line(2))
    first, odd, plain = read_model_call_records(store, "r")
    assert (first.continuation_fingerprint, first.fingerprint_version) == (stored, 2)
    assert (odd.continuation_fingerprint, odd.fingerprint_version) == (None, None)
    assert (plain.continuation_fingerprint, plain.fingerprint_version) == (None, None)
    assert "continuation_fingerprint" not in first.extra


def test_llmtap_computes_its_own_continuation_fingerprint_at_read_time(tmp_path: Path) -> None:
    """llmtap's lines store no fingerprint (computing it costs too much per call, see
    docs/benchmarks.md); terminal attribution computes the version-2 one from the payloads."""
    store = CaptureStore(tmp_path)
    store.path_for("r").write_bytes(REFERENCE_CHAT_CALL + b"\n")
    (record,) = read_model_call_records(store, "r")
    # The version-2 lineage bytes of the one model-authored turn, the answer "4" (see tests/records/test_fingerprint.py).
    turn = b"nemo-gym-lineage" b"\x00" b"\x00\x00\x00\x00\x00\x00\x00\x04" b"text" b"\x01" b"\x00\x00\x00\x00\x00\x00\x00\x01" b"4"
    expected = hashlib.sha256(turn).hexdigest()
    assert record.continuation_fingerprint is None
    assert continuation_fingerprint(record.request, record.response, dialect="chat") == expected
    assert EntryView(record, record.model_call_id).continuation_fingerprints == frozenset({expected})


# One parse path for the other JSON-lines files -------------------------------------------------

JSON_OBJECTS = st.lists(st.dictionaries(st.text(max_size=4), st.integers(-(2**63), 2**63 - 1) | st.text(max_size=6), max_size=3), max_size=6)


@settings(max_examples=100, deadline=None)
@given(objects=JSON_OBJECTS, terminated=st.booleans(), damaged=st.sampled_from([b"", b"{cut", b"[1]", b"  "]))
def test_json_objects_reads_every_whole_object_in_order(
    objects: list[dict[str, object]], terminated: bool, damaged: bytes
) -> None:
    lines = [orjson.dumps(value) for value in objects]
    data = damaged + b"\n" + b"\n".join(lines) + (b"\n" if terminated else b"")
    assert json_objects(data) == objects


def test_json_objects_drops_a_cut_off_last_line() -> None:
    assert json_objects(b'{"a": 1}\n{"b": 2}\n{"c": ') == [{"a": 1}, {"b": 2}]
