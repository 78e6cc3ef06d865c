"""Model-visible history items read from every recorded request and response."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtap.dialects import DIALECTS
from llmtap.dialects.history import (
    HISTORY_ITEM_KEYS,
    HISTORY_ITEM_TYPES,
    continued_response_id,
    fingerprint_outputs,
    fingerprint_request_items,
    item_fingerprint,
    request_items,
    response_items,
    response_outputs,
    served_response_id,
)
from llmtap.exchange import Exchange
from llmtap.records import raw_line_from_exchange
from llmtap.records.fingerprint import fingerprint
from tests.fixtures import RecordedExchange, all_fixtures, fixture

# Recorded follow-up requests that replay an earlier recorded call's input and output.
RECORDED_CHAINS = [
    ("chat/tool-call-gpt4o", "chat/tool-result-followup-gpt4o"),
    ("messages/tool-use-sonnet4", "messages/tool-result-followup-sonnet4"),
    ("messages/thinking-tool-use-sonnet4", "messages/thinking-replay-request-sonnet4"),
    ("responses/function-call-gpt55", "responses/function-call-output-followup-gpt55"),
]


def reassembled_response(recorded: RecordedExchange) -> Any:
    """The response object the capture pipeline stores (streams reassembled)."""
    exchange = Exchange(method="POST", path=recorded.request_path, model_call_id="c")
    exchange.status_code = recorded.status
    exchange.response_headers = {"content-type": recorded.content_type}
    exchange.add_response_chunk(recorded.body_bytes)
    return raw_line_from_exchange(exchange)["response"]


def assert_well_formed(items: list[dict[str, Any]]) -> None:
    for item in items:
        assert set(HISTORY_ITEM_KEYS) <= set(item)
        assert item["type"] in HISTORY_ITEM_TYPES
        assert item["text"] is None or isinstance(item["text"], str)
        assert item["arguments"] is None or isinstance(item["arguments"], dict)


@pytest.mark.parametrize("recorded", all_fixtures(), ids=lambda f: f.id)
def test_every_recorded_request_reads_into_well_formed_items(recorded: RecordedExchange) -> None:
    items = request_items(recorded.dialect, recorded.request_json)

    assert items is not None
    assert_well_formed(items)


@pytest.mark.parametrize(
    "recorded", [f for f in all_fixtures() if f.status == 200 and f.id != "messages/refusal-stream-fable51"], ids=lambda f: f.id
)
def test_every_successful_recorded_response_has_model_output(recorded: RecordedExchange) -> None:
    items = response_items(recorded.dialect, reassembled_response(recorded))

    assert items
    assert_well_formed(items)


@pytest.mark.parametrize(("first", "follow_up"), RECORDED_CHAINS)
def test_a_recorded_follow_up_request_starts_with_the_earlier_input_and_output(first: str, follow_up: str) -> None:
    earlier = fixture(first)
    context = (request_items(earlier.dialect, earlier.request_json) or []) + (
        response_items(earlier.dialect, reassembled_response(earlier)) or []
    )
    later = request_items(fixture(follow_up).dialect, fixture(follow_up).request_json) or []

    assert [item_fingerprint(item) for item in later[: len(context)]] == [item_fingerprint(item) for item in context]
    assert later[len(context)]["type"] == "tool_result"


def test_a_tool_result_names_the_call_it_answers() -> None:
    call = response_items("chat", reassembled_response(fixture("chat/tool-call-gpt4o")))
    follow_up = request_items("chat", fixture("chat/tool-result-followup-gpt4o").request_json)

    assert call is not None and follow_up is not None
    assert follow_up[-1] == {
        "role": "tool",
        "type": "tool_result",
        "text": "40 C",
        "call_id": call[0]["call_id"],
        "name": None,
        "arguments": None,
    }
    assert call[0]["name"] == "weather" and isinstance(call[0]["arguments"], dict)


def test_a_messages_tool_result_flagged_as_error_says_so() -> None:
    request = {
        "messages": [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "boom", "is_error": True}]}
        ]
    }

    assert request_items("messages", request) == [
        {"role": "tool", "type": "tool_result", "text": "boom", "call_id": "toolu_1", "name": None, "arguments": None, "is_error": True}
    ]


def test_responses_instructions_and_string_input_become_system_and_user_messages() -> None:
    items = request_items("responses", fixture("responses/text-stream-gpt4o-mini").request_json)

    assert items is not None
    assert [(item["role"], item["type"], item.get("provider_type")) for item in items] == [
        ("system", "message", "instructions"),
        ("user", "message", None),
    ]
    assert items[1]["text"] == fixture("responses/text-stream-gpt4o-mini").request_json["input"]


def test_only_a_responses_request_continues_a_previous_response() -> None:
    recorded = fixture("responses/previous-response-id-function-call-gpt41")

    assert continued_response_id("responses", recorded.request_json) == recorded.request_json["previous_response_id"]
    assert continued_response_id("responses", fixture("responses/text-basic-gpt55").request_json) is None
    assert continued_response_id("chat", {"previous_response_id": "resp_1"}) is None


def test_images_are_listed_by_type_and_their_text_kept() -> None:
    items = request_items("chat", fixture("chat/image-input-stream-gpt4o").request_json)

    assert items is not None
    assert items[0]["non_text_parts"] == ["image_url"]
    assert items[0]["text"] == fixture("chat/image-input-stream-gpt4o").request_json["messages"][0]["content"][0]["text"]


def test_several_chat_choices_keep_their_index() -> None:
    items = response_items("chat", reassembled_response(fixture("chat/n2-choices-gpt4o-mini")))

    assert items is not None
    assert [item["choice_index"] for item in items] == [0, 1]


def test_redacted_thinking_is_reasoning_without_text() -> None:
    items = response_items("messages", reassembled_response(fixture("messages/redacted-thinking-sonnet45")))

    assert items is not None
    assert items[0]["type"] == "reasoning"
    assert items[0]["text"] is None and items[0]["encrypted"] is True


def test_an_error_body_has_no_model_output() -> None:
    assert response_items("chat", reassembled_response(fixture("chat/error-401-invalid-api-key"))) is None


def test_unknown_dialects_and_shapes_are_unknown_not_empty() -> None:
    assert request_items("gemini", {"contents": []}) is None
    assert request_items("chat", ["not", "an", "object"]) is None
    assert request_items("chat", {"model": "x"}) is None
    assert response_items("responses", {"id": "resp_1"}) is None


def test_fingerprints_compare_the_six_keys_only() -> None:
    base = {"role": "user", "type": "message", "text": "hi", "call_id": None, "name": None, "arguments": None}

    assert item_fingerprint(base) == item_fingerprint({**base, "provider_type": "instructions"})
    assert item_fingerprint(base) != item_fingerprint({**base, "text": "hi!"})


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(
        ["role", "type", "content", "text", "input", "output", "messages", "choices", "message", "tool_calls",
         "function", "arguments", "call_id", "id", "name", "summary", "system", "instructions", "tool_use_id",
         "refusal", "reasoning_content", "index", "previous_response_id", "custom", "action", "is_error"]
    ), children, max_size=6),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(dialect=st.sampled_from(["responses", "chat", "messages"]), payload=JSON)
def test_any_json_reads_without_raising_into_well_formed_items(dialect: str, payload: Any) -> None:
    for items in (request_items(dialect, payload), response_items(dialect, payload)):
        if items is not None:
            assert_well_formed(items)
    continued_response_id(dialect, payload)


# --- served ids, per-choice outputs, hosted tools ---------------------------------------------


def test_responses_items_carry_the_id_the_server_gave_their_item() -> None:
    response = reassembled_response(fixture("responses/parallel-function-calls-gpt4o"))
    items = response_items("responses", response)

    assert items is not None and len(items) == len(response["output"])
    assert [item["item_id"] for item in items] == [entry["id"] for entry in response["output"]]
    assert [item["call_id"] for item in items] == [entry["call_id"] for entry in response["output"]]


def test_a_messages_response_gives_every_item_its_message_id_and_a_request_gives_none() -> None:
    recorded = fixture("messages/tool-use-sonnet4")
    response = reassembled_response(recorded)
    output = response_items("messages", response)
    replayed = request_items("messages", fixture("messages/tool-result-followup-sonnet4").request_json)

    assert output and {item.get("item_id") for item in output} == {response["id"]}
    assert replayed and all("item_id" not in item for item in replayed)


def test_chat_items_have_no_item_id_because_chat_serves_none() -> None:
    items = response_items("chat", reassembled_response(fixture("chat/tool-call-gpt4o")))

    assert items and all("item_id" not in item for item in items)


def test_served_ids_do_not_change_an_items_fingerprint() -> None:
    items = response_items("responses", reassembled_response(fixture("responses/function-call-gpt55")))

    assert items
    for item in items:
        assert item_fingerprint(item) == item_fingerprint({k: v for k, v in item.items() if k != "item_id"})


def test_response_outputs_keep_chat_choices_apart_and_flatten_to_response_items() -> None:
    response = reassembled_response(fixture("chat/n2-choices-gpt4o-mini"))
    outputs = response_outputs("chat", response)

    assert outputs is not None and len(outputs) == len(response["choices"]) == 2
    assert [[item["choice_index"] for item in output] for output in outputs] == [[0], [1]]
    assert [item for output in outputs for item in output] == response_items("chat", response)


def test_response_outputs_are_one_output_for_single_answer_dialects_and_none_when_unknown() -> None:
    for name in ("responses/function-call-gpt55", "messages/tool-use-sonnet4", "chat/text-basic-gpt4o"):
        recorded = fixture(name)
        outputs = response_outputs(recorded.dialect, reassembled_response(recorded))
        assert outputs is not None and len(outputs) == 1
    assert response_outputs("gemini", {"candidates": []}) is None
    assert response_outputs("responses", {"id": "resp_1"}) is None


@pytest.mark.parametrize(
    "recorded", [f for f in all_fixtures() if f.status == 200 and not f.is_stream], ids=lambda f: f.id
)
def test_served_response_id_reads_the_id_of_every_dialects_response(recorded: RecordedExchange) -> None:
    response = reassembled_response(recorded)

    assert served_response_id(response) == response["id"]


def test_served_response_id_is_none_without_an_agreed_id() -> None:
    assert served_response_id(None) is None
    assert served_response_id(["resp_1"]) is None
    assert served_response_id({"output": []}) is None
    assert served_response_id({"id": ""}) is None


def test_served_response_id_survives_a_failing_dialect(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(response: Any) -> Any:
        raise RuntimeError("dialect bug")

    monkeypatch.setattr(DIALECTS["responses"], "normalize", broken)

    assert served_response_id({"id": "resp_1", "output": []}) == "resp_1"


def test_tools_the_provider_ran_are_marked_hosted_and_client_tools_are_not() -> None:
    searched = response_items("responses", reassembled_response(fixture("responses/web-search-gpt41")))
    served = response_items("messages", reassembled_response(fixture("messages/web-search-sonnet4")))
    called = response_items("responses", reassembled_response(fixture("responses/function-call-gpt55")))

    assert searched and served and called
    assert [item.get("hosted", False) for item in searched if item["type"] == "tool_call"] == [True]
    assert {item.get("hosted", False) for item in served if item["type"] in ("tool_call", "tool_result")} == {True}
    assert not any(item.get("hosted") for item in called)
    assert request_items("responses", {"input": [{"type": "computer_call", "call_id": "c", "action": {}}]}) == [
        {"role": "assistant", "type": "tool_call", "text": None, "call_id": "c", "name": "computer",
         "arguments": {}, "provider_type": "computer_call"}
    ]


def test_a_legacy_function_call_mirroring_a_tool_call_is_not_a_second_call() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Rome"}'}}
    message = {"role": "assistant", "content": None, "tool_calls": [call], "function_call": call["function"]}
    items = response_items("chat", {"choices": [{"index": 0, "message": message}]})

    assert items is not None
    assert [(item["type"], item["call_id"]) for item in items] == [("tool_call", "call_1")]


@settings(max_examples=200, deadline=None)
@given(dialect=st.sampled_from(["responses", "chat", "messages"]), payload=JSON)
def test_any_json_reads_into_outputs_that_flatten_to_the_response_items(dialect: str, payload: Any) -> None:
    outputs = response_outputs(dialect, payload)
    flat = None if outputs is None else [item for output in outputs for item in output]

    assert flat == response_items(dialect, payload)
    for item in flat or []:
        assert item.get("item_id") is None or isinstance(item["item_id"], str)
    found = served_response_id(payload)
    assert found is None or (isinstance(found, str) and found == payload.get("id"))


# --- the raw items the content fingerprint reads ----------------------------------------------------


@pytest.mark.parametrize(("earlier", "follow_up"), RECORDED_CHAINS)
def test_a_follow_up_request_replays_the_earlier_calls_model_authored_spine(earlier: str, follow_up: str) -> None:
    first, second = fixture(earlier), fixture(follow_up)
    first_request = fingerprint_request_items(first.dialect, first.request_json)
    first_outputs = fingerprint_outputs(first.dialect, reassembled_response(first))
    replayed = fingerprint_request_items(second.dialect, second.request_json)
    assert first_request is not None and first_outputs is not None and replayed is not None

    # The earlier call's continuation is what the follow-up request's model-authored turns say.
    assert fingerprint([*first_request, *first_outputs[0]]) == fingerprint(replayed) != ""


def test_fingerprint_items_are_the_providers_own_objects_unread() -> None:
    refusal = {"type": "refusal", "refusal": "no"}
    output = [{"type": "message", "role": "assistant", "content": [refusal]}, "junk"]

    assert fingerprint_outputs("responses", {"output": output}) == [output]
    assert fingerprint_request_items("responses", {"instructions": "s", "input": "hi"}) == []
    assert fingerprint_request_items("responses", {"input": [1, {"role": "user"}]}) == [1, {"role": "user"}]
    assert fingerprint_request_items("messages", {"system": "s", "messages": [{"role": "user", "content": "x"}]}) == [
        {"role": "user", "content": "x"}
    ]
    message = {"id": "msg_1", "type": "message", "role": "assistant", "content": "x"}
    assert fingerprint_outputs("messages", message) == [[message]]


def test_chat_outputs_are_one_message_per_choice_in_index_order() -> None:
    first, second = {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}
    response = {"choices": [{"index": 1, "message": second}, "junk", {"index": 0, "message": first}, {"index": 2}]}

    assert fingerprint_outputs("chat", response) == [[first], [second]]


@pytest.mark.parametrize(
    ("dialect", "value"),
    [
        ("chat", {"messages": "x"}),
        ("messages", {}),
        ("responses", {"input": 5}),
        ("nope", {"input": []}),
        ("chat", None),
    ],
    ids=repr,
)
def test_unknown_request_shapes_give_none(dialect: str, value: Any) -> None:
    assert fingerprint_request_items(dialect, value) is None


@pytest.mark.parametrize(
    ("dialect", "value"),
    [
        ("chat", {"choices": "x"}),
        ("messages", {"content": 5}),
        ("responses", {"output": {}}),
        ("nope", {}),
        ("chat", []),
    ],
    ids=repr,
)
def test_unknown_response_shapes_give_none(dialect: str, value: Any) -> None:
    assert fingerprint_outputs(dialect, value) is None
