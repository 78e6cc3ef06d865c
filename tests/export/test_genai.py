"""The OpenTelemetry GenAI projection of captured calls (model-calls.jsonl records)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtap.export.genai import SEMCONV_VERSION, genai_record
from llmtap.exchange import Exchange
from llmtap.records import ModelCallRecord, raw_line_from_exchange
from tests.fixtures import RecordedExchange, all_fixtures, fixture


def _project(recorded: RecordedExchange, **extra: Any) -> tuple[dict[str, Any], ModelCallRecord]:
    import json

    exchange = Exchange(
        method="POST",
        path=recorded.request_path,
        request_body=json.dumps(recorded.request_json).encode(),
        status_code=recorded.status,
        response_headers={"content-type": recorded.content_type},
        provider=extra.pop("provider", None),
    )
    exchange.extra.update(extra)
    exchange.add_response_chunk(recorded.body_bytes)
    line = raw_line_from_exchange(exchange)
    record = ModelCallRecord.from_raw_line(line, 0)
    return genai_record(line, record, rollout_id="r"), record


@pytest.mark.parametrize("recorded", all_fixtures(), ids=lambda f: f.id)
def test_every_recorded_exchange_projects_with_consistent_usage_and_status(recorded: RecordedExchange) -> None:
    projected, record = _project(recorded)
    attributes = projected["attributes"]
    assert projected["semconv_version"] == SEMCONV_VERSION
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == ("anthropic" if recorded.dialect == "messages" else "openai")
    assert attributes.get("gen_ai.usage.input_tokens") == record.tokens_in
    assert attributes.get("gen_ai.usage.output_tokens") == record.tokens_out
    assert attributes.get("gen_ai.usage.reasoning.output_tokens") == record.tokens_reasoning
    assert attributes.get("gen_ai.usage.cache_read.input_tokens") == record.cached_tokens
    assert attributes.get("gen_ai.request.model") == recorded.request_json.get("model")
    if recorded.status >= 400:
        assert projected["status"] == "error" and attributes["error.type"] == str(recorded.status)
    elif record.error_category is None:
        assert projected["status"] == "ok"
        assert attributes["gen_ai.input.messages"]
        assert attributes["gen_ai.output.messages"]
        assert attributes["gen_ai.response.finish_reasons"]


def test_a_chat_tool_call_becomes_a_tool_call_part_with_parsed_arguments() -> None:
    projected, _ = _project(fixture("chat/tool-call-gpt4o"), operation="chat", provider="openai")
    [message] = projected["attributes"]["gen_ai.output.messages"]
    [part] = [part for part in message["parts"] if part["type"] == "tool_call"]
    assert part["name"] == "weather" and isinstance(part["arguments"], dict)
    assert message["finish_reason"] == "tool_call"
    assert projected["attributes"]["gen_ai.tool.definitions"]


def test_n_choices_give_one_output_message_and_finish_reason_each() -> None:
    projected, _ = _project(fixture("chat/n2-choices-gpt4o-mini"))
    attributes = projected["attributes"]
    assert len(attributes["gen_ai.output.messages"]) == 2
    assert len(attributes["gen_ai.response.finish_reasons"]) == 2
    assert attributes["gen_ai.request.choice.count"] == 2


def test_anthropic_cache_and_system_prompt_are_kept() -> None:
    projected, record = _project(fixture("messages/cache-write-sonnet4"))
    attributes = projected["attributes"]
    assert record.cache_creation_tokens
    assert attributes["gen_ai.usage.cache_creation.input_tokens"] == record.cache_creation_tokens
    assert attributes["gen_ai.system_instructions"]


def test_the_span_name_is_operation_and_model_and_server_attributes_come_from_the_hook() -> None:
    projected, _ = _project(fixture("chat/text-basic-gpt4o"), operation="chat", server={"address": "api.openai.com", "port": 443})
    assert projected["name"] == "chat gpt-4o"
    assert projected["attributes"]["server.address"] == "api.openai.com"
    assert projected["attributes"]["server.port"] == 443


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(
    dialect=st.sampled_from(["chat", "responses", "messages", None]),
    request=st.dictionaries(st.sampled_from(["model", "messages", "input", "system", "instructions", "tools", "stop", "n", "options", "temperature"]), _json),
    response=st.dictionaries(st.sampled_from(["choices", "output", "content", "message", "model", "id", "usage"]), _json),
)
def test_any_stored_shape_projects_without_raising(dialect: str | None, request: dict[str, Any], response: dict[str, Any]) -> None:
    record = ModelCallRecord(model_call_id="x", call_index=0, dialect=dialect, request=request, response=response)
    projected = genai_record({}, record, rollout_id="r")
    assert projected["attributes"]["gen_ai.operation.name"] == "chat"
