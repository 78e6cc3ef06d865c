"""Spool frames: round trips, torn and damaged tails, garbage, credential headers, and rebuilt calls."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtap.dialects import get_dialect
from llmtap.exchange import SECRET_HEADERS, Exchange
from llmtap.records import raw_line_from_exchange
from llmtap.spool.frame import (
    credential_free,
    decode_call,
    encode_call,
    encode_frame,
    encode_meta,
    scan_frames,
)
from tests.fixtures import RecordedExchange, all_fixtures
from tests.records.test_line import exchange_from

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
_FRAMES = st.lists(
    st.tuples(st.sampled_from([1, 2, 3]), st.dictionaries(st.text(max_size=8), _JSON, max_size=5), st.binary(max_size=300), st.binary(max_size=300)),
    min_size=1,
    max_size=6,
)


def _frame_bytes(kind: int, meta: dict[str, Any], request: bytes = b"", response: bytes = b"") -> bytes:
    return b"".join(encode_frame(kind, encode_meta(meta), request, response))


def _exchange(recorded: RecordedExchange, pieces: int = 3, secret: str = "sk-live-secret") -> tuple[Exchange, list[tuple[bytes, bytes]]]:
    """A finished in-process call of a recorded exchange, its body arriving in `pieces` chunks,
    and the response headers its hook saw (a credential among them)."""
    exchange = exchange_from(recorded, pieces=pieces)
    exchange.model_call_id = None  # a hook's call has none until its record is built
    exchange.response_headers = {}  # a hook hands its headers to `encode_call` apart
    exchange.provider = "openai"
    exchange.extra["operation"] = "chat"
    exchange.extra["capture"] = {"point": "in-process", "hook": "httpx", "pid": 1}
    response_headers = [(b"content-type", recorded.content_type.encode()), (b"set-cookie", secret.encode())]
    return exchange, response_headers


@settings(max_examples=200, deadline=None)
@given(frames=_FRAMES)
def test_frames_round_trip_whatever_their_metadata_and_bytes(frames: list[tuple[int, dict[str, Any], bytes, bytes]]) -> None:
    data = b"".join(_frame_bytes(*frame) for frame in frames)
    result = scan_frames(data, final=True)
    assert [(f.kind, f.meta, f.request, f.response) for f in result.frames] == frames
    assert result.damaged == [] and result.consumed == len(data)


@settings(max_examples=200, deadline=None)
@given(frames=_FRAMES, data=st.data())
def test_a_torn_last_frame_waits_while_live_and_is_counted_at_the_end(frames: list[Any], data: st.DataObject) -> None:
    whole = [_frame_bytes(*frame) for frame in frames]
    cut = data.draw(st.integers(1, len(whole[-1]) - 1))
    spooled = b"".join(whole[:-1]) + whole[-1][:cut]

    live = scan_frames(spooled, final=False)
    final = scan_frames(spooled, final=True)

    assert len(live.frames) == len(frames) - 1 and live.damaged == []
    assert live.consumed == len(spooled) - cut  # the torn frame is left for a later pass
    assert len(final.frames) == len(frames) - 1
    assert len(final.damaged) == 1 and final.consumed == len(spooled)


@settings(max_examples=300, deadline=None)
@given(frames=_FRAMES, data=st.data())
def test_a_damaged_byte_costs_only_its_own_frame_and_never_raises(frames: list[Any], data: st.DataObject) -> None:
    whole = [_frame_bytes(*frame) for frame in frames]
    victim = data.draw(st.integers(0, len(whole) - 1))
    position = data.draw(st.integers(0, len(whole[victim]) - 1))
    flip = data.draw(st.integers(1, 255))
    damaged = bytearray(whole[victim])
    damaged[position] ^= flip
    spooled = b"".join(whole[:victim]) + bytes(damaged) + b"".join(whole[victim + 1 :])

    result = scan_frames(spooled, final=True)

    expected = [frame for index, frame in enumerate(frames) if index != victim]
    assert [(f.kind, f.meta, f.request, f.response) for f in result.frames] == expected
    assert len(result.damaged) == 1


@settings(max_examples=300, deadline=None)
@given(frames=_FRAMES, data=st.data())
def test_reading_as_the_bytes_arrive_finds_what_reading_them_at_the_end_finds(frames: list[Any], data: st.DataObject) -> None:
    spooled = bytearray(b"".join(_frame_bytes(*frame) for frame in frames))
    if data.draw(st.booleans()):  # sometimes with a damaged byte, sometimes with a torn end
        spooled[data.draw(st.integers(0, len(spooled) - 1))] ^= data.draw(st.integers(1, 255))
    if data.draw(st.booleans()):
        del spooled[data.draw(st.integers(1, len(spooled))) :]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(spooled)), max_size=8)))

    buffer, found, damaged, start = bytearray(), [], 0, 0
    for cut in [*cuts, len(spooled)]:
        buffer += spooled[start:cut]
        start = max(start, cut)
        live = scan_frames(buffer, final=False)
        found += live.frames
        damaged += len(live.damaged)
        del buffer[: live.consumed]
    last = scan_frames(buffer, final=True)
    whole = scan_frames(bytes(spooled), final=True)

    assert found + last.frames == whole.frames
    assert damaged + len(last.damaged) == len(whole.damaged)


@settings(max_examples=100, deadline=None)
@given(garbage=st.binary(max_size=2000), final=st.booleans())
def test_garbage_never_raises(garbage: bytes, final: bool) -> None:
    result = scan_frames(garbage, final=final)
    assert 0 <= result.consumed <= len(garbage)


_WIRE_NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=20)


@settings(max_examples=200, deadline=None)
@given(
    secret_name=st.sampled_from(sorted(SECRET_HEADERS)).map(lambda name: name.title()) | _WIRE_NAMES.map(lambda name: name + "-token"),
    others=st.lists(st.tuples(_WIRE_NAMES, st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789 /.", max_size=20))),
    as_bytes=st.booleans(),
)
def test_credential_headers_never_reach_the_frame(secret_name: str, others: list[tuple[str, str]], as_bytes: bool) -> None:
    secret = "SECRET-VALUE-0123456789"
    pairs: list[Any] = [*others, (secret_name, secret)]
    if as_bytes:
        pairs = [(name.encode(), value.encode()) for name, value in pairs]
    exchange = Exchange(method="POST", path="/v1/chat/completions", request_body=b"{}")
    exchange.finish()

    frame = b"".join(encode_call(exchange, dialect="chat", request_headers=pairs, response_headers=pairs, body_decoded=False))

    assert secret.encode() not in frame
    kept = credential_free(pairs)
    assert kept is not None and all(value != secret for _, value in kept)


_RECORDED = [recorded for recorded in all_fixtures() if recorded.dialect in ("chat", "responses", "messages")]


@settings(max_examples=120, deadline=None)
@given(recorded=st.sampled_from(_RECORDED), pieces=st.integers(1, 30), decoded=st.booleans())
def test_a_call_rebuilt_from_its_frame_gives_the_same_record_as_built_in_process(
    recorded: RecordedExchange, pieces: int, decoded: bool
) -> None:
    exchange, response_headers = _exchange(recorded, pieces)
    request_headers = [(b"content-type", b"application/json"), (b"authorization", b"Bearer sk-live-secret")]
    frame = b"".join(
        encode_call(exchange, dialect=recorded.dialect, request_headers=request_headers, response_headers=response_headers, body_decoded=decoded)
    )
    (read,) = scan_frames(frame, final=True).frames
    rebuilt, dialect = decode_call(read)

    from llmtap.exchange import safe_headers

    exchange.request_headers = safe_headers(request_headers)
    exchange.response_headers = safe_headers(response_headers)
    exchange.model_call_id = rebuilt.model_call_id = "fixed"
    direct = raw_line_from_exchange(exchange, dialect=get_dialect(recorded.dialect))
    via_spool = raw_line_from_exchange(rebuilt, dialect=get_dialect(dialect) if dialect else None)
    assert via_spool == direct
    assert b"sk-live-secret" not in frame


class _HTTPStatusError(Exception):
    def __init__(self) -> None:
        super().__init__("the prompt must never be stored")
        self.status_code = 429


@pytest.mark.parametrize(
    "error",
    [TimeoutError("slow"), ConnectionResetError("gone"), _HTTPStatusError(), ValueError("odd")],
    ids=["timeout", "connection", "status", "other"],
)
def test_an_exception_is_rebuilt_with_its_category_status_and_type_but_no_message(error: Exception) -> None:
    exchange = Exchange(method="POST", path="/v1/chat/completions", request_body=b"{}")
    try:
        raise error from KeyError("cause")
    except Exception as raised:
        exchange.exception = raised
    exchange.finish()
    frame = b"".join(encode_call(exchange, dialect="chat", request_headers=None, response_headers=None, body_decoded=False))
    (read,) = scan_frames(frame, final=True).frames
    rebuilt, _ = decode_call(read)

    exchange.model_call_id = rebuilt.model_call_id = "fixed"
    assert raw_line_from_exchange(rebuilt) == raw_line_from_exchange(exchange)
    assert b"must never be stored" not in frame and b"slow" not in frame
