"""Anthropic Messages dialect: reassembly and normalization against every recorded exchange.

Expectations for streams are derived here from the raw `data:` lines with the standard `json`
module (the message_start envelope, the deltas concatenated, the last message_delta), never by
running the dialect twice.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llmtap.dialects.messages_stream as messages_module
from llmtap.dialects.base import FINISH_REASONS
from llmtap.dialects.messages import MessagesDialect, MessagesStreamAssembler
from llmtap.dialects.sse import SSEDecoder, SSEEvent, decode_sse
from tests.dialects.token_streams import (
    ESCAPED_TOKENS,
    TRICKY_TOKENS,
    assert_templates_change_nothing,
    track_counting_parses,
)
from tests.fixtures import RecordedExchange, fixture, fixtures_for

DIALECT = MessagesDialect()
STREAMS = fixtures_for("messages", stream=True)
BODIES = [f for f in fixtures_for("messages", stream=False) if f.status < 400]
ERRORS = [f for f in fixtures_for("messages", stream=False) if f.status >= 400]
TOOL_BLOCKS = ("tool_use", "server_tool_use")


def _ids(exchanges: list[RecordedExchange]) -> list[str]:
    return [f.name for f in exchanges]


def _assemble(body: bytes) -> MessagesStreamAssembler:
    assembler = DIALECT.stream_assembler()
    for event in decode_sse(body):
        assembler.feed(event)
    return assembler


@cache
def _reference(name: str) -> tuple[dict[str, Any] | None, str | None, int]:
    assembler = _assemble(fixture(f"messages/{name}").body_bytes)
    return assembler.result(), assembler.terminal, assembler.malformed_events


@cache
def _raw_events(name: str) -> tuple[dict[str, Any], ...]:
    """The stream's data payloads, read line by line with the standard library."""
    body = fixture(f"messages/{name}").body_text
    return tuple(json.loads(line[5:]) for line in body.splitlines() if line.startswith("data:"))


class _Expected:
    """What the provider reported in one stream, read straight from its raw events."""

    def __init__(self, name: str) -> None:
        events = _raw_events(name)
        start = next(e["message"] for e in events if e["type"] == "message_start")
        deltas = [e for e in events if e["type"] == "message_delta"]
        self.id: str = start["id"]
        self.model: str = start["model"]
        self.stop_reason: str | None = deltas[-1]["delta"]["stop_reason"]
        self.usage: dict[str, Any] = dict(start["usage"])
        for delta in deltas:
            self.usage.update(delta["usage"])
        self.blocks: dict[int, dict[str, Any]] = {}
        self.pieces: dict[int, list[str]] = {}
        self.json_text: dict[int, str] = {}
        self.signatures: dict[int, str] = {}
        self.citations: dict[int, int] = {}
        for event in events:
            if event["type"] == "content_block_start":
                self.blocks[event["index"]] = event["content_block"]
                self.pieces[event["index"]] = []
            elif event["type"] == "content_block_delta":
                index, delta = event["index"], event["delta"]
                if delta["type"] in ("text_delta", "thinking_delta"):
                    self.pieces[index].append(delta.get("text", delta.get("thinking", "")))
                elif delta["type"] == "input_json_delta":
                    self.json_text[index] = self.json_text.get(index, "") + delta["partial_json"]
                elif delta["type"] == "signature_delta":
                    self.signatures[index] = delta["signature"]
                elif delta["type"] == "citations_delta":
                    self.citations[index] = self.citations.get(index, 0) + 1

    def block_text(self, index: int) -> str:
        return "".join(self.pieces[index])

    def of_type(self, kind: str) -> list[int]:
        return [i for i in sorted(self.blocks) if self.blocks[i]["type"] == kind]

    @property
    def text(self) -> str | None:
        indexes = self.of_type("text")
        return "".join(self.block_text(i) for i in indexes) if indexes else None

    @property
    def thinking(self) -> str | None:
        parts = [self.block_text(i) for i in self.of_type("thinking") if self.block_text(i)]
        return "\n".join(parts) if parts else None

    @property
    def tool_calls(self) -> list[tuple[str, str, str, dict[str, Any]]]:
        """(block type, id, name, parsed input) of each tool call block, in order."""
        return [(*call[:3], json.loads(call[3])) for call in self.raw_tool_calls]

    @property
    def raw_tool_calls(self) -> list[tuple[str, str, str, str]]:
        tools = [self.blocks[i] | {"json": self.json_text.get(i, "")} for i in sorted(self.blocks)]
        return [(t["type"], t["id"], t["name"], t["json"]) for t in tools if t["type"] in TOOL_BLOCKS]


