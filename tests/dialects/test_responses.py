"""The Responses dialect against every recorded /v1/responses exchange, plus synthetic edge cases.

Expectations for recorded streams are derived here from the raw events (the terminal envelope, the
deltas concatenated), never by running the dialect a second time.
"""

from __future__ import annotations

import json
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llmtap.dialects.responses_stream as responses_module
from llmtap.dialects.base import Normalized
from llmtap.dialects.responses import ResponsesAssembler, ResponsesDialect
from llmtap.dialects.sse import SSEDecoder, SSEEvent, decode_sse
from tests.dialects.token_streams import (
    ESCAPED_TOKENS,
    TRICKY_TOKENS,
    assert_templates_change_nothing,
    track_counting_parses,
)
from tests.fixtures import RecordedExchange, fixture, fixtures_for

DIALECT = ResponsesDialect()
STREAMS = fixtures_for("responses", stream=True)
BODIES = fixtures_for("responses", stream=False)
TERMINAL_TYPES = {"response.completed", "response.incomplete", "response.failed", "error"}


def assemble(events: list[SSEEvent]) -> ResponsesAssembler:
    assembler = DIALECT.stream_assembler()
    for event in events:
        assembler.feed(event)
    return assembler


def raw_events(exchange: RecordedExchange) -> list[dict[str, Any]]:
    return [json.loads(event.data) for event in decode_sse(exchange.body_bytes)]


def terminal_envelope(events: list[dict[str, Any]]) -> dict[str, Any]:
    found: list[dict[str, Any]] = [event["response"] for event in events if event["type"] in TERMINAL_TYPES]
    assert found, "every recorded stream ends with a terminal envelope"
    return found[-1]


def joined_deltas(events: list[dict[str, Any]], kind: str | None = None, item_id: str | None = None) -> str:
    return "".join(
        e["delta"]
        for e in events
        if (kind is None or e["type"] == kind) and (item_id is None or e["item_id"] == item_id)
    )


def sse(events: list[dict[str, Any]], *, named: bool = True) -> bytes:
    """Encode events the way the API sends them (optionally without `event:` lines)."""
    lines = []
    for event in events:
        if named:
            lines.append(f"event: {event['type']}")
        lines.append(f"data: {json.dumps(event)}")
        lines.append("")
    return ("\n".join(lines) + "\n").encode()


def feed_bytes(body: bytes) -> ResponsesAssembler:
    return assemble(decode_sse(body))


def normalize_stream_body(body: bytes) -> Normalized:
    return DIALECT.normalize(feed_bytes(body).result() or {})


def added_items(events: list[dict[str, Any]], item_type: str) -> list[dict[str, Any]]:
    return [e["item"] for e in events if e["type"] == "response.output_item.added" and e["item"]["type"] == item_type]


# ---------------------------------------------------------------- recorded streams


@pytest.mark.parametrize("exchange", STREAMS, ids=lambda f: f.name)
def test_stream_reassembles_to_the_terminal_envelope(exchange: RecordedExchange) -> None:
    events = raw_events(exchange)
    envelope = terminal_envelope(events)
    assembler = feed_bytes(exchange.body_bytes)
    result = assembler.result()
    assert result is not None
    assert assembler.malformed_events == 0
    assert assembler.terminal == {"completed": "completed", "incomplete": "incomplete"}[envelope["status"]]
    assert result["id"] == envelope["id"]
    assert result["output"] == envelope["output"]


@pytest.mark.parametrize("exchange", STREAMS, ids=lambda f: f.name)
def test_stream_normalizes_usage_id_and_finish_reason_as_reported(exchange: RecordedExchange) -> None:
    envelope = terminal_envelope(raw_events(exchange))
    normalized = normalize_stream_body(exchange.body_bytes)
    usage = envelope["usage"]
    assert normalized.response_id == envelope["id"]
    assert normalized.model == envelope["model"]
    assert normalized.response_status == envelope["status"]
    assert normalized.usage.tokens_in == usage["input_tokens"]
    assert normalized.usage.tokens_out == usage["output_tokens"]
    assert normalized.usage.tokens_total == usage["total_tokens"]
    assert normalized.usage.tokens_reasoning == usage["output_tokens_details"]["reasoning_tokens"]
    assert normalized.usage.cached_tokens == usage["input_tokens_details"]["cached_tokens"]
    details = envelope["incomplete_details"]
    # The raw finish reason is the provider's own: `incomplete_details.reason`, null unless incomplete.
    assert normalized.finish_reason == (details["reason"] if envelope["status"] == "incomplete" else None)
    assert normalized.error is None


