"""Chat Completions dialect: stream reassembly and normalization over every recorded chat exchange."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtap.dialects.base import FINISH_REASONS, Normalized, Usage
from llmtap.dialects.chat import ChatDialect, ChatStreamAssembler
from llmtap.dialects.sse import SSEDecoder, SSEEvent, decode_sse
from llmtap.records import StreamTracker
from tests.dialects.token_streams import ESCAPED_TOKENS, TRICKY_TOKENS, assert_templates_change_nothing
from tests.fixtures import RecordedExchange, fixture, fixtures_for

DIALECT = ChatDialect()
STREAMS = fixtures_for("chat", stream=True)
BODIES = [f for f in fixtures_for("chat", stream=False) if f.status == 200]
ERRORS = [f for f in fixtures_for("chat", stream=False) if f.status >= 400]
DONE_LINE = b"data: [DONE]"


def assemble(body: bytes) -> ChatStreamAssembler:
    assembler = DIALECT.stream_assembler()
    for event in decode_sse(body):
        assembler.feed(event)
    return assembler


def normalized_stream(name: str) -> Normalized:
    return DIALECT.normalize(assemble(fixture(name).body_bytes).result() or {})


def function_call(call_id: str | None, name: str | None, arguments: str, **extra: Any) -> dict[str, Any]:
    """One streamed tool-call delta; `None` leaves the id or name out, as continuation deltas do."""
    fields: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        fields["name"] = name
    return {**extra, **({} if call_id is None else {"id": call_id}), "function": fields}


def sse(*payloads: Any) -> bytes:
    """An event stream with one `data:` line per payload (dicts as JSON, strings verbatim)."""
    lines = [p if isinstance(p, str) else json.dumps(p) for p in payloads]
    return "".join(f"data: {line}\n\n" for line in lines).encode()


def chunk(*choices: dict[str, Any], **envelope: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", **envelope,
            "choices": list(choices)}


def delta(index: int = 0, finish_reason: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"index": index, "delta": fields, "finish_reason": finish_reason}


class RawStream:
    """What the provider sent, read straight from the `data:` lines without the dialect's code."""

    def __init__(self, exchange: RecordedExchange) -> None:
        self.chunks: list[dict[str, Any]] = []
        self.done = False
        for line in exchange.body_text.splitlines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                self.done = True
            else:
                self.chunks.append(json.loads(line[len("data: "):]))
        self.ids = {c["id"] for c in self.chunks}
        usages = [c["usage"] for c in self.chunks if c.get("usage")]
        self.usage = usages[-1] if usages else None
        self.text: dict[int, str | None] = {}
        self.finish: dict[int, str] = {}
        self.calls: dict[tuple[int, int], dict[str, str]] = {}
        for c in self.chunks:
            for choice in c["choices"]:
                i = choice["index"]
                d = choice["delta"]
                self.text.setdefault(i, None)
                if isinstance(d.get("content"), str):
                    self.text[i] = (self.text[i] or "") + d["content"]
                if choice.get("finish_reason"):
                    self.finish[i] = choice["finish_reason"]
                for call in d.get("tool_calls") or []:
                    slot = self.calls.setdefault((i, call["index"]), {"id": "", "name": "", "arguments": ""})
                    slot["id"] = call.get("id") or slot["id"]
                    slot["name"] = call.get("function", {}).get("name") or slot["name"]
                    slot["arguments"] += call.get("function", {}).get("arguments") or ""


# --- the dialect's identity ----------------------------------------------------------------------


def test_dialect_declares_its_paths_and_output_limit_keys() -> None:
    assert (ChatDialect.name, ChatDialect.paths, ChatDialect.path_suffixes) == (
        "chat", frozenset({"/v1/chat/completions"}), ("/chat/completions",))
    assert ChatDialect.max_tokens_keys == ("max_tokens", "max_completion_tokens")


def test_every_recorded_chat_exchange_is_in_one_of_the_suites() -> None:
    assert STREAMS and BODIES and ERRORS
    assert len(STREAMS) + len(BODIES) + len(ERRORS) == len(fixtures_for("chat"))


def test_each_stream_gets_a_fresh_assembler() -> None:
    first = DIALECT.stream_assembler()
    first.feed(SSEEvent(None, "[DONE]"))
    assert DIALECT.stream_assembler().terminal is None and first.terminal == "completed"


