"""Recorded answers (status, headers, events, the scaled timing) and the network guard of a mocked replay."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmtap.replay.answers import ReplayAnswerError, answer_from_line, split_events
from llmtap.replay.guard import NetworkGuard, ReplayNetworkBlocked, guarded_addresses, recorded_servers

STREAM_LINE = {
    "status_code": 200,
    "stream": True,
    "response_raw": "data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n",
    "latency_ms": 400.0,
    "latency_ttft_ms": 100.0,
    "http": {"response_headers": {"content-type": "text/event-stream", "x-request-id": "req_1", "content-encoding": "gzip"}},
}


@given(st.lists(st.sampled_from([b"data: x", b"\n", b"\r\n", b"\r", b"event: y", b":", b"\n\n"]), max_size=30))
def test_events_join_back_to_the_stream_and_each_ends_at_a_blank_line(parts: list[bytes]) -> None:
    body = b"".join(parts)
    pieces = split_events(body)
    assert b"".join(pieces) == body
    for piece in pieces[:-1]:
        assert piece.endswith((b"\n\n", b"\r\n\r\n", b"\r\r"))


def test_a_stream_answers_event_by_event_with_its_status_and_headers() -> None:
    answer = answer_from_line(STREAM_LINE)
    assert answer.status == 200 and answer.stream
    assert [chunk for _, chunk in answer.chunks] == [b'data: {"a":1}\n\n', b'data: {"b":2}\n\n', b"data: [DONE]\n\n"]
    assert answer.header("x-request-id") == "req_1"
    assert answer.header("content-encoding") is None  # the recorded body is the decoded one
    assert answer.header("content-length") is None


def test_the_timing_is_the_recorded_ttft_then_the_rest_spread_evenly_scaled_by_speed() -> None:
    assert [delay for delay, _ in answer_from_line(STREAM_LINE, speed=0).chunks] == [0.0, 0.0, 0.0]
    assert [delay for delay, _ in answer_from_line(STREAM_LINE, speed=1).chunks] == pytest.approx([0.1, 0.15, 0.15])
    assert [delay for delay, _ in answer_from_line(STREAM_LINE, speed=2).chunks] == pytest.approx([0.05, 0.075, 0.075])


def test_a_stream_with_recorded_chunks_comes_back_in_those_chunks_after_their_recorded_gaps() -> None:
    """A line written with `response_chunks` replays the chunks the client got, mid-event cuts
    included, each after the gap it arrived after (divided by speed)."""
    raw = STREAM_LINE["response_raw"].encode()
    line = {**STREAM_LINE, "response_chunks": [[120_000, 10], [300_000, len(raw) - 10]]}
    answer = answer_from_line(line, speed=2)
    assert [chunk for _, chunk in answer.chunks] == [raw[:10], raw[10:]]
    assert [delay for delay, _ in answer.chunks] == pytest.approx([0.06, 0.09])
    assert [delay for delay, _ in answer_from_line(line, speed=0).chunks] == [0.0, 0.0]
    broken = {**STREAM_LINE, "response_chunks": [[120_000, 10]]}  # does not cut these bytes: event boundaries
    assert len(answer_from_line(broken).chunks) == 3


def test_a_json_body_is_the_recorded_value_with_its_length() -> None:
    line = {"status_code": 429, "response": {"error": {"type": "rate_limit"}}, "http": {"response_headers": {"retry-after": "3"}}}
    answer = answer_from_line(line)
    assert answer.status == 429 and answer.body == b'{"error":{"type":"rate_limit"}}'
    assert answer.header("content-length") == str(len(answer.body)) and answer.header("retry-after") == "3"


@pytest.mark.parametrize("line", [None, {"status_code": None, "exception_type": "ConnectError"}, {"status_code": 99}, {"status_code": True}])
def test_a_call_without_an_http_answer_cannot_be_replayed(line: Any) -> None:
    with pytest.raises(ReplayAnswerError):
        answer_from_line(line)


def test_the_guard_covers_named_hosts_and_recorded_servers_but_not_every_local_port() -> None:
    guarded = guarded_addresses(
        [("api.openai.com", None), ("127.0.0.1", None), ("localhost", 11434)],
        recorded_servers([{"server": {"address": "127.0.0.1", "port": 8123}}, {"server": "junk"}, "junk"]),
    )
    assert guarded == {("api.openai.com", None), ("localhost", 11434), ("127.0.0.1", 8123)}


def test_the_guard_refuses_a_guarded_connect_and_lookup_and_lets_others_through() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        open_port = listener.getsockname()[1]
        with socket.socket() as other:
            other.bind(("127.0.0.1", 0))
            other.listen()
            guarded_port = other.getsockname()[1]
            guard = NetworkGuard({("127.0.0.1", guarded_port), ("api.openai.com", None)})
            guard.install()
            try:
                with socket.socket() as client, pytest.raises(ReplayNetworkBlocked):
                    client.connect(("127.0.0.1", guarded_port))
                with socket.socket() as client:
                    assert client.connect_ex(("127.0.0.1", open_port)) == 0  # not guarded: connects
                with pytest.raises(ConnectionRefusedError):  # refused before any DNS lookup
                    socket.getaddrinfo("api.openai.com", 443)
                with pytest.raises(ReplayNetworkBlocked):
                    socket.create_connection(("127.0.0.1", guarded_port), timeout=1)
            finally:
                guard.remove()
            assert guard.attempts == [("127.0.0.1", guarded_port), ("api.openai.com", 443), ("127.0.0.1", guarded_port)]
            with socket.create_connection(("127.0.0.1", guarded_port), timeout=1):
                pass  # removed: connects again