@pytest.mark.parametrize("exchange", STREAMS, ids=lambda f: f.name)
def test_stream_text_equals_the_streamed_text_deltas(exchange: RecordedExchange) -> None:
    events = raw_events(exchange)
    normalized = normalize_stream_body(exchange.body_bytes)
    assert (normalized.output_text or "") == joined_deltas(events, "response.output_text.delta")


@pytest.mark.parametrize("exchange", STREAMS, ids=lambda f: f.name)
def test_stream_tool_calls_match_the_streamed_items_and_argument_deltas(exchange: RecordedExchange) -> None:
    events = raw_events(exchange)
    argument_deltas = [e for e in events if e["type"] == "response.function_call_arguments.delta"]
    expected = [
        (item["call_id"], item["name"], item["id"], json.loads(joined_deltas(argument_deltas, item_id=item["id"])))
        for item in added_items(events, "function_call")
    ]
    normalized = normalize_stream_body(exchange.body_bytes)
    assert [(c.call_id, c.name, c.item_id, c.arguments) for c in normalized.tool_calls] == expected
    assert normalized.finish_reason_normalized == (
        "tool_calls" if expected else "length" if normalized.finish_reason == "max_output_tokens" else "stop"
    )


@pytest.mark.parametrize("exchange", STREAMS, ids=lambda f: f.name)
def test_stream_reasoning_summary_equals_the_summary_deltas(exchange: RecordedExchange) -> None:
    events = raw_events(exchange)
    summaries: dict[tuple[str, int], str] = {}
    for event in events:
        if event["type"] == "response.reasoning_summary_text.delta":
            key = (event["item_id"], event["summary_index"])
            summaries[key] = summaries.get(key, "") + event["delta"]
    reasoning_items = added_items(events, "reasoning")
    normalized = normalize_stream_body(exchange.body_bytes)
    assert normalized.reasoning_content == ("\n".join(summaries.values()) or None)
    readable = {item_id for item_id, _ in summaries}
    assert normalized.reasoning_redacted_blocks == sum(1 for item in reasoning_items if item["id"] not in readable)


@pytest.mark.parametrize("exchange", STREAMS, ids=lambda f: f.name)
def test_stream_served_ids_are_item_then_call_ids_in_order(exchange: RecordedExchange) -> None:
    output = terminal_envelope(raw_events(exchange))["output"]
    expected: list[str] = []
    for item in output:
        for key in ("id", "call_id"):
            if item.get(key) and item[key] not in expected:
                expected.append(item[key])
    assert normalize_stream_body(exchange.body_bytes).served_item_ids == expected


@pytest.mark.parametrize("exchange", STREAMS, ids=lambda f: f.name)
def test_data_only_stream_detects_the_same_terminal(exchange: RecordedExchange) -> None:
    named = feed_bytes(exchange.body_bytes)
    unnamed = feed_bytes(sse(raw_events(exchange), named=False))
    assert unnamed.terminal == named.terminal is not None
    assert unnamed.result() == named.result()


@pytest.mark.parametrize("exchange", STREAMS, ids=lambda f: f.name)
def test_stream_without_its_terminal_rebuilds_the_items_the_provider_finished(exchange: RecordedExchange) -> None:
    events = decode_sse(exchange.body_bytes)[:-1]
    done_items = [
        json.loads(e.data)["item"] for e in events if json.loads(e.data)["type"] == "response.output_item.done"
    ]
    assembler = assemble(events)
    result = assembler.result()
    assert assembler.terminal is None
    assert result is not None and result["output"] == done_items
    envelopes = [json.loads(e.data)["response"] for e in events if "response" in json.loads(e.data)]
    assert result["status"] == envelopes[-1]["status"]


def test_recorded_incomplete_stream_is_incomplete_with_length_finish() -> None:
    assembler = feed_bytes(fixture("responses/incomplete-max-output-tokens-stream-gpt4o").body_bytes)
    normalized = DIALECT.normalize(assembler.result() or {})
    assert assembler.terminal == "incomplete"
    assert normalized.finish_reason == "max_output_tokens"
    assert normalized.finish_reason_normalized == "length"
    assert normalized.output_text == "In the bustling city of Detroit, a sleek, metallic blue sedan rolled off the"