# --- every recorded stream -----------------------------------------------------------------------


@pytest.mark.parametrize("exchange", STREAMS, ids=lambda f: f.name)
def test_recorded_stream_reassembles_to_what_the_provider_sent(exchange: RecordedExchange) -> None:
    raw = RawStream(exchange)
    assembler = assemble(exchange.body_bytes)
    completion = assembler.result()
    assert completion is not None
    assert assembler.terminal == ("completed" if raw.done else None)
    assert assembler.malformed_events == 0
    assert [completion["id"]] == sorted(raw.ids)
    assert completion["object"] == "chat.completion"
    assert completion["usage"] == raw.usage
    assert [c["index"] for c in completion["choices"]] == sorted(raw.text)
    for choice in completion["choices"]:
        assert choice["message"]["content"] == raw.text[choice["index"]]
        assert choice["finish_reason"] == raw.finish.get(choice["index"])


@pytest.mark.parametrize("exchange", STREAMS, ids=lambda f: f.name)
def test_recorded_stream_normalizes_usage_tool_calls_and_finish_reason(exchange: RecordedExchange) -> None:
    raw = RawStream(exchange)
    normalized = DIALECT.normalize(assemble(exchange.body_bytes).result() or {})
    assert normalized.response_id in raw.ids
    assert normalized.finish_reason == raw.finish.get(0)
    assert normalized.choice_finish_reasons == [raw.finish.get(i) for i in sorted(raw.text)]
    assert normalized.output_text == (raw.text.get(0) or None)
    if raw.usage is None:
        assert normalized.usage == Usage()
    else:
        assert normalized.usage.tokens_in == raw.usage["prompt_tokens"]
        assert normalized.usage.tokens_out == raw.usage["completion_tokens"]
        assert normalized.usage.tokens_total == raw.usage["total_tokens"]
        assert normalized.usage.cached_tokens == raw.usage["prompt_tokens_details"]["cached_tokens"]
        assert normalized.usage.tokens_reasoning == raw.usage["completion_tokens_details"]["reasoning_tokens"]
    expected_calls = [
        (i, c["id"], c["name"], json.loads(c["arguments"])) for (i, _), c in sorted(raw.calls.items())
    ]
    got_calls = [(c.choice_index, c.call_id, c.name, c.arguments) for c in normalized.tool_calls]
    assert got_calls == expected_calls
    assert normalized.served_item_ids == list(dict.fromkeys(c[1] for c in expected_calls))
    assert normalized.error is None


def test_parallel_streamed_tool_calls_stay_apart() -> None:
    normalized = normalized_stream("chat/parallel-tool-calls-stream-gpt4o-mini")
    assert [(c.call_id, c.arguments) for c in normalized.tool_calls] == [
        ("call_j7L00WV19wwQCvKOIVZewXZm", {"location": "Seattle, WA"}),
        ("call_sAIOI3dvcd1YMsEqD8DI3l8B", {"location": "San Francisco, CA"}),
    ]


def test_streamed_choices_of_n_2_keep_their_own_tool_arguments() -> None:
    normalized = normalized_stream("chat/n2-choices-tools-stream-gpt35")
    assert [(c.choice_index, c.arguments) for c in normalized.tool_calls] == [
        (0, {"location": "San Francisco, CA"}),
        (1, {"location": "San Francisco, CA", "unit": "celsius"}),
    ]
    assert normalized.served_item_ids == ["call_ZLW6rwgBZAlsBPJv2F9O3zhz"]


def test_streamed_logprobs_are_merged_across_chunks() -> None:
    exchange = fixture("chat/logprobs-stream-gpt54")
    completion = assemble(exchange.body_bytes).result() or {}
    tokens = [entry["token"] for entry in completion["choices"][0]["logprobs"]["content"]]
    assert "".join(tokens) == completion["choices"][0]["message"]["content"] == "Hi! How can I help?"
    assert completion["choices"][0]["logprobs"]["refusal"] is None