expected_from = cache(_Expected)


# --- every recorded stream ------------------------------------------------------------------


@pytest.mark.parametrize("exchange", STREAMS, ids=_ids(STREAMS))
def test_recorded_stream_completes_with_no_malformed_events(exchange: RecordedExchange) -> None:
    assembler = _assemble(exchange.body_bytes)
    assert assembler.terminal == "completed"
    assert assembler.malformed_events == 0
    assert assembler.unknown_events == 0


@pytest.mark.parametrize("exchange", STREAMS, ids=_ids(STREAMS))
def test_recorded_stream_matches_what_the_provider_reported(exchange: RecordedExchange) -> None:
    expected = expected_from(exchange.name)
    result, _, _ = _reference(exchange.name)
    assert result is not None
    normalized = DIALECT.normalize(result)

    assert normalized.response_id == expected.id
    assert normalized.model == expected.model
    assert normalized.finish_reason == expected.stop_reason
    assert normalized.output_text == expected.text
    assert normalized.reasoning_content == expected.thinking
    assert normalized.reasoning_redacted_blocks == len(expected.of_type("redacted_thinking"))
    assert normalized.error is None

    calls = [(c.type, c.call_id, c.name, c.arguments) for c in normalized.tool_calls]
    assert calls == [
        ("function", call_id, name, arguments)
        for kind, call_id, name, arguments in expected.tool_calls
        if kind == "tool_use"
    ]
    hosted = [(c.type, c.call_id, c.name, c.arguments) for c in normalized.hosted_tool_calls]
    assert hosted == [call for call in expected.tool_calls if call[0] != "tool_use"]
    assert normalized.served_item_ids == [expected.id] + [call[1] for call in expected.tool_calls]


@pytest.mark.parametrize("exchange", STREAMS, ids=_ids(STREAMS))
def test_recorded_stream_usage_folds_cache_into_input_and_keeps_final_output_count(
    exchange: RecordedExchange,
) -> None:
    usage = expected_from(exchange.name).usage
    result, _, _ = _reference(exchange.name)
    assert result is not None
    normalized = DIALECT.normalize(result)

    tokens_in = (
        usage["input_tokens"] + usage.get("cache_read_input_tokens", 0) + usage.get("cache_creation_input_tokens", 0)
    )
    assert normalized.usage.tokens_in == tokens_in
    assert normalized.usage.tokens_out == usage["output_tokens"]
    assert normalized.usage.tokens_total == tokens_in + usage["output_tokens"]
    assert normalized.usage.cached_tokens == usage.get("cache_read_input_tokens")
    assert normalized.usage.cache_creation_tokens == usage.get("cache_creation_input_tokens")


@pytest.mark.parametrize("exchange", STREAMS, ids=_ids(STREAMS))
def test_recorded_stream_rebuilds_each_block_as_the_api_returns_it(exchange: RecordedExchange) -> None:
    expected = expected_from(exchange.name)
    result, _, _ = _reference(exchange.name)
    assert result is not None
    content = result["content"]
    assert [block["type"] for block in content] == [expected.blocks[i]["type"] for i in sorted(expected.blocks)]
    for index, block in zip(sorted(expected.blocks), content):
        started = expected.blocks[index]
        if started["type"] == "text":
            assert block["text"] == expected.block_text(index)
            assert len(block.get("citations") or []) == expected.citations.get(index, 0)
        elif started["type"] == "thinking":
            assert block["thinking"] == expected.block_text(index)
            assert block["signature"] == expected.signatures[index]
        elif started["type"] in TOOL_BLOCKS:
            assert block["input"] == json.loads(expected.json_text[index])
        else:
            # redacted_thinking and server tool results arrive whole and are kept as given.
            assert block == started


