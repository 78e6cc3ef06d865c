"""Bounded content decoding: every coding round-trips under the limit and stops just past it."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib

import brotli
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtap.records.content_coding import DecodedTooLarge, UndecodableContent, decode_content
from tests.support.faults import bomb

ENCODERS = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "raw-deflate": lambda data: zlib.compress(data)[2:-4],  # what some servers send as `deflate`
    "br": brotli.compress,
    "zstd": lambda data: zstandard.ZstdCompressor().compress(data),
}


def _wire_name(coding: str) -> str:
    return "deflate" if coding == "raw-deflate" else coding


@settings(max_examples=60, deadline=None)
@given(body=st.binary(max_size=5000), coding=st.sampled_from(sorted(ENCODERS)))
def test_every_coding_decodes_back_to_its_bytes_within_the_limit(body: bytes, coding: str) -> None:
    encoded = ENCODERS[coding](body)
    assert decode_content(encoded, _wire_name(coding), limit=max(len(body), 1)) == body


@settings(max_examples=60, deadline=None)
@given(body=st.binary(min_size=2, max_size=5000), coding=st.sampled_from(sorted(ENCODERS)))
def test_one_byte_over_the_limit_is_refused_and_says_the_limit(body: bytes, coding: str) -> None:
    with pytest.raises(DecodedTooLarge) as refused:
        decode_content(ENCODERS[coding](body), _wire_name(coding), limit=len(body) - 1)
    assert refused.value.limit == len(body) - 1


def test_stacked_codings_are_undone_last_first() -> None:
    body = b'{"id": "x"}' * 50
    assert decode_content(brotli.compress(gzip.compress(body)), "gzip, br", limit=len(body)) == body


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
def test_decoding_a_bomb_never_holds_much_more_than_the_limit(coding: str) -> None:
    compressed = bomb(coding, 64)
    limit = 2 * 1024 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(DecodedTooLarge):
            decode_content(compressed, coding, limit=limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2.5 * limit, f"peak {peak} bytes for a limit of {limit}"


@pytest.mark.parametrize(
    ("body", "coding"),
    [(b"not compressed", "gzip"), (b"\x00\x01", "br"), (brotli.compress(b"x" * 1000)[:-3], "br"),
     (b"garbage", "zstd"), (b"abc", "compress")],
)
def test_corrupt_truncated_or_unknown_bodies_raise_one_error_type(body: bytes, coding: str) -> None:
    with pytest.raises(UndecodableContent):
        decode_content(body, coding, limit=1024)


def test_identity_and_no_coding_return_the_body_itself() -> None:
    body = b"plain"
    assert decode_content(body, "", limit=1) is body
    assert decode_content(body, "identity", limit=1) is body