def test_recorded_stream_without_terminal_is_rebuilt_from_items_with_status_in_progress() -> None:
    events = decode_sse(fixture("responses/function-call-stream-gpt55").body_bytes)
    assembler = assemble(events[:-1])
    result = assembler.result()
    normalized = DIALECT.normalize(result or {})
    assert assembler.terminal is None
    assert result is not None and result["status"] == "in_progress"
    assert normalized.finish_reason_normalized == "other"
    assert [c.as_dict() for c in normalized.tool_calls] == [
        {
            "call_id": "call_sVidsfFJ6zlzRpelrPkTPlpd",
            "name": "multiply",
            "arguments": {"a": 1231, "b": 2331},
            "item_id": "fc_00d64fa806f333310169fab1bf324481a0852cda3180856290",
        }
    ]
    assert normalized.usage.tokens_in is None and normalized.usage.tokens_total is None


# ---------------------------------------------------------------- recorded bodies


def output_items(body: dict[str, Any], item_type: str) -> list[dict[str, Any]]:
    return [item for item in body.get("output", []) if item["type"] == item_type]


@pytest.mark.parametrize("exchange", [f for f in BODIES if f.status == 200], ids=lambda f: f.name)
def test_body_normalizes_to_its_own_fields(exchange: RecordedExchange) -> None:
    body = json.loads(exchange.body_text)
    normalized = DIALECT.normalize(body)
    assert normalized.response_id == body["id"]
    assert normalized.model == body["model"]
    assert normalized.usage.tokens_in == body["usage"]["input_tokens"]
    assert normalized.usage.tokens_out == body["usage"]["output_tokens"]
    assert normalized.usage.tokens_total == body["usage"]["total_tokens"]
    texts = [p["text"] for m in output_items(body, "message") for p in m["content"] if p["type"] == "output_text"]
    assert normalized.output_text == ("".join(texts) if texts else None)
    calls = output_items(body, "function_call")
    assert [(c.call_id, c.name, c.arguments) for c in normalized.tool_calls if c.type == "function"] == [
        (c["call_id"], c["name"], json.loads(c["arguments"])) for c in calls
    ]
    assert normalized.error is None


@pytest.mark.parametrize("exchange", [f for f in BODIES if f.status >= 400], ids=lambda f: f.name)
def test_error_body_fills_error_and_nothing_else(exchange: RecordedExchange) -> None:
    body = json.loads(exchange.body_text)
    normalized = DIALECT.normalize(body)
    assert normalized.error == body["error"]
    assert normalized.finish_reason_normalized == "error"
    assert normalized.usage.tokens_in is None and normalized.usage.tokens_total is None
    assert normalized.tool_calls == [] and normalized.output_text is None


def test_function_call_body_gives_call_id_name_and_parsed_arguments() -> None:
    normalized = DIALECT.normalize(json.loads(fixture("responses/function-call-gpt55").body_text))
    assert [c.as_dict() for c in normalized.tool_calls] == [
        {
            "call_id": "call_nJmCK7SJe3ajdYYplIbH0KgL",
            "name": "multiply",
            "arguments": {"a": 1231, "b": 2331},
            "item_id": "fc_05c01d5dceb461c50169fab1bc6a208196a8f7957526d1ef99",
        }
    ]
    assert normalized.finish_reason is None  # a completed response names no reason of its own
    assert normalized.finish_reason_normalized == "tool_calls"


def test_parallel_function_calls_keep_both_calls_apart() -> None:
    normalized = DIALECT.normalize(json.loads(fixture("responses/parallel-function-calls-gpt4o").body_text))
    assert [(c.call_id, c.name) for c in normalized.tool_calls] == [
        ("call_IAQ7c0mnAiAE89MUQa42HQy4", "add"),
        ("call_gXYDdXX5Ld6zWOSpIAh0QHPr", "multiply"),
    ]


def test_custom_tool_call_keeps_free_form_input_raw() -> None:
    normalized = DIALECT.normalize(json.loads(fixture("responses/custom-tool-call-gpt5").body_text))
    assert [c.as_dict() for c in normalized.tool_calls] == [
        {
            "call_id": "call_H8YsBUDPYjNHSq9fWOzwetxr",
            "name": "math_exp",
            "arguments": {"_raw": "4 + 4"},
            "type": "custom",
            "item_id": "ctc_68a72e3c68288196acdc4941bb01aba5075c9fca6967ac8b",
        }
    ]
    assert normalized.finish_reason_normalized == "tool_calls"
    assert normalized.reasoning_redacted_blocks == 1