@pytest.mark.parametrize("exchange", STREAMS, ids=_ids(STREAMS))
def test_data_only_stream_gives_the_same_message_and_terminal(exchange: RecordedExchange) -> None:
    data_only = "\n".join(line for line in exchange.body_text.splitlines() if not line.startswith("event:"))
    assembler = _assemble(data_only.encode())
    result, terminal, _ = _reference(exchange.name)
    assert assembler.terminal == terminal == "completed"
    assert assembler.result() == result


@pytest.mark.parametrize(
    ("name", "counts"),
    [
        ("cache-read-stream-sonnet4", (11 + 1031, 100, 11 + 1031 + 100, 1031, 0)),
        ("cache-write-stream-sonnet4", (18 + 1031, 100, 18 + 1031 + 100, 0, 1031)),
        ("max-tokens-stream-opus3", (27, 15, 42, None, None)),
    ],
)
def test_stream_usage_reports_literal_counts(name: str, counts: tuple[int | None, ...]) -> None:
    result, _, _ = _reference(name)
    assert result is not None
    usage = DIALECT.normalize(result).usage
    assert (usage.tokens_in, usage.tokens_out, usage.tokens_total, usage.cached_tokens,
            usage.cache_creation_tokens) == counts


def test_message_delta_fields_beyond_stop_reason_are_kept() -> None:
    refusal, _, _ = _reference("refusal-stream-fable51")
    code, _, _ = _reference("code-execution-thinking-stream-sonnet46")
    assert refusal is not None and code is not None
    assert refusal["stop_details"]["category"] == "reasoning_extraction"
    assert code["container"]["id"] == "container_011CaNRFAbjdPf4rmBarZzqQ"
    assert code["usage"]["server_tool_use"] == {"web_search_requests": 0, "web_fetch_requests": 0}


def test_streamed_refusal_without_text_reports_the_provider_explanation() -> None:
    result, _, _ = _reference("refusal-stream-fable51")
    assert result is not None
    normalized = DIALECT.normalize(result)
    assert normalized.finish_reason_normalized == "content_filter"
    assert normalized.output_text is None
    assert normalized.refusal is not None and normalized.refusal.startswith("This request was blocked")
    # The newer API reports thinking tokens for this call; it said zero.
    assert normalized.usage.tokens_reasoning == 0


def test_streams_without_thinking_token_details_leave_reasoning_tokens_unknown() -> None:
    result, _, _ = _reference("thinking-stream-sonnet45")
    assert result is not None
    assert DIALECT.normalize(result).usage.tokens_reasoning is None


# --- non-streaming bodies -------------------------------------------------------------------


@pytest.mark.parametrize("exchange", BODIES, ids=_ids(BODIES))
def test_recorded_body_normalizes_to_its_own_fields(exchange: RecordedExchange) -> None:
    body = json.loads(exchange.body_text)
    normalized = DIALECT.normalize(body)
    texts = [b["text"] for b in body["content"] if b["type"] == "text"]
    tools = [b for b in body["content"] if b["type"] in TOOL_BLOCKS]
    assert normalized.response_id == body["id"]
    assert normalized.model == body["model"]
    assert normalized.finish_reason == body["stop_reason"]
    assert normalized.output_text == ("".join(texts) if texts else None)
    assert [(c.call_id, c.name, c.arguments) for c in normalized.tool_calls] == [
        (b["id"], b["name"], b["input"]) for b in tools if b["type"] == "tool_use"
    ]
    assert [(c.call_id, c.name, c.arguments) for c in normalized.hosted_tool_calls] == [
        (b["id"], b["name"], b["input"]) for b in tools if b["type"] != "tool_use"
    ]
    assert normalized.served_item_ids == [body["id"]] + [b["id"] for b in tools]
    assert normalized.usage.tokens_out == body["usage"]["output_tokens"]
    assert normalized.error is None


