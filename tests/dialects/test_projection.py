"""The canonical projections diff and replay compare: the answer text read cheaply, request parts named."""

from __future__ import annotations

import json

import pytest

from llmtap.dialects import get_dialect
from llmtap.dialects.projection import conversation_items, request_part, request_projection, response_text
from llmtap.records import ModelCallRecord
from tests.diff.runs import line_for
from tests.fixtures import RecordedExchange, all_fixtures, fixture


@pytest.mark.parametrize("recorded", all_fixtures(), ids=lambda f: f.id)
def test_the_answer_text_is_what_normalize_reads(recorded: RecordedExchange) -> None:
    record = ModelCallRecord.from_raw_line(line_for(recorded, rollout_id="r"), 0)
    assert record.response is not None
    expected = get_dialect(recorded.dialect).normalize(record.response).output_text
    assert response_text(recorded.dialect, record.response) == expected


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("chat/text-basic-gpt4o", "Oi!"),
        ("messages/text-basic-sonnet4", 'Olá! \n\n(That\'s "hello" in Portuguese. You could also say "Oi!" for a more casual "hi!")'),
        ("responses/text-basic-gpt55", "pong"),
    ],
)
def test_the_answer_text_is_the_recorded_bodys_own_text(name: str, text: str) -> None:
    """Pinned to the text each recorded body carries (read off the fixture), not to another reader's answer."""
    recorded = fixture(name)
    assert response_text(recorded.dialect, json.loads(recorded.body_text)) == text


def test_request_parts_name_the_conversation_tools_format_and_sampling() -> None:
    assert request_part("chat", "messages") == "conversation"
    assert request_part("responses", "instructions") == "conversation"
    assert request_part("messages", "system") == "conversation"
    assert request_part("chat", "tool_choice") == "tools"
    assert request_part("chat", "response_format") == "format"
    assert request_part("responses", "text") == "format"
    assert request_part("chat", "temperature") == "sampling"
    assert request_part("chat", "model") == "model"


def test_the_conversation_puts_system_and_instructions_first() -> None:
    followup = fixture("messages/tool-result-followup-sonnet4").request_json
    items = conversation_items("messages", request_projection("messages", followup)["request"])
    assert items[0] == {"role": "system", "content": followup["system"]}
    assert [item["role"] for item in items[1:]] == ["user", "assistant", "user"]
    assert conversation_items("responses", {"instructions": "be brief", "input": "hi"}) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]


def test_a_body_that_is_not_json_projects_as_its_text() -> None:
    assert request_projection("chat", None, "not json") == {
        "endpoint": "chat",
        "request": None,
        "request_raw": "not json",
    }
    assert json.dumps(request_projection(None, {"user": "u", "x": 1})) == json.dumps(
        {"endpoint": None, "request": {"x": 1, "stream": False}}
    )
