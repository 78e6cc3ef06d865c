"""The content fingerprint, version 2, byte for byte (specs/content-fingerprint.md).

Each vector writes out the exact bytes the page's definition feeds SHA-256: the 16-byte domain
`nemo-gym-lineage`, then per field one tag byte, the UTF-8 length as 8 big-endian bytes and the
bytes. The expected digest is computed here with hashlib from those literal bytes, so a vector
documents its rule and does not reuse the code under test.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtap.errors import LlmtapError
from llmtap.records.fingerprint import (
    FINGERPRINT_VERSION,
    FieldMemo,
    UnreadableContent,
    canonical_arguments,
    canonical_json,
    continuation_fingerprint,
    fingerprint,
    output_fingerprint,
    version_counts,
)

DOMAIN = b"nemo-gym-lineage"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- vectors: (items, the exact bytes hashed) ------------------------------------------------------

VECTORS: dict[str, tuple[list[Any], bytes]] = {
    "a string content is one text part": (
        [{"role": "assistant", "content": "hi"}],
        (
            b"nemo-gym-lineage"
            b"\x00" b"\x00\x00\x00\x00\x00\x00\x00\x04" b"text"
            b"\x01" b"\x00\x00\x00\x00\x00\x00\x00\x02" b"hi"
        ),
    ),
    "text, input_text, output_text and untyped parts are text; empty ones and other keys drop": (
        [
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_never_hashed",
                "content": [
                    {"type": "output_text", "text": "a", "annotations": [{"url": "x"}], "logprobs": []},
                    {"type": "input_text", "text": ""},
                    "b",
                    "",
                    {"text": "c"},
                ],
            }
        ],
        (
            b"nemo-gym-lineage"
            b"\x00" b"\x00\x00\x00\x00\x00\x00\x00\x04" b"text" b"\x01" b"\x00\x00\x00\x00\x00\x00\x00\x01" b"a"
            b"\x00" b"\x00\x00\x00\x00\x00\x00\x00\x04" b"text" b"\x01" b"\x00\x00\x00\x00\x00\x00\x00\x01" b"b"
            b"\x00" b"\x00\x00\x00\x00\x00\x00\x00\x04" b"text" b"\x01" b"\x00\x00\x00\x00\x00\x00\x00\x01" b"c"
        ),
    ),
    "a refusal block is its type and its canonical JSON": (
        [{"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}],
        (
            b"nemo-gym-lineage"
            b"\x00" b"\x00\x00\x00\x00\x00\x00\x00\x07" b"refusal"
            b"\x01" b"\x00\x00\x00\x00\x00\x00\x00\x21" b'{"refusal":"no","type":"refusal"}'
        ),
    ),
    "a text block whose text is not a string is an other-type block": (
        [{"role": "assistant", "content": [{"type": "text", "text": 5}]}],
        (
            b"nemo-gym-lineage"
            b"\x00" b"\x00\x00\x00\x00\x00\x00\x00\x04" b"text"
            b"\x01" b"\x00\x00\x00\x00\x00\x00\x00\x18" b'{"text":5,"type":"text"}'
        ),
    ),
    "chat tool_calls: id, name, canonical arguments, after the content": (
        [
            {
                "role": "assistant",
                "content": "ok",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"b": 1, "a": 2}'}}
                ],
            }
        ],
        (
            b"nemo-gym-lineage"
            b"\x00" b"\x00\x00\x00\x00\x00\x00\x00\x04" b"text" b"\x01" b"\x00\x00\x00\x00\x00\x00\x00\x02" b"ok"
            b"\x02" b"\x00\x00\x00\x00\x00\x00\x00\x06" b"call_1"
            b"\x03" b"\x00\x00\x00\x00\x00\x00\x00\x03" b"add"
            b"\x04" b"\x00\x00\x00\x00\x00\x00\x00\x0d" b'{"a":2,"b":1}'
        ),
    ),
    "Anthropic tool_use blocks are tool calls, read after the text parts": (
        [
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"b": 1, "a": 2}},
                    {"type": "text", "text": "ok", "citations": None},
                ],
            }
        ],
        (
            b"nemo-gym-lineage"
            b"\x00" b"\x00\x00\x00\x00\x00\x00\x00\x04" b"text" b"\x01" b"\x00\x00\x00\x00\x00\x00\x00\x02" b"ok"
            b"\x02" b"\x00\x00\x00\x00\x00\x00\x00\x07" b"toolu_1"
            b"\x03" b"\x00\x00\x00\x00\x00\x00\x00\x03" b"add"
            b"\x04" b"\x00\x00\x00\x00\x00\x00\x00\x0d" b'{"a":2,"b":1}'
        ),
    ),
    "a namespaced function call hashes namespace__name; call_id is its id": (
        [{"type": "function_call", "id": "fc_x", "call_id": "c", "namespace": "ns", "name": "add", "arguments": "{}"}],
        (
            b"nemo-gym-lineage"
            b"\x02" b"\x00\x00\x00\x00\x00\x00\x00\x01" b"c"
            b"\x03" b"\x00\x00\x00\x00\x00\x00\x00\x07" b"ns__add"
            b"\x04" b"\x00\x00\x00\x00\x00\x00\x00\x02" b"{}"
        ),
    ),
    "a function call without call_id uses its id; an empty namespace adds nothing": (
        [{"type": "function_call", "id": "fc_1", "namespace": "", "name": "f"}],
        (
            b"nemo-gym-lineage"
            b"\x02" b"\x00\x00\x00\x00\x00\x00\x00\x04" b"fc_1"
            b"\x03" b"\x00\x00\x00\x00\x00\x00\x00\x01" b"f"
            b"\x04" b"\x00\x00\x00\x00\x00\x00\x00\x00"
        ),
    ),
    "a function call with no ids and no name feeds empty fields; a null name is str(None)": (
        [{"type": "function_call"}, {"type": "function_call", "name": None, "arguments": "null"}],
        (
            b"nemo-gym-lineage"
            b"\x02" b"\x00\x00\x00\x00\x00\x00\x00\x00"
            b"\x03" b"\x00\x00\x00\x00\x00\x00\x00\x00"
            b"\x04" b"\x00\x00\x00\x00\x00\x00\x00\x00"
            b"\x02" b"\x00\x00\x00\x00\x00\x00\x00\x00"
            b"\x03" b"\x00\x00\x00\x00\x00\x00\x00\x04" b"None"
            b"\x04" b"\x00\x00\x00\x00\x00\x00\x00\x04" b"null"
        ),
    ),
    "a falsy tool_calls element counts as {}": (
        [{"role": "assistant", "tool_calls": [None]}],
        (
            b"nemo-gym-lineage"
            b"\x02" b"\x00\x00\x00\x00\x00\x00\x00\x00"
            b"\x03" b"\x00\x00\x00\x00\x00\x00\x00\x00"
            b"\x04" b"\x00\x00\x00\x00\x00\x00\x00\x00"
        ),
    ),
    "non-JSON string arguments are used stripped": (
        [{"type": "function_call", "call_id": "c", "name": "sh", "arguments": "  ls -la \n"}],
        (
            b"nemo-gym-lineage"
            b"\x02" b"\x00\x00\x00\x00\x00\x00\x00\x01" b"c"
            b"\x03" b"\x00\x00\x00\x00\x00\x00\x00\x02" b"sh"
            b"\x04" b"\x00\x00\x00\x00\x00\x00\x00\x06" b"ls -la"
        ),
    ),
    "floats in shortest round-trip form, NaN and Infinity as null, non-ASCII raw, / unescaped": (
        [
            {
                "type": "function_call",
                "call_id": "c",
                "name": "f",
                "arguments": {"x": 1e-7, "y": 1e16, "z": 1.5, "w": 100.0, "n": float("nan"), "k": "\u00e9/\n"},
            }
        ],
        (
            b"nemo-gym-lineage"
            b"\x02" b"\x00\x00\x00\x00\x00\x00\x00\x01" b"c"
            b"\x03" b"\x00\x00\x00\x00\x00\x00\x00\x01" b"f"
            b"\x04" b"\x00\x00\x00\x00\x00\x00\x00\x3b"
            b'{"k":"\xc3\xa9/\\n","n":null,"w":100.0,"x":1e-7,"y":1e+16,"z":1.5}'
        ),
    ),
    "an empty assistant message still counts": (
        [{"role": "assistant", "content": "", "tool_calls": []}],
        b"nemo-gym-lineage",
    ),
    "non-model items contribute nothing, in any position": (
        [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "r"}]},
            {"role": "assistant", "content": "x"},
            {"type": "function_call_output", "call_id": "c", "output": "o"},
            {"role": "tool", "tool_call_id": "c", "content": "o"},
            {"type": "message", "content": [{"type": "output_text", "text": "no role"}]},
            {"role": "developer", "content": "d"},
        ],
        (
            b"nemo-gym-lineage"
            b"\x00" b"\x00\x00\x00\x00\x00\x00\x00\x04" b"text" b"\x01" b"\x00\x00\x00\x00\x00\x00\x00\x01" b"x"
        ),
    ),
    "lengths count UTF-8 bytes, not characters": (
        [{"role": "assistant", "content": "\u00e9\u20ac"}],
        (
            b"nemo-gym-lineage"
            b"\x00" b"\x00\x00\x00\x00\x00\x00\x00\x04" b"text"
            b"\x01" b"\x00\x00\x00\x00\x00\x00\x00\x05" b"\xc3\xa9\xe2\x82\xac"
        ),
    ),
}


@pytest.mark.parametrize("name", list(VECTORS))
def test_each_vector_hashes_exactly_its_literal_bytes(name: str) -> None:
    items, fed = VECTORS[name]

    assert fingerprint(items) == sha(fed)


def test_the_empty_assistant_message_is_the_domain_alone() -> None:
    assert fingerprint([{"role": "assistant"}]) == sha(DOMAIN)
    assert fingerprint([{"role": "assistant", "content": None}]) == sha(DOMAIN)
    assert len(sha(DOMAIN)) == 64


@pytest.mark.parametrize(
    "items",
    [[], [{"role": "user", "content": "hi"}], [{"type": "message", "content": "no role"}], [{"type": "reasoning"}]],
    ids=repr,
)
def test_no_model_authored_item_gives_the_empty_string(items: list[Any]) -> None:
    assert fingerprint(items) == ""


def test_tool_call_ids_are_content_and_message_ids_are_not() -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    message = {"type": "message", "role": "assistant", "id": "msg_1", "content": "x"}

    assert fingerprint([call]) != fingerprint([{**call, "call_id": "c2"}])
    assert fingerprint([message]) == fingerprint([{**message, "id": "msg_2"}])


def test_item_order_matters_and_fields_cannot_run_into_each_other() -> None:
    first, second = {"role": "assistant", "content": "ab"}, {"role": "assistant", "content": "c"}

    assert fingerprint([first, second]) != fingerprint([second, first])
    split_otherwise = [{"role": "assistant", "content": "a"}, {**second, "content": "bc"}]
    assert fingerprint([first, second]) != fingerprint(split_otherwise)


# --- canonical arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "canonical"),
    [
        ('{"b": 1, "a": 2}', '{"a":2,"b":1}'),
        ('{"a":2,"b":1}', '{"a":2,"b":1}'),
        ({"a": 2, "b": 1}, '{"a":2,"b":1}'),
        ('  {\n  "a" : 2 ,\n "b":1}  ', '{"a":2,"b":1}'),
        ('{"a": 1, "a": 2}', '{"a":2}'),
        ('{"x": NaN, "y": Infinity}', '{"x":null,"y":null}'),
        ("null", "null"),
        (None, ""),
        ("", ""),
        ("  not json  ", "not json"),
        ("{", "{"),
        ([1, "two"], '[1,"two"]'),
        (7, "7"),
        ('"just a string"', '"just a string"'),
        ('{"Z": 1, "a": 2, "\u00e9": 3}', '{"Z":1,"a":2,"\u00e9":3}'),
    ],
    ids=repr,
)
def test_canonical_arguments(value: Any, canonical: str) -> None:
    assert canonical_arguments(value) == canonical


def test_integers_outside_the_64_bit_range_are_unreadable() -> None:
    assert canonical_json(2**64 - 1) == "18446744073709551615" and canonical_json(-(2**63)) == "-9223372036854775808"
    with pytest.raises(UnreadableContent):
        canonical_json(2**64)
    with pytest.raises(UnreadableContent):
        fingerprint([{"type": "function_call", "arguments": str(-(2**63) - 1)}])


# --- unreadable inputs ---------------------------------------------------------------------------------

UNREADABLE: dict[str, list[Any]] = {
    "an element that is not an object": [{"role": "assistant", "content": "x"}, "oops"],
    "a non-model element that is not an object": [None],
    "a number as content": [{"role": "assistant", "content": 5}],
    "an object as content": [{"role": "assistant", "content": {"text": "x"}}],
    "a boolean as content": [{"role": "assistant", "content": True}],
    "a number among the parts": [{"role": "assistant", "content": ["x", 5]}],
    "a list among the parts": [{"role": "assistant", "content": [["x"]]}],
    "an untyped part without a string text": [{"role": "assistant", "content": [{"text": 5}]}],
    "tool_calls that is not a list": [{"role": "assistant", "tool_calls": {"id": "c"}}],
    "a tool_calls element that is not an object": [{"role": "assistant", "tool_calls": ["c"]}],
    "a function that is not an object": [{"role": "assistant", "tool_calls": [{"id": "c", "function": "f"}]}],
    "a lone surrogate in text": [{"role": "assistant", "content": "\ud800"}],
    "a lone surrogate in a call id": [{"type": "function_call", "call_id": "\udfff"}],
    "an integer beyond 64 bits in a block": [{"role": "assistant", "content": [{"type": "x", "n": 2**64}]}],
    "arguments nested past any parser's limit": [{"type": "function_call", "arguments": "[" * 100_000 + "]" * 100_000}],
}


@pytest.mark.parametrize("name", list(UNREADABLE))
def test_unreadable_inputs_raise_the_one_unreadable_error(name: str) -> None:
    with pytest.raises(UnreadableContent) as caught:
        fingerprint(UNREADABLE[name])
    assert isinstance(caught.value, LlmtapError)


def test_unreadable_content_in_a_non_model_item_is_not_read() -> None:
    assert fingerprint([{"role": "user", "content": 5}, {"role": "tool", "tool_calls": "x"}]) == ""


# --- the dialect entry points ---------------------------------------------------------------------------

TURN_TEXT = "Let me add."
CALL_ARGS = {"a": 2, "b": 3}
USER = "Add 2 and 3."

CHAT_REQUEST = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": USER}]}
CHAT_RESPONSE = {
    "id": "chatcmpl-1",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": TURN_TEXT,
                "tool_calls": [
                    {"id": "call_9", "type": "function", "function": {"name": "add", "arguments": '{"a":2,"b":3}'}}
                ],
            },
        }
    ],
}
RESPONSES_REQUEST = {"instructions": "s", "input": USER}
RESPONSES_RESPONSE = {
    "id": "resp_1",
    "output": [
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "content": [{"type": "output_text", "text": TURN_TEXT}],
        },
        {"type": "function_call", "id": "fc_1", "call_id": "call_9", "name": "add", "arguments": '{"b": 3, "a": 2}'},
    ],
}
MESSAGES_REQUEST = {"system": "s", "messages": [{"role": "user", "content": USER}]}
MESSAGES_RESPONSE = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "content": [
        {"type": "text", "text": TURN_TEXT},
        {"type": "tool_use", "id": "call_9", "name": "add", "input": CALL_ARGS},
    ],
}
TURN_BYTES = (
    b"nemo-gym-lineage"
    b"\x00" b"\x00\x00\x00\x00\x00\x00\x00\x04" b"text"
    b"\x01" b"\x00\x00\x00\x00\x00\x00\x00\x0b" b"Let me add."
    b"\x02" b"\x00\x00\x00\x00\x00\x00\x00\x06" b"call_9"
    b"\x03" b"\x00\x00\x00\x00\x00\x00\x00\x03" b"add"
    b"\x04" b"\x00\x00\x00\x00\x00\x00\x00\x0d" b'{"a":2,"b":3}'
)


@pytest.mark.parametrize(
    ("dialect", "request_body", "response"),
    [
        ("chat", CHAT_REQUEST, CHAT_RESPONSE),
        ("responses", RESPONSES_REQUEST, RESPONSES_RESPONSE),
        ("messages", MESSAGES_REQUEST, MESSAGES_RESPONSE),
    ],
)
def test_the_same_turn_in_each_dialect_gives_the_one_literal_fingerprint(
    dialect: str, request_body: dict[str, Any], response: dict[str, Any]
) -> None:
    assert output_fingerprint(response, dialect=dialect) == sha(TURN_BYTES)
    # A first call's request has no model-authored turn: its continuation is its own output.
    assert continuation_fingerprint(request_body, response, dialect=dialect) == sha(TURN_BYTES)


def test_a_continuation_is_the_model_authored_spine_of_the_request_plus_the_output() -> None:
    earlier = {"role": "assistant", "content": "first"}
    request = {"messages": [{"role": "user", "content": "q"}, earlier, {"role": "user", "content": "again"}]}
    expected = sha(
        b"nemo-gym-lineage"
        b"\x00" b"\x00\x00\x00\x00\x00\x00\x00\x04" b"text" b"\x01" b"\x00\x00\x00\x00\x00\x00\x00\x05" b"first"
        b"\x00" b"\x00\x00\x00\x00\x00\x00\x00\x04" b"text" b"\x01" b"\x00\x00\x00\x00\x00\x00\x00\x02" b"ok"
    )
    response = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}

    assert continuation_fingerprint(request, response, dialect="chat") == expected


def test_the_entry_points_never_raise_and_say_unknown_with_none() -> None:
    assert output_fingerprint(None, dialect="chat") is None
    assert output_fingerprint({"output": "x"}, dialect="responses") is None
    assert output_fingerprint({"output": [{"role": "assistant", "content": 5}]}, dialect="responses") is None
    assert output_fingerprint(RESPONSES_RESPONSE, dialect="nope") is None
    assert continuation_fingerprint({"messages": "x"}, CHAT_RESPONSE, dialect="chat") is None
    assert continuation_fingerprint({"input": ["x"]}, RESPONSES_RESPONSE, dialect="responses") is None
    assert output_fingerprint({"choices": []}, dialect="chat") is None


def test_a_chat_response_with_several_choices_is_read_by_its_first_in_index_order() -> None:
    second = {"index": 1, "message": {"role": "assistant", "content": "b"}}
    first = {"index": 0, "message": {"role": "assistant", "content": "a"}}

    assert output_fingerprint({"choices": [second, first]}, dialect="chat") == fingerprint([first["message"]])


def test_only_version_2_counts_for_custody_rows_and_2_or_null_for_lineage_entries() -> None:
    assert FINGERPRINT_VERSION == 2
    assert version_counts(2, custody=True) and version_counts(2, custody=False)
    assert version_counts(None, custody=False) and not version_counts(None, custody=True)
    for other in (1, 3, "2", 2.0, True, [2]):
        assert not version_counts(other, custody=True) and not version_counts(other, custody=False)


# --- property: one turn, three shapes -------------------------------------------------------------------

encodable_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | encodable_text
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(encodable_text, inner, max_size=3),
    max_leaves=8,
)
tool_calls = st.lists(
    st.tuples(
        st.text("abcdefghij_0123456789", min_size=1, max_size=8),
        st.text("abcdefghij", min_size=1, max_size=8),
        st.dictionaries(encodable_text, json_values, max_size=3),
        st.sampled_from([None, 2]),
    ),
    max_size=3,
)


def _chat_turn(text: str, calls: list[tuple[str, str, dict[str, Any], int | None]]) -> dict[str, Any]:
    """An assistant chat message with this text and these tool calls (arguments as JSON text, indented or not)."""
    return {
        "role": "assistant",
        "content": text or None,
        "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args, indent=indent)}}
            for cid, name, args, indent in calls
        ],
    }


@settings(max_examples=300, deadline=None)
@given(text=encodable_text, calls=tool_calls, user=encodable_text)
def test_the_chat_responses_and_anthropic_shapes_of_one_turn_fingerprint_identically(
    text: str, calls: list[tuple[str, str, dict[str, Any], int | None]], user: str
) -> None:
    chat = _chat_turn(text, calls)
    responses = [
        {"type": "message", "id": "msg_1", "role": "assistant", "content": [{"type": "output_text", "text": text}]},
        *(
            {"type": "function_call", "id": f"fc_{cid}", "call_id": cid, "name": name, "arguments": json.dumps(args)}
            for cid, name, args, _ in calls
        ),
    ]
    anthropic = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "content": [
            *([{"type": "text", "text": text}] if text else []),
            *({"type": "tool_use", "id": cid, "name": name, "input": args} for cid, name, args, _ in calls),
        ],
    }
    user_turns = [{"role": "user", "content": user}]

    expected = fingerprint([chat])
    assert len(expected) == 64
    assert fingerprint([*user_turns, *responses]) == expected
    assert fingerprint([*user_turns, anthropic]) == expected
    assert output_fingerprint({"choices": [{"index": 0, "message": chat}]}, dialect="chat") == expected
    assert output_fingerprint({"output": responses}, dialect="responses") == expected
    assert output_fingerprint(anthropic, dialect="messages") == expected


def _turns(text: str, calls: list[tuple[str, str, dict[str, Any], int | None]]) -> list[dict[str, Any]]:
    """One turn in each shape, so the memo sees chat, Responses and Anthropic items alike."""
    chat = _chat_turn(text, calls)
    responses = [{"type": "function_call", "call_id": cid, "name": name, "arguments": json.dumps(args)} for cid, name, args, _ in calls]
    anthropic = {"role": "assistant", "content": [{"type": "tool_use", "id": cid, "name": name, "input": args} for cid, name, args, _ in calls]}
    return [chat, *responses, anthropic, {"role": "user", "content": text}]


@settings(max_examples=200, deadline=None)
@given(turns=st.lists(st.tuples(encodable_text, tool_calls), min_size=1, max_size=4), limit=st.sampled_from([64, 10**6]))
def test_the_memo_never_changes_a_fingerprint_whatever_it_holds(
    turns: list[tuple[str, list[tuple[str, str, dict[str, Any], int | None]]]], limit: int
) -> None:
    """Each growing conversation, as an agent's successive requests send it, with a memo shared by all
    (and one so small it keeps starting over): the same fingerprints as without one."""
    memo = FieldMemo(limit_bytes=limit)
    conversation: list[dict[str, Any]] = []
    for text, calls in turns:
        conversation.extend(_turns(text, calls))
        items = orjson.loads(orjson.dumps(conversation))  # as the capture path holds them: parsed by orjson
        assert fingerprint(items, memo=memo) == fingerprint(items)
    assert memo._bytes <= max(limit, 0) or len(memo) == 1


def test_the_memo_reads_each_repeated_turn_once_and_stays_within_its_bound() -> None:
    turn = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": '{"b": 1, "a": 2}'}}]}
    memo = FieldMemo(limit_bytes=4096)
    first = fingerprint([turn], memo=memo)
    assert len(memo) == 1 and fingerprint([dict(turn)], memo=memo) == first == fingerprint([turn])
    for index in range(200):  # new turns push it past its bound: it starts over rather than grow
        fingerprint([{**turn, "tool_calls": [{"id": f"c{index}", "function": {"name": "f", "arguments": "{}"}}]}], memo=memo)
    assert memo._bytes <= 4096 and 0 < len(memo) < 200


def test_unreadable_items_are_unreadable_with_a_memo_too() -> None:
    memo = FieldMemo()
    with pytest.raises(UnreadableContent):
        fingerprint([{"role": "assistant", "content": 5}], memo=memo)
    assert len(memo) == 0