def test_cache_read_body_folds_reads_into_input() -> None:
    usage = DIALECT.normalize(json.loads(fixture("messages/cache-read-sonnet4").body_text)).usage
    assert usage == type(usage)(
        tokens_in=2066, tokens_out=100, tokens_reasoning=None, tokens_total=2166, cached_tokens=2055,
        cache_creation_tokens=0,
    )


def test_cache_write_body_folds_writes_into_input() -> None:
    usage = DIALECT.normalize(json.loads(fixture("messages/cache-write-sonnet4").body_text)).usage
    assert (usage.tokens_in, usage.cached_tokens, usage.cache_creation_tokens) == (2073, 0, 2055)


def test_old_model_without_cache_fields_leaves_cache_counts_unknown() -> None:
    normalized = DIALECT.normalize(json.loads(fixture("messages/max-tokens-opus3").body_text))
    usage = normalized.usage
    assert (usage.tokens_in, usage.tokens_out, usage.tokens_total) == (22, 15, 37)
    assert usage.cached_tokens is None and usage.cache_creation_tokens is None
    assert normalized.finish_reason_normalized == "length"


def test_parallel_tool_use_body_gives_both_calls_in_order() -> None:
    normalized = DIALECT.normalize(json.loads(fixture("messages/parallel-tool-use-sonnet4").body_text))
    assert [c.as_dict() for c in normalized.tool_calls] == [
        {"call_id": "toolu_01StBeRxDEwsqcc3arbDgpS9", "name": "add", "arguments": {"a": 2, "b": 3}},
        {"call_id": "toolu_01AC6WQhj2iRkdYHgTAGMpVQ", "name": "multiply", "arguments": {"a": 2, "b": 3}},
    ]
    assert normalized.finish_reason_normalized == "tool_calls"


def test_redacted_thinking_body_counts_the_block() -> None:
    normalized = DIALECT.normalize(json.loads(fixture("messages/redacted-thinking-sonnet45").body_text))
    assert normalized.reasoning_redacted_blocks == 1
    assert normalized.reasoning_content is None


def test_thinking_body_gives_reasoning_and_the_agent_tool_call() -> None:
    normalized = DIALECT.normalize(json.loads(fixture("messages/thinking-tool-use-sonnet4").body_text))
    assert normalized.reasoning_content is not None
    assert normalized.reasoning_content.startswith("The user is asking about the weather in Florence, Italy.")
    assert [c.as_dict() for c in normalized.tool_calls] == [
        {"call_id": "toolu_014azqsWLU8Djh6RhmBGRC2u", "name": "weather", "arguments": {"location": "Florence, Italy"}}
    ]


def test_web_search_body_keeps_the_server_tool_call_out_of_the_agent_calls() -> None:
    body = json.loads(fixture("messages/web-search-sonnet4").body_text)
    normalized = DIALECT.normalize(body)
    assert normalized.tool_calls == []
    [result_block] = [block for block in body["content"] if block["type"] == "web_search_tool_result"]
    assert [c.as_dict() for c in normalized.hosted_tool_calls] == [
        {
            "type": "server_tool_use",
            "call_id": "srvtoolu_0185jCYJv14nWWFoMsh2Bs9K",
            "name": "web_search",
            "arguments": {"query": "Tokyo population 2026 current"},
            "result": result_block["content"],
        }
    ]
    assert normalized.finish_reason_normalized == "stop"
    assert normalized.usage.tokens_in == 13520


@pytest.mark.parametrize("exchange", ERRORS, ids=_ids(ERRORS))
def test_recorded_error_body_fills_the_error(exchange: RecordedExchange) -> None:
    body = json.loads(exchange.body_text)
    normalized = DIALECT.normalize(body)
    assert normalized.error == body["error"]
    assert normalized.finish_reason_normalized == "error"
    assert normalized.usage.tokens_in is None


def test_error_body_types_are_read_literally() -> None:
    types = [DIALECT.normalize(json.loads(f.body_text)).error for f in ERRORS]
    assert [e["type"] for e in types if e] == ["invalid_request_error", "authentication_error", "not_found_error"]


# --- synthetic streams: what the recordings lack ---------------------------------------------


def _event(data: dict[str, Any] | str, name: str | None = None) -> SSEEvent:
    return SSEEvent(name, data if isinstance(data, str) else json.dumps(data))