def test_stream_without_logprobs_keeps_logprobs_null_and_usage_chunk_keeps_service_tier() -> None:
    completion = assemble(fixture("chat/cached-tokens-stream-gpt4o").body_bytes).result() or {}
    assert completion["choices"][0]["logprobs"] is None
    assert (completion["service_tier"], completion["system_fingerprint"]) == ("default", "fp_07871e2ad8")
    assert DIALECT.normalize(completion).usage == Usage(1420, 100, 0, 1520, 1280, None)


# --- every recorded non-stream body and error body -----------------------------------------------


@pytest.mark.parametrize("exchange", BODIES, ids=lambda f: f.name)
def test_recorded_body_normalizes_to_its_own_fields(exchange: RecordedExchange) -> None:
    body = json.loads(exchange.body_text)
    normalized = DIALECT.normalize(body)
    first = body["choices"][0]
    assert (normalized.response_id, normalized.model) == (body["id"], body["model"])
    assert normalized.finish_reason == first["finish_reason"]
    assert normalized.choice_finish_reasons == [c["finish_reason"] for c in body["choices"]]
    assert normalized.output_text == (first["message"].get("content") or None)
    assert normalized.usage.tokens_in == body["usage"]["prompt_tokens"]
    assert normalized.usage.tokens_out == body["usage"]["completion_tokens"]
    assert normalized.usage.tokens_total == body["usage"]["total_tokens"]
    ids = [call["id"] for c in body["choices"] for call in c["message"].get("tool_calls") or []]
    assert [c.call_id for c in normalized.tool_calls if c.call_id is not None] == ids
    assert normalized.error is None


def test_plain_text_body_gives_text_and_counts() -> None:
    normalized = DIALECT.normalize(json.loads(fixture("chat/text-basic-gpt4o").body_text))
    assert (normalized.output_text, normalized.finish_reason_normalized) == ("Oi!", "stop")
    assert normalized.usage == Usage(20, 2, 0, 22, 0, None)
    assert normalized.response_id == "chatcmpl-DuLdCrhIZ5WekmJNOuiNyelYjQqZk"


def test_cached_tokens_are_reported_inside_tokens_in_not_added() -> None:
    normalized = DIALECT.normalize(json.loads(fixture("chat/cached-tokens-length-gpt4o").body_text))
    assert (normalized.usage.tokens_in, normalized.usage.cached_tokens) == (1220, 1152)
    assert (normalized.finish_reason, normalized.finish_reason_normalized) == ("length", "length")


def test_reasoning_tokens_are_read_from_completion_details() -> None:
    normalized = DIALECT.normalize(json.loads(fixture("chat/reasoning-tokens-o4-mini").body_text))
    assert (normalized.usage.tokens_out, normalized.usage.tokens_reasoning) == (84, 64)
    assert normalized.reasoning_content is None


def test_refusal_body_gives_refusal_and_no_text() -> None:
    normalized = DIALECT.normalize(json.loads(fixture("chat/refusal-gpt4o").body_text))
    assert normalized.refusal == "I'm very sorry, but I can't assist with that request."
    assert normalized.output_text is None


def test_legacy_function_call_is_a_tool_call_without_id() -> None:
    normalized = DIALECT.normalize(json.loads(fixture("chat/legacy-function-call-gpt35").body_text))
    [call] = normalized.tool_calls
    assert (call.call_id, call.name, call.arguments["name"], call.choice_index) == (
        None, "extract_student_info", "David Nguyen", 0)
    assert (normalized.finish_reason, normalized.finish_reason_normalized) == ("function_call", "tool_calls")
    assert normalized.usage.tokens_reasoning is None and normalized.usage.cached_tokens is None


def test_custom_tool_call_keeps_free_text_input_raw() -> None:
    normalized = DIALECT.normalize(json.loads(fixture("chat/custom-tool-call-gpt5").body_text))
    [call] = normalized.tool_calls
    assert (call.type, call.name, call.arguments, call.call_id) == (
        "custom", "math_exp", {"_raw": "4 + 4"}, "call_QpgJRI5C9DcjExMNU6lrJPcu")


def test_parallel_tool_calls_body_lists_both_ids_in_order() -> None:
    normalized = DIALECT.normalize(json.loads(fixture("chat/parallel-tool-calls-gpt41-nano").body_text))
    assert [c.name for c in normalized.tool_calls] == ["get_weather", "get_news"]
    assert normalized.served_item_ids == ["call_EgULHWKqGjuB36aUeiOSpALZ", "call_Xer9QGOTDMG2Bxn9AKGiVM14"]