def test_incomplete_body_reports_length_cache_writes_and_hidden_reasoning() -> None:
    normalized = DIALECT.normalize(
        json.loads(fixture("responses/incomplete-max-output-tokens-reasoning-gpt56").body_text)
    )
    assert normalized.response_status == "incomplete"
    assert normalized.finish_reason == "max_output_tokens"
    assert normalized.finish_reason_normalized == "length"
    assert normalized.usage.tokens_in == 1220
    assert normalized.usage.cache_creation_tokens == 1217
    assert normalized.usage.cached_tokens == 0
    assert normalized.usage.tokens_reasoning == 54
    assert normalized.reasoning_redacted_blocks == 1


def test_cached_tokens_are_inside_tokens_in() -> None:
    usage = DIALECT.normalize(json.loads(fixture("responses/cached-tokens-gpt4o").body_text)).usage
    assert (usage.tokens_in, usage.cached_tokens, usage.tokens_out, usage.tokens_total) == (1515, 1390, 8, 1523)
    assert usage.cache_creation_tokens is None


def test_reasoning_summary_is_read_and_encrypted_only_reasoning_is_counted() -> None:
    summary = DIALECT.normalize(json.loads(fixture("responses/reasoning-summary-function-call-gpt5").body_text))
    encrypted = DIALECT.normalize(json.loads(fixture("responses/reasoning-encrypted-function-call-gpt55").body_text))
    assert summary.reasoning_content is not None
    assert summary.reasoning_content.startswith("**Checking weather in Florence**")
    assert summary.reasoning_redacted_blocks == 0
    assert encrypted.reasoning_content is None
    assert encrypted.reasoning_redacted_blocks == 1


def test_built_in_tool_items_are_served_ids_not_tool_calls() -> None:
    normalized = DIALECT.normalize(json.loads(fixture("responses/web-search-gpt41").body_text))
    assert normalized.tool_calls == []
    assert normalized.finish_reason_normalized == "stop"
    assert normalized.served_item_ids == [
        "ws_032814a9038cfb27016a3c13ad26608192bf08bba827aa04d2",
        "msg_032814a9038cfb27016a3c13b1005481928ac017f3e5b8f7eb",
    ]


def test_text_body_gives_output_text_and_stop() -> None:
    normalized = DIALECT.normalize(json.loads(fixture("responses/text-basic-gpt55").body_text))
    assert normalized.output_text == "pong"
    assert normalized.finish_reason_normalized == "stop"
    assert normalized.refusal is None


# ---------------------------------------------------------------- synthetic streams (gaps in the recordings)

RESP: dict[str, Any] = {"id": "resp_1", "model": "m", "status": "in_progress", "output": [], "usage": None}


def created() -> dict[str, Any]:
    return {"type": "response.created", "response": dict(RESP)}


def added(index: int, **item: Any) -> dict[str, Any]:
    return {"type": "response.output_item.added", "output_index": index, "item": item}


def delta(kind: str, index: int, item_id: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"type": f"response.{kind}.delta", "output_index": index, "item_id": item_id, "delta": text, **extra}


def message_events(item_id: str, index: int, deltas: list[str], part_type: str = "output_text") -> list[dict[str, Any]]:
    key, kind = ("refusal", "refusal") if part_type == "refusal" else ("text", "output_text")
    part_added = {"type": "response.content_part.added", "output_index": index, "item_id": item_id}
    return [
        added(index, id=item_id, type="message", role="assistant", status="in_progress", content=[]),
        {**part_added, "content_index": 0, "part": {"type": part_type, key: ""}},
        *(delta(kind, index, item_id, text, content_index=0) for text in deltas),
    ]


def normalized_stream(events: list[dict[str, Any]]) -> Normalized:
    return DIALECT.normalize(feed_bytes(sse(events)).result() or {})


def test_error_event_mid_stream_is_an_error_terminal_that_keeps_partial_text() -> None:
    error = {"type": "error", "code": "server_error", "message": "The server had an error.", "param": None}
    assembler = feed_bytes(sse([created(), *message_events("msg_1", 0, ["Hel", "lo"]), error]))
    normalized = DIALECT.normalize(assembler.result() or {})
    assert assembler.terminal == "error"
    assert normalized.error == {"code": "server_error", "message": "The server had an error.", "param": None}
    assert normalized.finish_reason_normalized == "error"
    assert normalized.output_text == "Hello"