MESSAGE_START = {
    "type": "message_start",
    "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x", "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {
            "input_tokens": 10, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 2, "output_tokens": 1,
        },
    },
}


def _feed(*events: SSEEvent) -> MessagesStreamAssembler:
    assembler = DIALECT.stream_assembler()
    for event in events:
        assembler.feed(event)
    return assembler


def _start(index: int, **block: Any) -> SSEEvent:
    return _event({"type": "content_block_start", "index": index, "content_block": block})


def _delta(index: int, **delta: Any) -> SSEEvent:
    return _event({"type": "content_block_delta", "index": index, "delta": delta})


def _text_block(index: int, text: str) -> list[SSEEvent]:
    return [_start(index, type="text", text=""), _delta(index, type="text_delta", text=text)]


@pytest.mark.parametrize("name", ["error", None], ids=["named", "data-only"])
def test_mid_stream_error_keeps_partial_content_and_the_error(name: str | None) -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    assembler = _feed(_event(MESSAGE_START), *_text_block(0, "Hel"), _event(error, name))
    assert assembler.terminal == "error"
    result = assembler.result()
    assert result is not None
    normalized = DIALECT.normalize(result)
    assert normalized.error == {"type": "overloaded_error", "message": "Overloaded"}
    assert normalized.finish_reason_normalized == "error"
    assert normalized.output_text == "Hel"
    assert normalized.response_id == "msg_1"


def test_error_before_any_message_gives_an_error_body() -> None:
    assembler = _feed(_event("upstream exploded", "error"))
    assert assembler.terminal == "error"
    assert assembler.result() == {"type": "error", "error": {"message": "upstream exploded"}}


def test_message_delta_merges_usage_without_erasing_earlier_counts() -> None:
    later = {"output_tokens": 42, "input_tokens": None}
    delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": later}
    result = _feed(_event(MESSAGE_START), _event(delta)).result()
    assert result is not None
    usage = DIALECT.normalize(result).usage
    assert (usage.tokens_in, usage.tokens_out, usage.cached_tokens, usage.cache_creation_tokens) == (17, 42, 5, 2)


def test_message_delta_replaces_counts_it_carries() -> None:
    delta = {"type": "message_delta", "delta": {}, "usage": {"output_tokens": 9, "cache_read_input_tokens": 50}}
    result = _feed(_event(MESSAGE_START), _event(delta)).result()
    assert result is not None
    assert DIALECT.normalize(result).usage.tokens_in == 10 + 50 + 2


def test_cut_tool_arguments_are_kept_raw_without_raising() -> None:
    assembler = _feed(
        _event(MESSAGE_START),
        _start(0, type="tool_use", id="toolu_1", name="f", input={}),
        _delta(0, type="input_json_delta", partial_json='{"city": "Par'),
    )
    assert assembler.terminal is None
    result = assembler.result()
    assert result is not None
    assert result["content"][0]["input"] == '{"city": "Par'
    assert [c.arguments for c in DIALECT.normalize(result).tool_calls] == [{"_raw": '{"city": "Par'}]


def test_unknown_block_is_kept_and_unknown_delta_is_counted_not_applied() -> None:
    block = {"type": "future_block", "payload": [1, 2]}
    assembler = _feed(
        _event(MESSAGE_START),
        _start(0, **block),
        _delta(0, type="future_delta", x=1),
        _event({"type": "future_event"}),
    )
    result = assembler.result()
    assert result is not None
    assert result["content"] == [block]
    assert (assembler.unknown_events, assembler.malformed_events) == (2, 0)


def test_citations_delta_appends_to_the_block() -> None:
    citation = {"type": "web_search_result_location", "url": "https://example.org"}
    assembler = _feed(
        _event(MESSAGE_START),
        _start(0, type="text", text="", citations=[]),
        _delta(0, type="citations_delta", citation=citation),
        _delta(0, type="citations_delta", citation=citation),
    )
    result = assembler.result()
    assert result is not None
    assert result["content"][0]["citations"] == [citation, citation]


