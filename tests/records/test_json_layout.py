"""A parsed JSON response goes back out as the exact bytes the server sent, found by the line's CRC of them."""

from __future__ import annotations

import json
import zlib

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtap.records.json_layout import body_check, encode_as_recorded

_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | _TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_TEXT, children, max_size=4),
    max_leaves=20,
)
_OBJECTS = st.dictionaries(_TEXT, _VALUES, min_size=1, max_size=5)

# What real servers send, and the encoders that write it.
_SERVERS = {
    "anthropic (orjson compact)": lambda value: orjson.dumps(value),
    "openai (two-space indent, newline)": lambda value: orjson.dumps(value, option=orjson.OPT_INDENT_2) + b"\n",
    "python json.dumps indent 2, ASCII": lambda value: json.dumps(value, indent=2).encode(),
    "python json.dumps default": lambda value: json.dumps(value, ensure_ascii=False).encode() + b"\n",
    "fastapi (compact, raw UTF-8)": lambda value: json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode(),
}


@settings(max_examples=150, deadline=None)
@given(value=_OBJECTS, server=st.sampled_from(sorted(_SERVERS)))
def test_every_known_server_encoding_comes_back_byte_for_byte(value: dict, server: str) -> None:
    body = _SERVERS[server](value)
    parsed = orjson.loads(body)
    assert encode_as_recorded(parsed, body_check(body)) == (body, True)


def test_a_body_no_layout_reproduces_comes_back_as_the_same_value_and_says_so() -> None:
    body = b'{ "a" :1.50,\t"b":[ ] }'
    parsed = orjson.loads(body)
    written, exact = encode_as_recorded(parsed, body_check(body))
    assert exact is False
    assert orjson.loads(written) == parsed and written == b'{"a":1.5,"b":[]}'


def test_go_html_safe_escapes_are_reproduced() -> None:
    body = b'{\n    "error": {\n        "message": "bad key \\u003csk-***\\u003e \\u0026 more"\n    }\n}\n'
    assert encode_as_recorded(orjson.loads(body), body_check(body)) == (body, True)


def test_a_missing_or_forged_check_gives_the_compact_value() -> None:
    value = {"id": "x", "n": [1, 2]}
    for check in (None, "804:1", [2, zlib.crc32(orjson.dumps(value))], -1, True, 2**40, zlib.crc32(b"other")):
        assert encode_as_recorded(value, check) == (orjson.dumps(value), False)


def test_the_check_is_zlib_crc32() -> None:
    assert body_check(b"{}") == zlib.crc32(b"{}")