def test_failed_response_is_an_error_terminal_with_the_provider_error() -> None:
    failed = dict(RESP, status="failed", error={"code": "server_error", "message": "boom"})
    assembler = feed_bytes(sse([created(), {"type": "response.failed", "response": failed}], named=False))
    normalized = DIALECT.normalize(assembler.result() or {})
    assert assembler.terminal == "error"
    assert normalized.error == {"code": "server_error", "message": "boom"}
    assert (normalized.finish_reason, normalized.finish_reason_normalized) == (None, "error")


def test_terminal_envelope_without_output_gets_the_streamed_items() -> None:
    completed = {"type": "response.completed", "response": dict(RESP, status="completed", output=[])}
    result = feed_bytes(sse([created(), *message_events("msg_1", 0, ["a", "b"]), completed])).result()
    assert result is not None and result["status"] == "completed"
    assert result["output"][0]["content"][0]["text"] == "ab"


def test_refusal_deltas_become_the_refusal() -> None:
    normalized = normalized_stream([created(), *message_events("msg_1", 0, ["I can", "'t"], "refusal")])
    assert normalized.refusal == "I can't"
    assert normalized.output_text is None


def test_output_text_logprobs_accumulate_across_deltas() -> None:
    events = message_events("msg_1", 0, [])
    events += [
        delta("output_text", 0, "msg_1", "a", content_index=0, logprobs=[{"token": "a", "logprob": -0.1}]),
        delta("output_text", 0, "msg_1", "b", content_index=0, logprobs=[{"token": "b", "logprob": -0.2}]),
    ]
    result = feed_bytes(sse([created(), *events])).result()
    assert result is not None
    assert result["output"][0]["content"][0]["logprobs"] == [
        {"token": "a", "logprob": -0.1},
        {"token": "b", "logprob": -0.2},
    ]


def test_interleaved_parallel_call_deltas_never_collide() -> None:
    events = [
        created(),
        added(0, id="fc_1", type="function_call", call_id="call_1", name="add", arguments=""),
        added(1, id="fc_2", type="function_call", call_id="call_2", name="mul", arguments=""),
    ]
    for fragment_1, fragment_2 in [('{"a":', '{"b":'), ("1}", "2}")]:
        events.append(delta("function_call_arguments", 0, "fc_1", fragment_1))
        events.append(delta("function_call_arguments", 1, "fc_2", fragment_2))
    assert [(c.call_id, c.name, c.arguments) for c in normalized_stream(events).tool_calls] == [
        ("call_1", "add", {"a": 1}),
        ("call_2", "mul", {"b": 2}),
    ]


def test_cut_tool_arguments_are_kept_raw() -> None:
    events = [
        created(),
        added(0, id="fc_1", type="function_call", call_id="call_1", name="f", arguments=""),
        delta("function_call_arguments", 0, "fc_1", '{"q": "par'),
    ]
    assert normalized_stream(events).tool_calls[0].arguments == {"_raw": '{"q": "par'}


def test_custom_tool_input_deltas_rebuild_the_input() -> None:
    events = [
        created(),
        added(0, id="ctc_1", type="custom_tool_call", call_id="call_1", name="exec", input=""),
        delta("custom_tool_call_input", 0, "ctc_1", "ls "),
        delta("custom_tool_call_input", 0, "ctc_1", "-la"),
    ]
    assert [(c.type, c.arguments) for c in normalized_stream(events).tool_calls] == [("custom", {"_raw": "ls -la"})]


def test_reasoning_text_deltas_become_reasoning_content() -> None:
    events = [
        created(),
        added(0, id="rs_1", type="reasoning", summary=[], content=[]),
        *(delta("reasoning_text", 0, "rs_1", text, content_index=0) for text in ["think", "ing"]),
    ]
    normalized = normalized_stream(events)
    assert normalized.reasoning_content == "thinking"
    assert normalized.reasoning_redacted_blocks == 0


def test_deltas_without_announced_items_are_still_kept() -> None:
    events = [{"type": "response.output_text.delta", "item_id": "msg_9", "delta": text} for text in ["x", "y"]]
    assert normalized_stream(events).output_text == "xy"


def test_non_json_and_mistyped_events_are_counted_not_raised() -> None:
    assembler = DIALECT.stream_assembler()
    assembler.feed(SSEEvent("response.output_text.delta", "{not json"))
    assembler.feed(SSEEvent(None, "[1, 2]"))
    assembler.feed(SSEEvent(None, json.dumps({"type": "response.output_text.delta", "output_index": 0, "delta": 5})))
    assembler.feed(SSEEvent(None, json.dumps({"type": "response.completed", "response": "nope"})))
    assembler.feed(SSEEvent(None, "[DONE]"))
    assert assembler.malformed_events == 4
    assert assembler.terminal == "completed"