def test_delta_for_a_block_that_never_started_is_malformed() -> None:
    assembler = _feed(_event(MESSAGE_START), _delta(3, type="text_delta", text="x"))
    assert assembler.malformed_events == 1
    result = assembler.result()
    assert result is not None and result["content"] == []


def test_nothing_learned_gives_no_result() -> None:
    assembler = _feed(_event({"type": "ping"}), _event("not json"), _event("[DONE]"))
    assert assembler.result() is None
    assert assembler.malformed_events == 1


def test_space_padded_terminal_event_is_detected() -> None:
    decoder = SSEDecoder()
    events = decoder.feed(b'data: {"type":"message_stop"      }\n\n') + decoder.close()
    assert _feed(*events).terminal == "completed"


def test_event_name_gives_the_type_when_the_data_has_none() -> None:
    untyped_start = {key: value for key, value in MESSAGE_START.items() if key != "type"}
    assembler = _feed(_event(untyped_start, "message_start"), _event({}, "message_stop"))
    assert assembler.terminal == "completed"
    result = assembler.result()
    assert result is not None and result["id"] == "msg_1"


def test_thinking_shown_as_omitted_counts_as_redacted() -> None:
    omitted = {"type": "thinking", "thinking": "", "signature": "sig"}
    body = {"content": [omitted, {"type": "redacted_thinking", "data": "x"}]}
    normalized = DIALECT.normalize(body)
    assert normalized.reasoning_redacted_blocks == 2
    assert normalized.reasoning_content is None


def test_refusal_with_text_reports_the_text() -> None:
    body = {"stop_reason": "refusal", "content": [{"type": "text", "text": "I can't help with that."}]}
    assert DIALECT.normalize(body).refusal == "I can't help with that."


@pytest.mark.parametrize(
    ("stop_reason", "normalized"),
    [
        ("end_turn", "stop"), ("stop_sequence", "stop"), ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"), ("tool_use", "tool_calls"), ("refusal", "content_filter"),
        ("pause_turn", "other"), ("something_new", "other"), (None, None),
    ],
)
def test_stop_reason_maps_to_normalized_finish_reason(stop_reason: str | None, normalized: str | None) -> None:
    assert DIALECT.normalize({"stop_reason": stop_reason}).finish_reason_normalized == normalized


@pytest.mark.parametrize(
    ("usage", "tokens_in"),
    [
        ({}, None),
        ({"input_tokens": 5}, 5),
        ({"input_tokens": 100, "cache_read_input_tokens": 200, "cache_creation_input_tokens": 30}, 330),
        ({"input_tokens": 100, "cache_creation_input_tokens": 30}, 130),
        ({"cache_read_input_tokens": 500}, 500),
        ({"cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}, None),
        ({"input_tokens": True, "cache_read_input_tokens": -3}, None),
        ({"output_tokens": 7}, None),
    ],
)
def test_cache_fold_rule(usage: dict[str, Any], tokens_in: int | None) -> None:
    assert DIALECT.normalize({"usage": usage}).usage.tokens_in == tokens_in


def test_dialect_owns_the_messages_path_and_limits_max_tokens() -> None:
    assert MessagesDialect.name == "messages"
    assert MessagesDialect.paths == frozenset({"/v1/messages"})
    assert MessagesDialect.path_suffixes == ("/messages",)
    assert MessagesDialect.max_tokens_keys == ("max_tokens",)
    assert DIALECT.stream_assembler() is not DIALECT.stream_assembler()


# --- properties -----------------------------------------------------------------------------

PROPERTY_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _end_of(exchange: RecordedExchange, event_type: str) -> int:
    """Byte offset just past the JSON of the first `event_type` event's data line."""
    body = exchange.body_bytes
    at = body.index(f'"type":"{event_type}"'.encode())
    line_end = body.index(b"\n", at)
    return body.rindex(b"}", at, line_end) + 1


@PROPERTY_SETTINGS
@given(st.data())
def test_any_split_into_chunks_gives_the_same_result(data: st.DataObject) -> None:
    exchange = data.draw(st.sampled_from(STREAMS), label="fixture")
    body = exchange.body_bytes
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=40), label="cuts"))
    decoder, assembler = SSEDecoder(), DIALECT.stream_assembler()
    for start, end in zip([0, *cuts], [*cuts, len(body)]):
        for event in decoder.feed(body[start:end]):
            assembler.feed(event)
    for event in decoder.close():
        assembler.feed(event)
    assert (assembler.result(), assembler.terminal, assembler.malformed_events) == _reference(exchange.name)


