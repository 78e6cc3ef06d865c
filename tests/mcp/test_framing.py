"""Bounded framing: however the bytes are split, the same lines and events come out, and none over the bound."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from llmtap.mcp.framing import (
    FramingStats,
    LineFramer,
    OversizedMessage,
    SSEFramer,
    decode_messages,
    oversized_response_id,
)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(cut, len(data)) for cut in cuts})
    pieces, start = [], 0
    for point in points:
        pieces.append(data[start:point])
        start = point
    pieces.append(data[start:])
    return pieces


lines_strategy = st.lists(st.binary(max_size=60).map(lambda b: b.replace(b"\n", b"")), max_size=12)


@given(lines_strategy, st.lists(st.integers(min_value=0, max_value=800), max_size=10))
def test_any_split_of_a_stream_gives_the_same_lines(lines: list[bytes], cuts: list[int]) -> None:
    data = b"".join(line + b"\n" for line in lines)
    framer = LineFramer(max_bytes=1 << 20)
    out: list[bytes | OversizedMessage] = []
    for piece in _split(data, cuts):
        out += framer.feed(piece)
    assert framer.close() is None
    assert out == [line[:-1] if line.endswith(b"\r") else line for line in lines]


@given(
    st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=8),
    st.lists(st.integers(min_value=0, max_value=3000), max_size=10),
)
def test_lines_over_the_bound_come_out_as_their_prefix_and_full_size(sizes: list[int], cuts: list[int]) -> None:
    lines = [bytes([65 + index % 26]) * size for index, size in enumerate(sizes)]
    data = b"".join(line + b"\n" for line in lines)
    framer = LineFramer(max_bytes=100, prefix_bytes=10)
    out: list[bytes | OversizedMessage] = []
    for piece in _split(data, cuts):
        out += framer.feed(piece)
        assert framer._pending <= 100  # never holds more than the bound
    expected = [line if len(line) <= 100 else OversizedMessage(line[:10], len(line)) for line in lines]
    assert out == expected
    assert framer.stats.oversized == sum(1 for line in lines if len(line) > 100)


def test_an_unterminated_last_line_is_returned_by_close() -> None:
    framer = LineFramer()
    assert framer.feed(b'{"a":1}\n{"b"') == [b'{"a":1}']
    assert framer.close() == b'{"b"'


def _sse(datas: list[str]) -> bytes:
    return b"".join(b"event: message\ndata: " + data.encode() + b"\n\n" for data in datas)


@given(
    st.lists(st.text(alphabet='abc{}:" ', max_size=40).filter(bool), max_size=8),
    st.lists(st.integers(min_value=0, max_value=600), max_size=10),
)
def test_any_split_of_an_event_stream_gives_the_same_events(datas: list[str], cuts: list[int]) -> None:
    framer = SSEFramer(max_bytes=1 << 20)
    out: list[str | OversizedMessage] = []
    for piece in _split(_sse(datas), cuts):
        out += framer.feed(piece)
    out += framer.close()
    assert out == datas


def test_an_event_over_the_bound_is_dropped_and_decoding_resumes_after_it() -> None:
    framer = SSEFramer(max_bytes=64)
    stream = _sse(["small", "x" * 500, "after"])
    out: list[str | OversizedMessage] = []
    for index in range(0, len(stream), 16):
        out += framer.feed(stream[index : index + 16])
    out += framer.close()
    assert out[0] == "small" and out[-1] == "after"
    assert len(out) == 3 and isinstance(out[1], OversizedMessage) and out[1].size > 500


def test_decode_counts_what_is_not_json_rpc() -> None:
    stats = FramingStats()
    assert decode_messages(b"not json", stats) == []
    assert decode_messages(b'{"id": 1}', stats) == []
    assert decode_messages(b"   ", stats) == []
    batch = decode_messages(json.dumps([{"jsonrpc": "2.0", "id": 1, "method": "ping"}, 3]), stats)
    assert batch == [{"jsonrpc": "2.0", "id": 1, "method": "ping"}]
    assert (stats.malformed, stats.messages) == (3, 1)


def test_the_id_of_an_oversized_response_is_read_only_where_sdks_put_it() -> None:
    assert oversized_response_id(b'{"jsonrpc":"2.0","id":7,"result":{"content":[') == (7, "result")
    assert oversized_response_id(b'{"id":"a\\"b","error":{"code":') == ('a"b', "error")
    # An "id" inside the result is never taken for the response's id.
    assert oversized_response_id(b'{"jsonrpc":"2.0","result":{"id":7,"content"') is None
    assert oversized_response_id(b'{"jsonrpc":"2.0","id":true,"result":{}') is None