def test_two_choices_report_both_finish_reasons() -> None:
    normalized = DIALECT.normalize(json.loads(fixture("chat/n2-choices-gpt4o-mini").body_text))
    assert normalized.choice_finish_reasons == ["stop", "stop"]
    assert normalized.output_text == "This is a test. How can I assist you further?"


@pytest.mark.parametrize("exchange", ERRORS, ids=lambda f: f.name)
def test_error_body_fills_error(exchange: RecordedExchange) -> None:
    body = json.loads(exchange.body_text)
    normalized = DIALECT.normalize(body)
    assert normalized.error == body["error"]
    assert normalized.finish_reason is None and normalized.finish_reason_normalized == "error"
    assert normalized.usage == Usage() and normalized.tool_calls == []


def test_invalid_api_key_error_keeps_the_provider_code() -> None:
    normalized = DIALECT.normalize(json.loads(fixture("chat/error-401-invalid-api-key").body_text))
    assert normalized.error is not None and normalized.error["code"] == "invalid_api_key"


# --- stream behaviour the recordings do not show -------------------------------------------------


def test_tool_deltas_without_index_start_a_new_call_on_each_new_id() -> None:
    body = sse(
        chunk(delta(tool_calls=[function_call("a", "f", '{"x"', type="function")])),
        chunk(delta(tool_calls=[function_call(None, None, ": 1}")])),
        chunk(delta(tool_calls=[function_call("b", "g", "{}", type="function")])),
        chunk(delta(finish_reason="tool_calls")),
        "[DONE]",
    )
    normalized = DIALECT.normalize(assemble(body).result() or {})
    calls = [(c.call_id, c.name, c.arguments) for c in normalized.tool_calls]
    assert calls == [("a", "f", {"x": 1}), ("b", "g", {})]


def test_a_new_id_at_a_reused_index_starts_a_new_call() -> None:
    body = sse(
        chunk(delta(tool_calls=[function_call("a", "f", "{}", index=0)])),
        chunk(delta(tool_calls=[function_call("b", "g", '{"y": 2}', index=0)])),
    )
    normalized = DIALECT.normalize(assemble(body).result() or {})
    calls = [(c.call_id, c.name, c.arguments) for c in normalized.tool_calls]
    assert calls == [("a", "f", {}), ("b", "g", {"y": 2})]


def test_a_name_repeated_on_every_delta_is_not_doubled() -> None:
    body = sse(
        chunk(delta(tool_calls=[{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{\"k\":"}}])),
        chunk(delta(tool_calls=[{"index": 0, "id": "a", "function": {"name": "f", "arguments": " true}"}}])),
    )
    [call] = DIALECT.normalize(assemble(body).result() or {}).tool_calls
    assert (call.name, call.arguments) == ("f", {"k": True})


def test_interleaved_choices_keep_their_own_text() -> None:
    body = sse(
        chunk(delta(0, content="A"), delta(1, content="x")),
        chunk(delta(1, content="y")),
        chunk(delta(0, content="B", finish_reason="stop")),
        chunk(delta(1, finish_reason="length")),
        "[DONE]",
    )
    completion = assemble(body).result() or {}
    assert [c["message"]["content"] for c in completion["choices"]] == ["AB", "xy"]
    assert DIALECT.normalize(completion).choice_finish_reasons == ["stop", "length"]


def test_reasoning_is_read_from_either_name_and_counted_once_when_both_are_sent() -> None:
    body = sse(chunk(delta(reasoning_content="think ")), chunk(delta(reasoning="more")),
               chunk(delta(reasoning_content=" twice", reasoning=" twice")), chunk(delta(content="ok")))
    completion = assemble(body).result() or {}
    assert completion["choices"][0]["message"]["reasoning_content"] == "think more twice"
    assert DIALECT.normalize(completion).reasoning_content == "think more twice"