@PROPERTY_SETTINGS
@given(st.data())
def test_stream_cut_at_any_byte_keeps_a_prefix_of_what_was_sent(data: st.DataObject) -> None:
    exchange = data.draw(st.sampled_from(STREAMS), label="fixture")
    body = exchange.body_bytes
    cut = data.draw(st.integers(0, len(body)), label="cut")
    assembler = _assemble(body[:cut])
    full, _, _ = _reference(exchange.name)
    assert full is not None
    expected_terminal = "completed" if cut >= _end_of(exchange, "message_stop") else None
    assert assembler.terminal == expected_terminal

    partial = assembler.result()
    if cut < _end_of(exchange, "message_start"):
        assert partial is None
        return
    assert partial is not None
    whole, part = DIALECT.normalize(full), DIALECT.normalize(partial)
    assert part.response_id == whole.response_id
    assert (whole.output_text or "").startswith(part.output_text or "")
    assert (whole.reasoning_content or "").startswith(part.reasoning_content or "")
    full_json = {call_id: text for _, call_id, _, text in expected_from(exchange.name).raw_tool_calls}
    for call in part.tool_calls:
        assert call.call_id in full_json
        raw = call.arguments.get("_raw")
        if raw is not None:
            assert full_json[call.call_id].startswith(raw)
        else:
            assert call.arguments in ({}, json.loads(full_json[call.call_id]))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_TYPES = st.sampled_from(
    ["message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
     "message_stop", "ping", "error", "text", "thinking", "tool_use", "server_tool_use", "redacted_thinking",
     "text_delta", "thinking_delta", "input_json_delta", "signature_delta", "citations_delta", "refusal"]
)