def test_nothing_learned_gives_no_result() -> None:
    assembler = DIALECT.stream_assembler()
    assert assembler.result() is None
    assembler.feed(SSEEvent("ping", "{not json"))
    assert assembler.result() is None


def test_unreadable_error_event_is_still_an_error() -> None:
    assembler = DIALECT.stream_assembler()
    assembler.feed(SSEEvent("error", "upstream overloaded"))
    assert assembler.terminal == "error"
    assert DIALECT.normalize(assembler.result() or {}).error == {"message": "upstream overloaded"}


def test_token_ids_are_read_from_the_top_level_or_the_one_training_item() -> None:
    top = DIALECT.normalize({"prompt_token_ids": [1, 2], "token_ids": [3], "output": []})
    carrier = {"type": "message", "id": "msg_1", "content": [], "prompt_token_ids": [1], "generation_token_ids": [7, 8]}
    item = DIALECT.normalize({"output": [carrier]})
    ambiguous = DIALECT.normalize({"output": [carrier, dict(carrier, id="msg_2")]})
    assert (top.prompt_token_ids, top.completion_token_ids) == ([1, 2], [3])
    assert (item.prompt_token_ids, item.completion_token_ids) == ([1], [7, 8])
    assert (ambiguous.prompt_token_ids, ambiguous.completion_token_ids) == (None, None)


def test_served_ids_never_repeat_when_item_id_equals_call_id() -> None:
    call = {"type": "function_call", "id": "call_1", "call_id": "call_1", "name": "f", "arguments": "{}"}
    assert DIALECT.normalize({"status": "completed", "output": [call]}).served_item_ids == ["call_1"]


def test_unreported_usage_is_none_never_zero() -> None:
    usage = DIALECT.normalize({"status": "completed", "usage": {"input_tokens": 3}}).usage
    assert (usage.tokens_in, usage.tokens_out, usage.tokens_total, usage.cached_tokens) == (3, None, None, None)


def test_dialect_declares_its_paths_and_a_fresh_assembler_each_time() -> None:
    assert (DIALECT.name, DIALECT.paths, DIALECT.path_suffixes) == (
        "responses",
        frozenset({"/v1/responses"}),
        ("/responses",),
    )
    assert DIALECT.max_tokens_keys == ("max_output_tokens",)
    assert DIALECT.stream_assembler() is not DIALECT.stream_assembler()


# ---------------------------------------------------------------- properties

PROPERTY_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def whole(exchange: RecordedExchange) -> ResponsesAssembler:
    return feed_bytes(exchange.body_bytes)


@PROPERTY_SETTINGS
@given(exchange=st.sampled_from(STREAMS), data=st.data())
def test_any_chunking_of_a_recorded_stream_gives_the_same_result(
    exchange: RecordedExchange, data: st.DataObject
) -> None:
    body = exchange.body_bytes
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=40)))
    decoder, assembler = SSEDecoder(), DIALECT.stream_assembler()
    texts: list[str] = []
    for start, end in zip([0, *cuts], [*cuts, len(body)], strict=True):
        for event in decoder.feed(body[start:end]):
            assembler.feed(event)
        # Reading the result mid-stream must not disturb the reassembly.
        texts.append(DIALECT.normalize(assembler.result() or {}).output_text or "")
    for event in decoder.close():
        assembler.feed(event)
    reference = whole(exchange)
    assert all(later.startswith(earlier) for earlier, later in pairwise(texts))
    assert assembler.result() == reference.result()
    assert (assembler.terminal, assembler.malformed_events) == (reference.terminal, reference.malformed_events)


def partial_expectations(prefix: bytes) -> tuple[str, bool]:
    """Text the raw events of a cut stream carry, and whether any event parsed at all."""
    texts, parsed = [], False
    for event in decode_sse(prefix):
        try:
            payload = json.loads(event.data)
        except ValueError:
            continue
        parsed = True
        if payload.get("type") == "response.output_text.delta":
            texts.append(payload["delta"])
    return "".join(texts), parsed


