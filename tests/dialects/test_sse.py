"""SSE decoding: line ends, fields, comments, end of stream, and chunk-split invariance."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llmtap.dialects.sse import SSEDecoder, SSEEvent, decode_sse
from tests.fixtures import all_fixtures


def feed_in_pieces(body: bytes, cuts: list[int]) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    start = 0
    for cut in sorted(set(cuts)):
        events += decoder.feed(body[start:cut])
        start = cut
    events += decoder.feed(body[start:])
    return events + decoder.close()


def test_lf_crlf_and_cr_line_ends_give_the_same_events() -> None:
    lf = b"event: a\ndata: 1\n\ndata: 2\n\n"
    expected = [SSEEvent("a", "1"), SSEEvent(None, "2")]
    assert decode_sse(lf) == expected
    assert decode_sse(lf.replace(b"\n", b"\r\n")) == expected
    assert decode_sse(lf.replace(b"\n", b"\r")) == expected


def test_crlf_split_between_chunks_is_one_line_end() -> None:
    decoder = SSEDecoder()
    events = decoder.feed(b"data: x\r") + decoder.feed(b"\n\r") + decoder.feed(b"\ndata: y\r\n\r\n")
    assert events == [SSEEvent(None, "x"), SSEEvent(None, "y")]


def test_multi_line_data_is_joined_with_newlines() -> None:
    assert decode_sse(b"data: one\ndata:two\ndata:  three\n\n") == [SSEEvent(None, "one\ntwo\n three")]


def test_comments_and_unknown_fields_are_ignored() -> None:
    assert decode_sse(b": keep-alive\n\n:comment\nfoo: bar\ndata: d\n\n") == [SSEEvent(None, "d")]


def test_id_persists_and_retry_is_parsed() -> None:
    events = decode_sse(b"id: 7\nretry: 1500\ndata: a\n\ndata: b\n\n")
    assert events == [SSEEvent(None, "a", "7", 1500), SSEEvent(None, "b", "7", None)]


def test_field_without_colon_has_empty_value() -> None:
    assert decode_sse(b"data\n\n") == [SSEEvent(None, "")]


def test_final_event_without_blank_line_is_delivered_at_close() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: [DONE]") == []
    assert decoder.has_pending
    assert decoder.close() == [SSEEvent(None, "[DONE]")]
    assert decoder.close() == []


def test_event_name_without_data_is_still_an_event() -> None:
    assert decode_sse(b"event: ping\n\n") == [SSEEvent("ping", "")]


def test_invalid_utf8_is_replaced_not_raised() -> None:
    assert decode_sse(b"data: \xff\xfe\n\n") == [SSEEvent(None, "\ufffd\ufffd")]


_streams = [f.body_bytes for f in all_fixtures() if f.is_stream]


@settings(max_examples=200, deadline=None)
@given(
    body=st.sampled_from(_streams),
    cuts=st.lists(st.integers(min_value=0, max_value=200_000), max_size=40),
    line_end=st.sampled_from([b"\n", b"\r\n", b"\r"]),
)
def test_any_split_of_a_recorded_stream_gives_the_same_events(body: bytes, cuts: list[int], line_end: bytes) -> None:
    body = body.replace(b"\r\n", b"\n").replace(b"\n", line_end)
    cuts = [cut % (len(body) + 1) for cut in cuts]
    assert feed_in_pieces(body, cuts) == decode_sse(body)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000), st.lists(st.integers(min_value=0, max_value=2000), max_size=10))
def test_arbitrary_bytes_never_raise_and_split_invariantly(body: bytes, cuts: list[int]) -> None:
    cuts = [cut % (len(body) + 1) for cut in cuts]
    assert feed_in_pieces(body, cuts) == decode_sse(body)


def feed_byte_by_byte(body: bytes) -> list[SSEEvent]:
    """The line-by-line path only: a one-byte chunk never holds a whole event."""
    return feed_in_pieces(body, list(range(len(body) + 1)))


_line_bytes = st.binary(max_size=12).filter(lambda value: b"\n" not in value and b"\r" not in value)
_lines = st.one_of(
    st.builds(lambda value: b"data: " + value, _line_bytes),
    st.builds(lambda value: b"event: " + value, _line_bytes),
    st.sampled_from([b"data:", b"data:  x", b"data", b"event:x", b"id: 7", b"id: a\x00b", b"retry: 10", b": note", b""]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_lines, max_size=3), max_size=8), st.integers(min_value=0, max_value=2))
def test_whole_event_chunks_decode_as_the_line_by_line_path_does(events: list[list[bytes]], extra_blank: int) -> None:
    """Chunks of whole LF-ended events take a shortcut; it must give exactly the general path's events."""
    chunks = [b"\n".join(lines) + b"\n\n" + b"\n" * extra_blank for lines in events]
    decoder = SSEDecoder()
    fast = [event for chunk in chunks for event in decoder.feed(chunk)] + decoder.close()
    assert fast == feed_byte_by_byte(b"".join(chunks))