def _shaped(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts with the keys this dialect reads, holding values of any JSON type."""
    keys = st.sampled_from(
        ["type", "index", "message", "content_block", "delta", "usage", "error", "content", "text", "thinking",
         "partial_json", "signature", "citation", "id", "name", "input", "stop_reason", "input_tokens",
         "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "output_tokens_details",
         "stop_details", "thinking_tokens", "explanation", "prompt_token_ids", "token_ids"]
    )
    return st.dictionaries(keys, inner | _TYPES | st.integers(0, 3), max_size=6)


_SHAPED_JSON = st.recursive(_JSON, lambda inner: _shaped(inner) | st.lists(inner, max_size=4), max_leaves=25)


@PROPERTY_SETTINGS
@given(st.lists(st.tuples(st.none() | _TYPES, _SHAPED_JSON.map(json.dumps) | st.text(max_size=20)), max_size=25))
def test_malformed_events_never_raise(events: list[tuple[str | None, str]]) -> None:
    assembler = DIALECT.stream_assembler()
    for name, data in events:
        assembler.feed(SSEEvent(name, data))
    result = assembler.result()
    assert result is None or isinstance(result, dict)
    if result is not None:
        assert isinstance(DIALECT.normalize(result).tool_calls, list)
    assert assembler.terminal in (None, "completed", "error")
    # Every event whose data is not a JSON object (outside an `error` event) is counted, never silently dropped.
    not_objects = [data for name, data in events if name != "error" and not _is_json_object(data)
                   and data.strip() not in ("", "[DONE]")]
    assert assembler.malformed_events >= len(not_objects)


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


@PROPERTY_SETTINGS
@given(st.data())
def test_unparseable_events_are_counted_and_change_nothing(data: st.DataObject) -> None:
    exchange = data.draw(st.sampled_from(STREAMS), label="fixture")
    garbage = st.text(min_size=1, max_size=20).filter(lambda s: not _is_json(s) and s.strip() != "[DONE]")
    events = decode_sse(exchange.body_bytes)
    inserted = data.draw(st.lists(st.tuples(st.integers(0, len(events)), garbage), max_size=10), label="garbage")
    for position, text in sorted(inserted, reverse=True):
        events.insert(position, SSEEvent(None, text))
    assembler = _feed(*events)
    result, terminal, malformed = _reference(exchange.name)
    assert (assembler.result(), assembler.terminal) == (result, terminal)
    assert assembler.malformed_events == malformed + len(inserted)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@PROPERTY_SETTINGS
@given(_SHAPED_JSON)
def test_normalize_never_raises_on_any_json_value(value: Any) -> None:
    normalized = DIALECT.normalize(value)
    assert normalized.finish_reason_normalized in (None, *FINISH_REASONS)
    assert all(isinstance(call.arguments, dict) for call in normalized.tool_calls)


def _message_event(payload: dict[str, Any], named: bool, spaced: bool, ascii_only: bool, padding: str = "") -> bytes:
    """One event as Anthropic writes it, `padding` before the last brace (spaces there, in the API)."""
    text = json.dumps(payload, separators=(", ", ": ") if spaced else (",", ":"), ensure_ascii=ascii_only)
    name = b"event: " + payload["type"].encode() + b"\n" if named else b""
    return name + b"data: " + (text[:-1] + padding + text[-1]).encode() + b"\n\n"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    deltas=st.lists(
        st.tuples(TRICKY_TOKENS, st.sampled_from(["thinking", "text", "text", "restart"]), st.sampled_from(["", "", "   ", "\t ", "\x0c"])),
        max_size=25,
    ),
    named=st.booleans(),
    spaced=st.booleans(),
    ascii_only=st.booleans(),
)
def test_text_and_thinking_deltas_read_through_a_learnt_template_rebuild_what_the_general_path_does(
    deltas: list[tuple[str, str, str]], named: bool, spaced: bool, ascii_only: bool
) -> None:
    """Thinking in block 0 and text in block 1, interleaved, with tricky texts and padding (a form
    feed makes an event malformed); a `restart` starts block 1 again, as a broken stream might:
    the learnt template must not outlive it."""
    def event(payload: dict[str, Any]) -> bytes:
        return _message_event(payload, named, spaced, ascii_only)

    chunks = [
        event({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                                                    "content": [], "model": "claude", "usage": {"input_tokens": 3}}}),
        event({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
        event({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
    ]
    for token, kind, padding in deltas:
        if kind == "restart":
            chunks.append(event({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}))
            continue
        index, delta_type = (0, "thinking_delta") if kind == "thinking" else (1, "text_delta")
        delta = {"type": "content_block_delta", "index": index, "delta": {"type": delta_type, kind: token}}
        chunks.append(_message_event(delta, named, spaced, ascii_only, padding))
    chunks += [
        event({"type": "content_block_stop", "index": 0}),
        event({"type": "content_block_stop", "index": 1}),
        event({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}}),
        event({"type": "message_stop"}),
    ]
    assert_templates_change_nothing(DIALECT, chunks)


def test_padded_deltas_escaped_or_not_are_read_through_the_template_after_the_first() -> None:
    """Anthropic pads each event with a varying run of spaces; escaped texts (line breaks, quotes)
    still fit the template learnt from the first plain delta."""
    texts = [f" w{n}" if n % 2 == 0 else ESCAPED_TOKENS[n % len(ESCAPED_TOKENS)] for n in range(40)]
    start = {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                                                  "content": [], "model": "claude", "usage": {"input_tokens": 3}}}
    chunks = [_message_event(start, True, False, True),
              _message_event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                             True, False, True)]
    for number, text in enumerate(texts):
        delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
        chunks.append(_message_event(delta, True, False, True, padding=" " * (number % 7)))
    chunks += [_message_event({"type": "content_block_stop", "index": 0}, True, False, True),
               _message_event({"type": "message_stop"}, True, False, True)]
    outcome, parsed = track_counting_parses(DIALECT, messages_module, chunks)
    assert outcome is not None and outcome.terminal == "completed"
    assert outcome.response is not None and outcome.response["content"][0]["text"] == "".join(texts)
    assert parsed == 5  # message_start, block start, the first delta, block stop, message_stop