def test_with_two_choices_text_reasoning_and_refusal_describe_choice_zero() -> None:
    body = {"choices": [
        {"index": 0, "message": {"content": "a", "reasoning_content": "r0"}, "finish_reason": "stop"},
        {"index": 1, "message": {"content": "b", "reasoning_content": "r1", "refusal": "no"}, "finish_reason": "stop"},
    ]}
    normalized = DIALECT.normalize(body)
    assert (normalized.output_text, normalized.reasoning_content, normalized.refusal) == ("a", "r0", None)


def test_reasoning_alias_in_a_body_is_read_when_reasoning_content_is_absent() -> None:
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi", "reasoning": "why"}}]}
    assert DIALECT.normalize(body).reasoning_content == "why"


def test_vllm_token_ids_are_kept_and_appended_across_chunks() -> None:
    body = sse(
        {**chunk(delta(role="assistant", content="")), "prompt_token_ids": [1, 2, 3]},
        {**chunk({**delta(content="a"), "token_ids": [10]})},
        {**chunk({**delta(content="b", finish_reason="stop"), "token_ids": [11, 12]})},
        "[DONE]",
    )
    completion = assemble(body).result() or {}
    normalized = DIALECT.normalize(completion)
    assert (normalized.prompt_token_ids, normalized.completion_token_ids) == ([1, 2, 3], [10, 11, 12])
    assert completion["choices"][0]["token_ids"] == [10, 11, 12]


def test_streamed_refusal_and_its_logprobs_are_concatenated() -> None:
    first, second = {"token": "I can"}, {"token": "not."}
    body = sse(chunk({**delta(refusal="I can"), "logprobs": {"content": None, "refusal": [first]}}),
               chunk({**delta(refusal="not."), "logprobs": {"content": None, "refusal": [second]}}))
    completion = assemble(body).result() or {}
    assert completion["choices"][0]["message"]["refusal"] == "I cannot."
    assert completion["choices"][0]["logprobs"] == {"content": None, "refusal": [first, second]}
    assert DIALECT.normalize(completion).refusal == "I cannot."


def test_streamed_legacy_function_call_and_custom_tool_input_are_concatenated() -> None:
    legacy = sse(chunk(delta(function_call={"name": "f", "arguments": "{\"a\""})),
                 chunk(delta(function_call={"arguments": ": 1}"}, finish_reason="function_call")))
    custom = sse(chunk(delta(tool_calls=[{"index": 0, "id": "c", "type": "custom", "custom": {"name": "sh"}}])),
                 chunk(delta(tool_calls=[{"index": 0, "custom": {"input": "ls "}}])),
                 chunk(delta(tool_calls=[{"index": 0, "custom": {"input": "-l"}}])))
    [legacy_call] = DIALECT.normalize(assemble(legacy).result() or {}).tool_calls
    [custom_call] = DIALECT.normalize(assemble(custom).result() or {}).tool_calls
    assert (legacy_call.call_id, legacy_call.name, legacy_call.arguments) == (None, "f", {"a": 1})
    assert (custom_call.type, custom_call.name, custom_call.arguments) == ("custom", "sh", {"_raw": "ls -l"})


def test_finish_reason_without_done_leaves_the_stream_unterminated() -> None:
    assembler = assemble(sse(chunk(delta(content="hi")), chunk(delta(finish_reason="stop"))))
    assert assembler.terminal is None
    assert (assembler.result() or {})["choices"][0]["finish_reason"] == "stop"


def test_error_payload_ends_the_stream_as_error_and_stays_on_the_result() -> None:
    error = {"message": "context too long", "type": "invalid_request_error", "code": 400}
    assembler = assemble(sse(chunk(delta(content="par")), {"error": error}, "[DONE]"))
    completion = assembler.result() or {}
    assert assembler.terminal == "error"
    assert completion["error"] == error and completion["choices"][0]["message"]["content"] == "par"
    normalized = DIALECT.normalize(completion)
    assert (normalized.error, normalized.finish_reason_normalized) == (error, "error")


def test_error_chunk_that_carries_choices_keeps_their_finish_reason() -> None:
    # OpenRouter ends a generation that failed mid-stream with an error chunk whose choice says "error".
    failure = {**chunk(delta(finish_reason="error")), "error": {"code": 502, "message": "provider down"}}
    assembler = assemble(sse(chunk(delta(content="Hel")), failure))
    normalized = DIALECT.normalize(assembler.result() or {})
    assert assembler.terminal == "error"
    assert (normalized.finish_reason, normalized.finish_reason_normalized) == ("error", "error")
    assert normalized.error == {"code": 502, "message": "provider down"} and normalized.output_text == "Hel"


