"""Content decoding with a bound: undo gzip, deflate, br and zstd without ever growing past a limit.

An upstream's compressed body is hostile input: a 1 MB gzip bomb inflates to gigabytes. Every
decoder here works incrementally and asks for at most the bytes still allowed, so memory never
exceeds the limit (plus one decoder's window); past it decoding stops with `DecodedTooLarge` and
the record keeps the raw bytes instead (see `records.raw_line_from_exchange`).

Usage::

    body = decode_content(raw, "gzip", limit=64 * 1024 * 1024)
"""

from __future__ import annotations

import functools
import importlib
import io
import zlib
from typing import Any

from ..errors import LlmtapError

__all__ = ["DEFAULT_MAX_DECODED_BYTES", "DecodedTooLarge", "UndecodableContent", "decode_content"]

# The default bound on a decoded body: far above any real model response, far below a bomb.
DEFAULT_MAX_DECODED_BYTES = 64 * 1024 * 1024

# How much compressed input each decoding step takes, and the most output one step asks for.
_STEP = 64 * 1024
_OUTPUT_STEP = 1024 * 1024


class UndecodableContent(LlmtapError, ValueError):
    """Raised when a body's content coding is unknown, its decoder is missing, or its bytes are corrupt."""


class DecodedTooLarge(UndecodableContent):
    """Raised when decoding a body would pass the configured limit; `limit` holds that limit in bytes."""

    def __init__(self, coding: str, limit: int) -> None:
        super().__init__(f"Decoding a {coding} body would pass the limit of {limit} bytes; the raw bytes are kept.")
        self.coding = coding
        self.limit = limit


def decode_content(body: bytes, encoding: str, *, limit: int = DEFAULT_MAX_DECODED_BYTES) -> bytes:
    """Undo a response's content codings, last applied first (`gzip, br` was gzipped, then brotli'd).

    Each stage may produce at most `limit` bytes, else `DecodedTooLarge`; an unknown coding, a
    missing decoder module or corrupt bytes raise `UndecodableContent`. Pure CPU: call it off the
    event loop for a large body.
    """
    if not encoding:  # nearly every response
        return body
    for coding in reversed([part.strip().lower() for part in encoding.split(",")]):
        if body and coding not in ("", "identity"):
            body = _decode_one(body, coding, limit)
    return body


def _decode_one(body: bytes, coding: str, limit: int) -> bytes:
    try:
        if coding in ("gzip", "x-gzip"):
            return _zlib(body, 16 + zlib.MAX_WBITS, coding, limit)
        if coding == "deflate":
            try:
                return _zlib(body, zlib.MAX_WBITS, coding, limit)
            except zlib.error:  # servers often send raw deflate without the zlib wrapper
                return _zlib(body, -zlib.MAX_WBITS, coding, limit)
        if coding == "br":
            return _brotli(body, limit)
        if coding == "zstd":
            return _zstd(body, limit)
    except UndecodableContent:
        raise
    except Exception as exc:  # each library has its own error type
        raise UndecodableContent(f"A {coding} body could not be decoded ({type(exc).__name__}).") from exc
    raise UndecodableContent(f"The content-encoding {coding!r} is not one llmtap decodes.")


def _zlib(body: bytes, wbits: int, coding: str, limit: int) -> bytes:
    decoder = zlib.decompressobj(wbits)
    out = bytearray()
    pending: bytes | memoryview = memoryview(body)
    while not decoder.eof:
        # At most a step, and one byte more than the room left: getting it proves the body too large.
        step = min(_OUTPUT_STEP, limit - len(out) + 1)
        piece = decoder.decompress(pending, step)
        out += piece
        if len(out) > limit:
            raise DecodedTooLarge(coding, limit)
        pending = decoder.unconsumed_tail
        if not pending and len(piece) < step:
            break  # the input is used up and no output is held back: a body cut short ends here
    return bytes(out)


def _brotli(body: bytes, limit: int) -> bytes:
    brotli = _optional_module("brotli")
    if brotli is None or not hasattr(brotli.Decompressor, "can_accept_more_data"):
        # brotlicffi and brotli before 1.2 cannot cap their output, so they are not used at all.
        raise UndecodableContent("A br body needs brotli 1.2 or later to be decoded within a limit.")
    decoder = brotli.Decompressor()
    out = bytearray()
    view = memoryview(body)
    position = 0
    while not decoder.is_finished():
        chunk: bytes | memoryview
        if decoder.can_accept_more_data():
            if position >= len(view):
                break  # input ended before the stream did: a truncated body
            chunk, position = view[position : position + _STEP], position + _STEP
        else:
            chunk = b""
        # Asked for little at a time: brotli may return up to twice the output limit it is given.
        out += decoder.process(chunk, output_buffer_limit=min(_OUTPUT_STEP, limit - len(out) + 1))
        if len(out) > limit:
            raise DecodedTooLarge("br", limit)
    if not decoder.is_finished():
        raise UndecodableContent("A br body ended before its stream did.")
    return bytes(out)


def _zstd(body: bytes, limit: int) -> bytes:
    zstandard = _optional_module("zstandard")
    if zstandard is None:
        raise UndecodableContent("A zstd body needs the zstandard module to be decoded.")
    out = bytearray()
    # A stream reader yields at most what is asked for, whatever the frame header claims.
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body), read_across_frames=True) as reader:
        while True:
            piece = reader.read(min(_OUTPUT_STEP, limit - len(out) + 1))
            if not piece:
                break
            out += piece
            if len(out) > limit:
                raise DecodedTooLarge("zstd", limit)
    return bytes(out)


@functools.cache  # a module that is not installed would otherwise be searched for on every response
def _optional_module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
