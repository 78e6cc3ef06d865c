"""Writing a line's parsed JSON response back as the exact bytes the model server sent.

A persisted line keeps a JSON response as the parsed object (`response`), which is what readers,
redaction and the reference system's tools read; the original whitespace and escapes are gone.
A replay must still send the body byte for byte, so the line also keeps a check of the bytes:
`response_body_crc32`, the CRC-32 of the decoded body. Computing it costs capture one pass of
zlib's CRC over the body, where finding the encoding at capture time would cost a full
re-encoding of every response.

The replay then re-encodes the object in the layouts servers use and sends the one whose CRC
matches: orjson's compact form (Anthropic, vLLM, llama.cpp), two-space indented (OpenAI's
API), Python's `json.dumps` with ASCII escapes or without, indented, compact or with its default
separators, and Go's four-space form with its HTML-safe escapes (OpenAI's error bodies), each
with or without a final newline. A body none of them gives back (another server's own spacing
or float forms) is sent compactly, the same JSON value in the same key order, and the replay
says so (`exact` is False). Lines without the check (older ones, another tool's) are sent
compactly too. The line is untrusted input: a forged check can only pick among
encodings of the line's own object.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from typing import Any

import orjson

__all__ = ["body_check", "check_in_layout", "encode_as_recorded", "layout_matching"]

_GO_ESCAPES = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))


def _go_indented(value: Any) -> bytes:
    """Go's `encoding/json` MarshalIndent with four spaces (OpenAI's error bodies): `<`, `>`, `&`,
    U+2028 and U+2029 escaped. They occur only inside strings, so replacing them keeps the value."""
    text = json.dumps(value, indent=4, ensure_ascii=False)
    for character, escaped in _GO_ESCAPES:
        text = text.replace(character, escaped)
    return text.encode("utf-8")


# The encodings replay tries, most common first. Each is a function of the value alone.
_LAYOUTS: tuple[Callable[[Any], bytes], ...] = (
    orjson.dumps,
    lambda value: orjson.dumps(value, option=orjson.OPT_INDENT_2),
    lambda value: json.dumps(value, indent=2).encode("utf-8"),
    lambda value: json.dumps(value, indent=2, ensure_ascii=False).encode("utf-8"),
    lambda value: json.dumps(value).encode("utf-8"),
    lambda value: json.dumps(value, ensure_ascii=False).encode("utf-8"),
    lambda value: json.dumps(value, separators=(",", ":")).encode("utf-8"),
    _go_indented,
)


def body_check(body: bytes) -> int:
    """The check a line stores for its decoded JSON response body (`response_body_crc32`)."""
    return zlib.crc32(body)


def _match(value: Any, check: Any) -> tuple[int, bool, bytes] | None:
    if type(check) is not int or not 0 <= check < 2**32:
        return None
    for index, layout in enumerate(_LAYOUTS):
        try:
            written = layout(value)
        except (TypeError, ValueError, RecursionError):
            continue
        crc = zlib.crc32(written)
        if crc == check:
            return index, False, written
        if zlib.crc32(b"\n", crc) == check:
            return index, True, written + b"\n"
    return None


def layout_matching(value: Any, check: Any) -> tuple[int, bool] | None:
    """The layout (its index, and whether a final newline follows) that writes `value` with this check, or None."""
    found = _match(value, check)
    return None if found is None else found[:2]


def check_in_layout(value: Any, layout: tuple[int, bool]) -> int | None:
    """The check of `value` written in `layout` (as `layout_matching` gave it); None when it cannot be written so.

    Redaction uses it: a redacted response keeps its server's layout, so a replay still finds it.
    """
    index, newline = layout
    try:
        written = _LAYOUTS[index](value)
    except (TypeError, ValueError, RecursionError):
        return None
    return body_check(written + b"\n" if newline else written)


def encode_as_recorded(value: Any, check: Any) -> tuple[bytes, bool]:
    """Return (`value` encoded as the recorded body, True) when a layout matches `check`, else (compact, False).

    A 32-bit check picks among a dozen encodings of one value: a wrong pick by collision has odds
    of about one in 400 million, and would still be the recorded value.
    """
    found = _match(value, check)
    return (orjson.dumps(value), False) if found is None else (found[2], True)