def test_error_event_with_text_data_keeps_the_text_as_message() -> None:
    assembler = DIALECT.stream_assembler()
    assembler.feed(SSEEvent("error", "upstream overloaded"))
    assert assembler.terminal == "error"
    assert (assembler.result() or {})["error"] == {"message": "upstream overloaded"}


def test_vllm_error_object_in_a_data_line_is_an_error() -> None:
    payload = {"object": "error", "message": "bad", "type": "BadRequestError", "code": 400}
    assembler = assemble(sse(payload))
    assert assembler.terminal == "error" and (assembler.result() or {})["error"] == payload


def test_usage_only_stream_still_yields_a_result() -> None:
    usage = {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5}
    completion = assemble(sse(chunk(usage=usage), "[DONE]")).result()
    assert completion is not None and completion["choices"] == [] and completion["usage"] == usage
    assert DIALECT.normalize(completion).usage == Usage(5, 0, None, 5, None, None)


def test_stream_without_usage_reports_every_count_as_unknown() -> None:
    # llama.cpp streams send no usage even when include_usage is requested.
    body = sse(chunk(delta(role="assistant", content="Hello")), chunk(delta(finish_reason="stop")), "[DONE]")
    normalized = DIALECT.normalize(assemble(body).result() or {})
    assert normalized.usage == Usage() and normalized.output_text == "Hello"


def test_nothing_learned_gives_no_result() -> None:
    assert assemble(b"").result() is None
    done_only = assemble(sse("[DONE]"))
    assert done_only.result() is None and done_only.terminal == "completed"


def test_anthropic_style_cache_read_is_never_added_to_tokens_in() -> None:
    usage = {"prompt_tokens": 100, "completion_tokens": 5, "cache_read_input_tokens": 80,
             "cache_creation_input_tokens": 10}
    assert DIALECT.normalize({"usage": usage}).usage == Usage(100, 5, None, 105, 80, 10)
    both = {**usage, "prompt_tokens_details": {"cached_tokens": 70}}
    assert DIALECT.normalize({"usage": both}).usage.cached_tokens == 70


@pytest.mark.parametrize(("provider", "expected"), [
    ("stop", "stop"), ("length", "length"), ("tool_calls", "tool_calls"), ("function_call", "tool_calls"),
    ("content_filter", "content_filter"), ("error", "error"), ("eos", "other"), (None, None)])
def test_finish_reason_is_normalized(provider: str | None, expected: str | None) -> None:
    normalized = DIALECT.normalize({"choices": [{"index": 0, "finish_reason": provider, "message": {}}]})
    assert (normalized.finish_reason, normalized.finish_reason_normalized) == (provider, expected)


def test_encrypted_reasoning_details_are_counted_as_redacted() -> None:
    details = [{"type": "reasoning.text", "text": "a", "index": 0},
               {"type": "reasoning.encrypted", "data": "x", "index": 1}]
    completion = assemble(sse(chunk(delta(reasoning="a", reasoning_details=details)))).result() or {}
    assert DIALECT.normalize(completion).reasoning_redacted_blocks == 1


# --- properties ----------------------------------------------------------------------------------

stream_bodies = st.sampled_from(STREAMS).map(lambda f: f.body_bytes)


def feed_chunks(body: bytes, cuts: list[int]) -> ChatStreamAssembler:
    assembler = DIALECT.stream_assembler()
    decoder = SSEDecoder()
    edges = [0, *sorted(cuts), len(body)]
    for start, end in zip(edges, edges[1:]):
        for event in decoder.feed(body[start:end]):
            assembler.feed(event)
    for event in decoder.close():
        assembler.feed(event)
    return assembler


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), body=stream_bodies)
def test_any_split_of_a_recorded_stream_gives_the_same_result(data: st.DataObject, body: bytes) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=40))
    whole = assemble(body)
    split = feed_chunks(body, cuts)
    assert (split.result(), split.terminal, split.malformed_events) == (whole.result(), whole.terminal, 0)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), body=stream_bodies)