@PROPERTY_SETTINGS
@given(exchange=st.sampled_from(STREAMS), data=st.data())
def test_a_stream_cut_at_any_byte_keeps_its_partial_content(exchange: RecordedExchange, data: st.DataObject) -> None:
    body = exchange.body_bytes
    cut = data.draw(st.integers(0, len(body)))
    terminal_data_line = body.rfind(b"\ndata: ") + 1
    terminal_end = body.find(b"\n", terminal_data_line)
    assembler = feed_bytes(body[:cut])
    reference = whole(exchange)
    partial = DIALECT.normalize(assembler.result() or {})
    full = DIALECT.normalize(reference.result() or {})
    assert assembler.terminal == (reference.terminal if cut >= terminal_end else None)
    expected_text, parsed = partial_expectations(body[:cut])
    assert (assembler.result() is not None) == parsed
    assert (full.output_text or "").startswith(partial.output_text or "")
    assert (full.reasoning_content or "").startswith(partial.reasoning_content or "")
    if assembler.terminal is None:
        assert (partial.output_text or "") == expected_text
    full_arguments = {
        item["id"]: item["arguments"]
        for item in (reference.result() or {})["output"]
        if item["type"] == "function_call"
    }
    for item in (assembler.result() or {}).get("output", []):
        if item.get("type") == "function_call":
            assert full_arguments[item["id"]].startswith(item["arguments"])


JSON_LEAVES = st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=5)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
EVENT_KEYS = [
    "type",
    "response",
    "item",
    "output_index",
    "item_id",
    "content_index",
    "summary_index",
    "delta",
    "text",
    "part",
    "arguments",
    "input",
    "annotation",
    "logprobs",
    "error",
    "output",
    "status",
    "code",
]
EVENT_TYPES = [
    "response.created",
    "response.completed",
    "response.failed",
    "error",
    "response.output_item.added",
    "response.output_item.done",
    "response.content_part.added",
    "response.content_part.done",
    "response.output_text.delta",
    "response.output_text.done",
    "response.refusal.delta",
    "response.function_call_arguments.delta",
    "response.reasoning_summary_part.added",
    "response.reasoning_summary_text.delta",
    "response.reasoning_text.done",
    "response.output_text.annotation.added",
    "response.web_search_call.completed",
    "unknown",
]
EVENT_DICTS = st.fixed_dictionaries({"type": st.sampled_from(EVENT_TYPES) | JSON_VALUES}).flatmap(
    lambda base: st.dictionaries(
        st.sampled_from(EVENT_KEYS[1:]), JSON_VALUES | st.sampled_from([0, 1, "msg_1"]), max_size=6
    ).map(lambda rest: {**rest, **base})
)
EVENTS = st.builds(
    SSEEvent,
    st.none() | st.sampled_from(EVENT_TYPES),
    EVENT_DICTS.map(json.dumps) | JSON_VALUES.map(json.dumps) | st.text(max_size=20),
)


@settings(max_examples=300, deadline=None)
@given(events=st.lists(EVENTS, max_size=12))
def test_malformed_events_never_raise_and_the_result_always_normalizes(events: list[SSEEvent]) -> None:
    assembler = assemble(events)
    result = assembler.result()
    assert assembler.malformed_events <= len(events)
    assert result is None or isinstance(result, dict)
    normalized = DIALECT.normalize(result or {})
    assert normalized.finish_reason_normalized in (
        None,
        "stop",
        "length",
        "tool_calls",
        "content_filter",
        "error",
        "other",
    )


@settings(max_examples=300, deadline=None)
@given(
    value=JSON_VALUES
    | st.dictionaries(st.sampled_from(["output", "usage", "error", "status", "incomplete_details", "id"]), JSON_VALUES)
)
def test_normalize_never_raises_on_any_json_value(value: Any) -> None:
    normalized = DIALECT.normalize(value)
    assert all(isinstance(item_id, str) for item_id in normalized.served_item_ids)


@settings(max_examples=150, deadline=None)
@given(exchange=st.sampled_from(STREAMS), data=st.data())
def test_a_recorded_event_with_one_field_replaced_never_raises(exchange: RecordedExchange, data: st.DataObject) -> None:
    events = raw_events(exchange)
    names = [event["type"] for event in events]
    position = data.draw(st.integers(0, len(events) - 1))
    target = events[position]
    inner = target.get("item") or target.get("part") or target.get("response") or target
    key = data.draw(st.sampled_from(sorted(inner)))
    inner[key] = data.draw(JSON_VALUES)
    assembler = assemble([SSEEvent(name, json.dumps(event)) for name, event in zip(names, events, strict=True)])
    normalized = DIALECT.normalize(assembler.result() or {})
    assert assembler.terminal in (None, "completed", "incomplete", "error")
    assert normalized.finish_reason_normalized in (
        None,
        "stop",
        "length",
        "tool_calls",
        "content_filter",
        "error",
        "other",
    )