def test_a_stream_cut_at_any_byte_keeps_a_prefix_of_what_was_sent(data: st.DataObject, body: bytes) -> None:
    cut = data.draw(st.integers(0, len(body)))
    full = assemble(body).result() or {}
    partial = feed_chunks(body[:cut], [])
    done_at = body.find(DONE_LINE)
    assert partial.terminal == ("completed" if cut >= done_at + len(DONE_LINE) else None)
    result = partial.result()
    if result is None:
        return
    full_choices = {c["index"]: c for c in full["choices"]}
    for choice in result["choices"]:
        whole = full_choices[choice["index"]]
        assert (whole["message"]["content"] or "").startswith(choice["message"]["content"] or "")
        calls = zip(choice["message"].get("tool_calls", []), whole["message"].get("tool_calls", []))
        for part, complete in calls:
            assert complete["function"]["arguments"].startswith(part["function"]["arguments"])
            assert part["id"] == complete["id"]
    assert result["usage"] in (None, full["usage"])
    assert isinstance(DIALECT.normalize(result), Normalized)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)
scalars = st.none() | st.booleans() | st.integers(-3, 2**70) | st.text(max_size=6)


def loosely(keys: list[str], *shapes: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts with any of `keys`, each holding a scalar or one of the right-ish shapes."""
    value = st.one_of(scalars, *shapes)
    return st.fixed_dictionaries({}, optional={key: value for key in keys})


TOOL_DELTA_KEYS = ["index", "id", "type", "function", "custom"]
DELTA_KEYS = ["role", "content", "refusal", "reasoning", "reasoning_content", "tool_calls", "function_call",
              "annotations", "reasoning_details"]
CHOICE_KEYS = ["index", "delta", "finish_reason", "logprobs", "token_ids", "stop_reason", "message"]
CHUNK_KEYS = ["id", "model", "created", "choices", "usage", "error", "prompt_token_ids", "system_fingerprint",
              "service_tier", "object", "type"]
USAGE_KEYS = ["prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details",
              "cache_read_input_tokens"]

tool_deltas = loosely(TOOL_DELTA_KEYS, loosely(["name", "arguments", "input"]), st.lists(scalars, max_size=2))
deltas = loosely(DELTA_KEYS, st.lists(tool_deltas | scalars, max_size=3), loosely(["name", "arguments", "index"]))
choices = loosely(CHOICE_KEYS, deltas, loosely(["content", "refusal"], st.lists(scalars, max_size=2)),
                  st.lists(scalars, max_size=3))
ill_typed_chunks = loosely(CHUNK_KEYS, st.lists(choices | scalars, max_size=3),
                           loosely(USAGE_KEYS, loosely(["cached_tokens"])))
event_data = st.one_of(st.text(max_size=30), json_values.map(json.dumps), ill_typed_chunks.map(json.dumps),
                       st.just("[DONE]"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(st.tuples(st.none() | st.sampled_from(["error", "message", "x"]), event_data),
                       max_size=8))
def test_malformed_events_never_raise(events: list[tuple[str | None, str]]) -> None:
    assembler = DIALECT.stream_assembler()
    for name, data in events:
        assembler.feed(SSEEvent(name, data))
    result = assembler.result()
    assert assembler.terminal in (None, "completed", "error")
    assert isinstance(DIALECT.normalize(result or {}), Normalized)
    not_objects = [data for name, data in events if name != "error" and not is_json_object(data)
                   and data.strip() not in ("", "[DONE]")]
    assert assembler.malformed_events >= len(not_objects)


def is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


@settings(max_examples=300, deadline=None)
@given(value=json_values | ill_typed_chunks)
def test_normalize_never_raises_on_any_json_value(value: Any) -> None:
    normalized = DIALECT.normalize(value)
    assert normalized.finish_reason_normalized in (None, *FINISH_REASONS)


junk = st.sampled_from(["not json", "[1, 2]", "\"text\"", "42", "{\"choices\": 7}", "{\"usage\": \"x\"}"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), body=stream_bodies)
def test_junk_events_mixed_into_a_stream_are_counted_and_change_nothing_else(
    data: st.DataObject, body: bytes
) -> None:
    events = decode_sse(body)
    inserts = data.draw(st.lists(st.tuples(st.integers(0, len(events)), junk), max_size=6))
    mixed = list(events)
    for position, text in sorted(inserts, reverse=True):
        mixed.insert(position, SSEEvent(None, text))
    assembler = DIALECT.stream_assembler()
    for event in mixed:
        assembler.feed(event)
    whole = assemble(body)
    assert (assembler.result(), assembler.terminal) == (whole.result(), whole.terminal)
    assert assembler.malformed_events == len(inserts)


def test_legacy_function_call_mirroring_a_tool_call_is_not_a_second_call() -> None:
    # llama.cpp's server sends both fields for one forced tool call, in streams and in bodies.
    message = {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
        "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}],
    }
    normalized = ChatDialect().normalize({"id": "x", "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]})
    assert [(call.call_id, call.name, call.arguments) for call in normalized.tool_calls] == [("call_0", "add", {"a": 1, "b": 2})]


# Token chunks as servers write them, varied where a learnt template could go wrong: tricky token
# texts, keys that change from chunk to chunk, a second choice, and JSON written compact or spaced.
def _token_chunk(token: str, index: int, extra: dict[str, Any], spaced: bool, ascii_only: bool) -> bytes:
    chunk = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 7,
        "model": "m",
        **extra,
        "choices": [{"index": index, "delta": {"content": token}, "logprobs": None, "finish_reason": None}],
    }
    text = json.dumps(chunk, separators=(", ", ": ") if spaced else (",", ":"), ensure_ascii=ascii_only)
    return b"data: " + text.encode() + b"\n\n"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tokens=st.lists(st.tuples(TRICKY_TOKENS, st.sampled_from([0, 0, 0, 1])), max_size=25),
    extra=st.sampled_from([{}, {"system_fingerprint": None}, {"usage": None}, {"stop_reason": None}]),
    varying=st.booleans(),
    spaced=st.booleans(),
    ascii_only=st.booleans(),
)
def test_token_chunks_read_through_a_learnt_template_rebuild_what_the_general_path_does(
    tokens: list[tuple[str, int]], extra: dict[str, Any], varying: bool, spaced: bool, ascii_only: bool
) -> None:
    role = b'data: {"id":"chatcmpl-1","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    chunks = [role]
    for number, (token, index) in enumerate(tokens):
        chunk_extra = {**extra, "obfuscation": "x" * number} if varying else extra
        chunks.append(_token_chunk(token, index, chunk_extra, spaced, ascii_only))
    chunks.append(b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
    assert_templates_change_nothing(DIALECT, chunks)


def test_a_long_token_stream_is_read_through_its_template() -> None:
    """The shortcut is taken: after the first plain token, the rest never reach the general path,
    escaped ones included."""
    tokens = [f" t{n}" if n % 2 == 0 else ESCAPED_TOKENS[n % len(ESCAPED_TOKENS)] for n in range(50)]
    body = b"".join([_token_chunk(token, 0, {}, False, True) for token in tokens]) + b"data: [DONE]\n\n"
    assembler = DIALECT.stream_assembler()
    applied: list[dict[str, Any]] = []
    original = ChatStreamAssembler._apply_chunk

    def counting(self: ChatStreamAssembler, chunk: dict[str, Any]) -> bool:
        applied.append(chunk)
        return original(self, chunk)

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(ChatStreamAssembler, "_apply_chunk", counting)
        for event in decode_sse(body):
            assembler.feed(event)
    assert len(applied) == 1
    result = assembler.result()
    assert result is not None and result["choices"][0]["message"]["content"] == "".join(tokens)


def test_a_token_chunk_that_continues_a_half_read_line_is_decoded_not_read_through_the_template() -> None:
    first, second = _token_chunk(" a", 0, {}, False, True), _token_chunk(" b", 0, {}, False, True)
    tracker = StreamTracker(DIALECT)
    tracker.feed(first)  # learns the template
    tracker.feed(b'data: {"choices":[{"index":0,"delta":{"content":" c"}}]}\n: x')  # ends mid-line
    tracker.feed(second)  # continues that line: one malformed line, not a token
    tracker.feed(b"\ndata: [DONE]\n\n")
    outcome = tracker.outcome()
    assert outcome is not None and outcome.response is not None
    assert outcome.response["choices"][0]["message"]["content"] == " a c"