# Text deltas as OpenAI writes them: `sequence_number` and `obfuscation` change with every event,
# before or after the delta depending on the API's age; the text target may change between deltas.
def _delta(token: str, sequence: int, *, item: int, part: int, kind: str, early: bool, noise: str,
           logprobs: list[Any], spaced: bool, ascii_only: bool) -> bytes:
    head: dict[str, Any] = {"type": kind}
    if early:
        head["sequence_number"] = sequence
    event = {**head, "item_id": f"msg_{item}", "output_index": item, "content_index": part, "delta": token,
             "logprobs": logprobs, "obfuscation": noise}
    if not early:
        event["sequence_number"] = sequence
    text = json.dumps(event, separators=(", ", ": ") if spaced else (",", ":"), ensure_ascii=ascii_only)
    return f"event: {kind}\ndata: {text}\n\n".encode()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    deltas=st.lists(
        st.tuples(
            TRICKY_TOKENS,
            st.sampled_from([(0, 0), (0, 0), (0, 0), (0, 1), (1, 0)]),
            st.sampled_from(["response.output_text.delta"] * 3 + ["response.refusal.delta"]),
            st.text(alphabet="abcXYZ019", max_size=16) | st.sampled_from(['a"b', "\\n", ""]),
            st.sampled_from([[], [], [], [{"token": "x", "logprob": -0.1}]]),
        ),
        max_size=25,
    ),
    early=st.booleans(),
    spaced=st.booleans(),
    ascii_only=st.booleans(),
)
def test_text_deltas_read_through_a_learnt_template_rebuild_what_the_general_path_does(
    deltas: list[tuple[str, tuple[int, int], str, str, list[Any]]], early: bool, spaced: bool, ascii_only: bool
) -> None:
    chunks = [sse([{"type": "response.created", "sequence_number": 0, "response": {"id": "resp_1", "status": "in_progress"}}])]
    for number, (token, (item, part), kind, noise, logprobs) in enumerate(deltas, start=1):
        chunks.append(_delta(token, number, item=item, part=part, kind=kind, early=early, noise=noise,
                             logprobs=logprobs, spaced=spaced, ascii_only=ascii_only))
    chunks.append(sse([{"type": "response.completed", "sequence_number": len(deltas) + 1,
                        "response": {"id": "resp_1", "status": "completed", "output": []}}]))
    assert_templates_change_nothing(DIALECT, chunks)


@pytest.mark.parametrize("early", [True, False], ids=["sequence-number-first", "sequence-number-last"])
def test_a_long_delta_stream_is_read_through_its_template(early: bool) -> None:
    """After the first plain delta, the rest never reach the general path, escaped ones included,
    whatever their sequence numbers and obfuscation."""
    tokens = [f" t{n}" if n % 2 == 0 else ESCAPED_TOKENS[n % len(ESCAPED_TOKENS)] for n in range(60)]
    added = {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
             "item": {"id": "msg_0", "type": "message", "role": "assistant", "content": []}}
    chunks = [sse([added])] + [
        _delta(token, number + 2, item=0, part=0, kind="response.output_text.delta", early=early,
               noise="x" * (number % 9), logprobs=[], spaced=False, ascii_only=True)
        for number, token in enumerate(tokens)
    ]
    chunks.append(sse([{"type": "response.completed", "sequence_number": 99, "response": {"id": "r", "output": []}}]))
    outcome, parsed = track_counting_parses(DIALECT, responses_module, chunks)
    assert outcome is not None and outcome.terminal == "completed" and outcome.response is not None
    assert outcome.response["output"][0]["content"][0]["text"] == "".join(tokens)
    assert parsed == 3  # the item, the first delta and the terminal


@pytest.mark.parametrize("value", ["01", "1.5e", "-", "2 ", '"7"', "1e3", "1.5"])
def test_a_delta_whose_varying_value_is_not_an_integer_is_left_to_the_general_path(value: str) -> None:
    """Not JSON (`01`, `1.5e`, `-`), or some other JSON value: the general path decides, malformed or not."""
    first = _delta(" a", 1, item=0, part=0, kind="response.output_text.delta", early=True, noise="n",
                   logprobs=[], spaced=False, ascii_only=True)
    odd = first.replace(b'"sequence_number":1', b'"sequence_number":' + value.encode()).replace(b" a", b" b")
    assert odd != first
    assert_templates_change_nothing(DIALECT, [first, odd, sse([{"type": "response.completed", "response": {}}])])
