"""Terminal attribution: witnesses, abstention, agreement, contradictions, custody rows, junk.

Entries are built from the real recorded exchanges. Where a scenario needs a second serving of
the same content (a retry, a reissued id), the recorded response is copied and its served ids
are rewritten, which is what a backend does when it serves the same output again.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from itertools import combinations
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtap.dialects import DIALECTS
from llmtap.exchange import Exchange
from llmtap.records import ModelCallRecord, raw_line_from_exchange
from llmtap.rollouts.terminal import (
    FALLBACK_MASK,
    FALLBACK_SINGLE_CHAIN,
    METHODS,
    WITNESSES,
    TerminalAttribution,
    continuation_fingerprint,
    output_fingerprint,
    resolve_terminal,
)
from tests.fixtures import RecordedExchange, all_fixtures, fixture

# Three real Responses calls: a tool call, the follow-up answer that used its result, and an
# unrelated call that made two parallel tool calls.
CALL = "responses/function-call-gpt55"
ANSWER = "responses/function-call-output-followup-gpt55"
PARALLEL = "responses/parallel-function-calls-gpt4o"


def body_of(name: str) -> dict[str, Any]:
    body = json.loads(fixture(name).body_text)
    assert isinstance(body, dict)
    return body


def reissued(value: Any, suffix: str) -> Any:
    """The same content with every served id (`id`, `call_id`) rewritten, as a new serving."""
    if isinstance(value, dict):
        return {
            key: item + suffix if key in ("id", "call_id") and isinstance(item, str) else reissued(item, suffix)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [reissued(item, suffix) for item in value]
    return value


def without_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items as a harness that kept only their content would write them: item ids dropped.

    A tool call's `call_id` is part of its content (the fingerprint hashes it), so it stays.
    """
    return [{key: value for key, value in item.items() if key != "id"} for item in items]


def record(
    name: str,
    call_id: str,
    index: int = 0,
    *,
    body: dict[str, Any] | None = None,
    tokens: tuple[list[int], list[int]] | None = None,
) -> ModelCallRecord:
    """A captured call from a recorded exchange; `tokens` adds vLLM-style token ids."""
    response = copy.deepcopy(body if body is not None else body_of(name))
    if tokens is not None:
        response["prompt_token_ids"], response["token_ids"] = tokens
    line = {"model_call_id": call_id, "dialect": fixture(name).dialect, "request": fixture(name).request_json}
    return ModelCallRecord.from_raw_line({**line, "response": response}, index)


def output_of(entry: ModelCallRecord) -> list[dict[str, Any]]:
    assert entry.response is not None
    return copy.deepcopy(entry.response["output"])


def named(attribution: TerminalAttribution) -> dict[str, str]:
    return {w.witness: str(w.model_call_id) for w in attribution.witnesses if w.verdict == "named"}


def verdicts(attribution: TerminalAttribution) -> dict[str, str]:
    return {w.witness: w.verdict for w in attribution.witnesses}


@pytest.fixture
def rollout() -> list[ModelCallRecord]:
    return [record(CALL, "c1", 0), record(ANSWER, "c2", 1), record(PARALLEL, "c3", 2)]


# --- each witness alone, and every pair ------------------------------------------------------

# How each witness is made to name one call while the others stay silent or abstain. Each
# returns keyword changes to resolve_terminal's arguments; `response` parts are merged.
Setup = Callable[[dict[str, ModelCallRecord]], dict[str, Any]]


def _explicit(target: str) -> Setup:
    return lambda calls: {"explicit_call_id": target}


def _declared(target: str) -> Setup:
    return lambda calls: {"declared_response_id": calls[target].response_id}


def _response_id(target: str) -> Setup:
    return lambda calls: {"response": {"id": calls[target].response_id}}


def _item_id(target: str) -> Setup:
    # The last item of a two-item output, alone after a user turn: its id and content name the
    # call, but neither the whole nor the trailing block matches any call's own output.
    def setup(calls: dict[str, ModelCallRecord]) -> dict[str, Any]:
        user_turn = {"type": "message", "role": "user", "content": "go on"}
        return {"response": {"output": [user_turn, output_of(calls[target])[-1]]}}

    return setup


def _content(target: str) -> Setup:
    return lambda calls: {"response": {"output": without_ids(output_of(calls[target]))}}


# The witnesses' natural target in the rollout: item_id needs a call with two output items.
SETUPS: dict[str, Callable[[str], Setup]] = {
    "explicit": _explicit,
    "declared": _declared,
    "response_id": _response_id,
    "item_id": _item_id,
    "content": _content,
}
# The verdict's method for each witness's setup: content names c2 by its own output.
METHOD = {"explicit": "explicit", "declared": "declared", "response_id": "response_id", "item_id": "item_id"}
METHOD["content"] = "content_output"
TARGET = {"explicit": "c2", "declared": "c2", "response_id": "c2", "item_id": "c3", "content": "c2"}
OTHER = {"explicit": "c1", "declared": "c1", "response_id": "c1", "item_id": "c3", "content": "c2"}


def _arguments(rollout: list[ModelCallRecord], chosen: dict[str, str]) -> dict[str, Any]:
    calls = {entry.model_call_id: entry for entry in rollout}
    arguments: dict[str, Any] = {"response": None}
    for witness, target in chosen.items():
        changes = SETUPS[witness](target)(calls)
        if "response" in changes:
            part = changes.pop("response")
            if arguments["response"] is not None and "output" in part and "output" in arguments["response"]:
                raise AssertionError("two witnesses cannot both set the output")
            arguments["response"] = {**(arguments["response"] or {}), **part}
        arguments.update(changes)
    return arguments


@pytest.mark.parametrize("witness", WITNESSES)
def test_each_witness_alone_attributes_its_call(rollout: list[ModelCallRecord], witness: str) -> None:
    attribution = resolve_terminal(rollout, **_arguments(rollout, {witness: TARGET[witness]}))

    assert named(attribution) == {witness: TARGET[witness]}
    assert attribution.attributed and attribution.model_call_id == TARGET[witness]
    assert attribution.method == METHOD[witness]
    assert attribution.corroborated_by == ()
    assert attribution.contradictions == () and attribution.fallback is None


def _pair_targets(first: str, second: str, *, agree: bool) -> dict[str, str] | None:
    """Targets for a pair; the response-side pair item_id/content needs its own rollout."""
    if {first, second} == {"item_id", "content"}:
        return None
    if agree:
        shared = "c3" if "item_id" in (first, second) else "c2"
        return {first: shared, second: shared}
    if "item_id" in (first, second):
        return {first: "c3" if first == "item_id" else "c1", second: "c3" if second == "item_id" else "c1"}
    return {first: "c1", second: "c2"}


PAIRS = list(combinations(WITNESSES, 2))


@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_every_pair_of_agreeing_witnesses_attributes(
    rollout: list[ModelCallRecord], first: str, second: str
) -> None:
    targets = _pair_targets(first, second, agree=True)
    if targets is None:  # both read the response's items: the recorded answer itself
        targets = {first: "c2", second: "c2"}
        arguments: dict[str, Any] = {"response": {"output": output_of(rollout[1])}}
    else:
        arguments = _arguments(rollout, targets)
    attribution = resolve_terminal(rollout, **arguments)

    assert named(attribution) == targets
    assert attribution.model_call_id == targets[first]
    assert attribution.method == METHOD[first]
    assert attribution.reason.endswith(f"corroborated_by={METHOD[second]}")
    assert attribution.corroborated_by == (METHOD[second],)
    assert attribution.contradictions == () and attribution.fallback is None


@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_every_pair_of_contradicting_witnesses_attributes_nothing_and_keeps_the_disagreement(
    rollout: list[ModelCallRecord], first: str, second: str
) -> None:
    targets = _pair_targets(first, second, agree=False)
    entries = list(rollout)
    if targets is None:
        # c5 served the answer message after the tool call in one output; c4, a retry, served the
        # same message alone under a fresh message id. The transcript is that message with c5's
        # id: its id names c5, and its content (message ids are not content) is exactly c4's
        # whole output. Tool-call ids are content, so only a message can make this split.
        answer = body_of(ANSWER)
        combined = {**answer, "id": "resp_c5", "output": [*output_of(rollout[0]), *answer["output"]]}
        entries = [rollout[0], rollout[2], record(ANSWER, "c5", 3, body=combined)]
        entries.append(record(ANSWER, "c4", 4, body=reissued(answer, "-retry")))
        targets = {"item_id": "c5", "content": "c4"}
        arguments: dict[str, Any] = {"response": {"output": answer["output"]}}
    else:
        arguments = _arguments(rollout, targets)
    attribution = resolve_terminal(entries, **arguments)

    assert named(attribution) == targets
    assert not attribution.attributed and attribution.method == ""
    assert set(attribution.contradictions) == set(targets.items())
    declared = "declared" in targets
    assert attribution.fallback == (FALLBACK_MASK if declared else FALLBACK_SINGLE_CHAIN)
    assert all(call in attribution.reason for call in targets.values())


def test_all_five_witnesses_agreeing_name_the_first_and_list_the_others_as_corroborating(
    rollout: list[ModelCallRecord],
) -> None:
    answer = rollout[1]
    attribution = resolve_terminal(
        rollout, answer.response, explicit_call_id="c2", declared_response_id=answer.response_id
    )

    assert attribution.model_call_id == "c2"
    assert attribution.method == "explicit"
    assert "corroborated_by=declared+response_id+item_id+content_output" in attribution.reason
    assert attribution.corroborated_by == ("declared", "response_id", "item_id", "content_output")


# --- transcripts -------------------------------------------------------------------------------


def test_a_merged_transcript_names_its_last_model_call_by_every_response_witness(
    rollout: list[ModelCallRecord],
) -> None:
    tool_output = {"type": "function_call_output", "call_id": "call_nJmCK7SJe3ajdYYplIbH0KgL", "output": "2869461"}
    transcript = {"output": [*output_of(rollout[0]), tool_output, *output_of(rollout[1])]}

    attribution = resolve_terminal(rollout, transcript)

    assert named(attribution) == {"item_id": "c2", "content": "c2"}
    content = next(w for w in attribution.witnesses if w.witness == "content")
    assert "cumulative" in content.detail and "trailing block" in content.detail


def test_tool_outputs_after_the_last_model_item_do_not_move_the_terminal_call(
    rollout: list[ModelCallRecord],
) -> None:
    tool_output = {"type": "function_call_output", "call_id": "call_nJmCK7SJe3ajdYYplIbH0KgL", "output": "2869461"}
    attribution = resolve_terminal(rollout, {"output": [*output_of(rollout[0]), tool_output]})

    assert named(attribution) == {"item_id": "c1", "content": "c1"}
    assert attribution.model_call_id == "c1"


def test_a_message_the_harness_composed_itself_abstains_instead_of_naming_an_earlier_call(
    rollout: list[ModelCallRecord],
) -> None:
    composed = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}
    attribution = resolve_terminal(rollout, {"output": [*output_of(rollout[0]), composed]})

    assert verdicts(attribution)["item_id"] == "abstained"
    assert verdicts(attribution)["content"] == "abstained"
    assert not attribution.attributed and attribution.fallback == FALLBACK_SINGLE_CHAIN


def test_a_reused_item_id_with_different_content_names_no_call(rollout: list[ModelCallRecord]) -> None:
    last = output_of(rollout[0])[-1]
    forged = {**last, "arguments": '{"a": 1, "b": 2}'}
    attribution = resolve_terminal(rollout, {"output": [forged]})

    item = next(w for w in attribution.witnesses if w.witness == "item_id")
    assert item.verdict == "abstained" and "different content" in item.detail
    assert not attribution.attributed


def test_a_chat_backend_call_is_named_by_a_responses_transcript_with_a_namespaced_tool() -> None:
    served = body_of("chat/tool-call-gpt4o")
    served["choices"][0]["message"]["tool_calls"][0]["function"]["name"] = "weather_ns__weather"
    entries = [record("chat/tool-call-gpt4o", "chat-1", 0, body=served), record("chat/text-basic-gpt4o", "aux", 1)]
    call = served["choices"][0]["message"]["tool_calls"][0]
    transcript = {
        "output": [
            {
                "type": "function_call",
                "call_id": call["id"],
                "namespace": "weather_ns",
                "name": "weather",
                "arguments": '{"location": "Florence, Italy"}',
            }
        ]
    }

    attribution = resolve_terminal(entries, transcript)

    assert named(attribution) == {"item_id": "chat-1", "content": "chat-1"}
    # A first call's cumulative fingerprint is its own output's: the cumulative reading names it.
    assert attribution.method == "item_id" and attribution.corroborated_by == ("content_cumulative",)

    # Without its namespace the call hashes another name: only the item id (bare names) names it.
    del transcript["output"][0]["namespace"]
    assert named(resolve_terminal(entries, transcript)) == {"item_id": "chat-1"}


# --- ambiguity, retries ------------------------------------------------------------------------


def test_ambiguity_inside_one_witness_is_an_abstention_not_a_vote(rollout: list[ModelCallRecord]) -> None:
    retry = record(ANSWER, "c2-retry", 3, body=reissued(rollout[1].response, "-again"))
    attribution = resolve_terminal([*rollout, retry], rollout[1].response)

    content = next(w for w in attribution.witnesses if w.witness == "content")
    assert content.verdict == "abstained" and "c2" in content.detail and "c2-retry" in content.detail
    assert named(attribution) == {"response_id": "c2", "item_id": "c2"}
    assert attribution.model_call_id == "c2"


def test_a_backend_that_reused_a_response_id_makes_the_response_id_witness_abstain(
    rollout: list[ModelCallRecord],
) -> None:
    reused = record(CALL, "c1-reused", 3, body={**body_of(CALL), "id": rollout[1].response_id})
    attribution = resolve_terminal([*rollout, reused], {"id": rollout[1].response_id})

    assert verdicts(attribution)["response_id"] == "abstained"
    assert not attribution.attributed


def test_identical_retries_collapse_to_the_smallest_call_id() -> None:
    tokens = ([1, 2, 3], [4, 5])
    first = record(ANSWER, "r-b", 0, tokens=tokens)
    second = record(ANSWER, "r-a", 1, body=reissued(body_of(ANSWER), "-2"), tokens=tokens)
    final = {"output": without_ids(output_of(first))}

    attribution = resolve_terminal([first, second], final)

    assert attribution.model_call_id == "r-a"
    assert "identical token sequences" in next(w for w in attribution.witnesses if w.witness == "content").detail


def test_witnesses_naming_identical_retries_attribute_instead_of_contradicting() -> None:
    tokens = ([7, 8], [9])
    kept = record(ANSWER, "r-2", 0, tokens=tokens)
    retry = record(ANSWER, "r-1", 1, body=reissued(body_of(ANSWER), "-2"), tokens=tokens)

    attribution = resolve_terminal([kept, retry], kept.response, explicit_call_id="r-2")

    assert named(attribution)["explicit"] == "r-2" and named(attribution)["content"] == "r-1"
    # The first witness's call stands, not the smallest id (content-fingerprint.md).
    assert attribution.model_call_id == "r-2" and attribution.method == "explicit"
    assert attribution.corroborated_by == ("response_id", "item_id", "content_output")
    assert attribution.contradictions == ()


def test_retries_with_different_token_sequences_stay_ambiguous() -> None:
    first = record(ANSWER, "r-1", 0, tokens=([1, 2, 3], [4, 5]))
    second = record(ANSWER, "r-2", 1, body=reissued(body_of(ANSWER), "-2"), tokens=([1, 2, 3], [4, 6]))

    attribution = resolve_terminal([first, second], {"output": without_ids(output_of(first))})

    assert verdicts(attribution)["content"] == "abstained"
    assert not attribution.attributed


def test_retries_without_token_ids_are_never_assumed_identical() -> None:
    first = record(ANSWER, "r-1", 0)
    second = record(ANSWER, "r-2", 1, body=reissued(body_of(ANSWER), "-2"))

    attribution = resolve_terminal([first, second], {"output": without_ids(output_of(first))})

    assert verdicts(attribution)["content"] == "abstained"
    assert attribution.fallback == FALLBACK_SINGLE_CHAIN


# --- declared, fallback ----------------------------------------------------------------------


def test_a_declared_response_id_no_call_served_stops_selection_and_masks(rollout: list[ModelCallRecord]) -> None:
    attribution = resolve_terminal(rollout, rollout[1].response, declared_response_id="resp_unknown")

    assert named(attribution) == {"response_id": "c2", "item_id": "c2", "content": "c2"}
    assert not attribution.attributed
    assert attribution.fallback == FALLBACK_MASK and "Selection stops" in attribution.reason


def test_a_declared_response_id_two_calls_served_stops_selection(rollout: list[ModelCallRecord]) -> None:
    twin = record(CALL, "c1-twin", 3)
    attribution = resolve_terminal([*rollout, twin], None, declared_response_id=rollout[0].response_id)

    assert verdicts(attribution)["declared"] == "abstained"
    assert not attribution.attributed and attribution.fallback == FALLBACK_MASK


def test_an_explicit_miss_is_soft_and_other_witnesses_still_attribute(rollout: list[ModelCallRecord]) -> None:
    attribution = resolve_terminal(rollout, rollout[1].response, explicit_call_id="no-such-call")

    assert verdicts(attribution)["explicit"] == "abstained"
    assert attribution.model_call_id == "c2"


def test_with_nothing_declared_and_no_witness_the_single_chain_policy_decides(
    rollout: list[ModelCallRecord],
) -> None:
    attribution = resolve_terminal(rollout, None)

    assert set(verdicts(attribution).values()) == {"silent"}
    assert not attribution.attributed and attribution.fallback == FALLBACK_SINGLE_CHAIN


@pytest.mark.parametrize(
    "recorded",
    [f for f in all_fixtures() if f.status == 200],
    ids=lambda f: f.id,
)
def test_every_recorded_response_is_attributed_to_its_call_among_others_without_declarations(
    recorded: RecordedExchange,
) -> None:
    other = fixture("messages/text-basic-sonnet4" if recorded.dialect != "messages" else "chat/text-basic-gpt4o")
    entries = [captured(other, "aux-1", 0), captured(recorded, "terminal", 1), captured(other, "aux-2", 2)]
    terminal = entries[1]

    attribution = resolve_terminal(entries, terminal.response)

    assert attribution.model_call_id == "terminal"
    assert named(attribution)["response_id"] == "terminal"
    assert set(named(attribution).values()) == {"terminal"}
    assert attribution.method == "response_id" and set(attribution.corroborated_by) <= set(METHODS)
    assert "item_id" not in named(attribution) or attribution.corroborated_by[0] == "item_id"


def captured(recorded: RecordedExchange, call_id: str, index: int) -> ModelCallRecord:
    """The record the capture pipeline writes for a recorded exchange, streams reassembled."""
    exchange = Exchange(
        method="POST",
        path=recorded.request_path,
        request_body=json.dumps(recorded.request_json).encode(),
        model_call_id=call_id,
    )
    exchange.status_code = recorded.status
    exchange.response_headers = {"content-type": recorded.content_type}
    exchange.add_response_chunk(recorded.body_bytes)
    return ModelCallRecord.from_raw_line(raw_line_from_exchange(exchange), index)


# --- entry shapes and custody rows -------------------------------------------------------------


def test_record_dicts_and_raw_lines_attribute_like_records(rollout: list[ModelCallRecord]) -> None:
    as_dicts = [entry.to_dict() for entry in rollout]
    raw_lines = [
        {"model_call_id": e.model_call_id, "dialect": e.dialect, "request": e.request, "response": e.response}
        for e in rollout
    ]
    expected = resolve_terminal(rollout, rollout[1].response).to_dict()

    assert resolve_terminal(as_dicts, rollout[1].response).to_dict() == expected
    assert resolve_terminal(raw_lines, rollout[1].response).to_dict() == expected


def test_records_without_payloads_still_answer_to_response_and_tool_call_ids(rollout: list[ModelCallRecord]) -> None:
    slim = [entry.to_dict(include_payloads=False) for entry in rollout]
    attribution = resolve_terminal(slim, rollout[0].response)

    assert named(attribution) == {"response_id": "c1", "item_id": "c1"}
    assert attribution.model_call_id == "c1"


def custody_row(entry: ModelCallRecord, key: str, *, digest: str, length: int = 12) -> dict[str, Any]:
    """A token-free custody row for a call: its tokens live in framework storage under `key`."""
    assert entry.dialect is not None
    return {
        "model_call_id": entry.model_call_id,
        "staging_key": key,
        "response_id": entry.response_id,
        "cumulative_hash": digest,
        "chain_hash": "chain-" + digest,
        "cumulative_length": length,
        "output_fingerprint": output_fingerprint(entry.response, dialect=entry.dialect),
        "continuation_fingerprint": continuation_fingerprint(entry.request, entry.response, dialect=entry.dialect),
        "fingerprint_version": 2,
    }


def test_custody_rows_are_attributed_by_their_precomputed_fingerprints(rollout: list[ModelCallRecord]) -> None:
    rows = [custody_row(entry, f"stage/{i}", digest=f"h{i}") for i, entry in enumerate(rollout)]
    tool_output = {"type": "function_call_output", "call_id": "call_nJmCK7SJe3ajdYYplIbH0KgL", "output": "2869461"}
    transcript = {"output": without_ids([*output_of(rollout[0]), tool_output, *output_of(rollout[1])])}

    attribution = resolve_terminal(rows, transcript)

    assert named(attribution) == {"content": "c2"}
    assert "cumulative" in next(w for w in attribution.witnesses if w.witness == "content").detail


def test_custody_rows_with_the_same_cumulative_hash_collapse_and_different_ones_do_not() -> None:
    first, second = record(ANSWER, "k-2", 0), record(ANSWER, "k-1", 1, body=reissued(body_of(ANSWER), "-2"))
    final = {"output": without_ids(output_of(first))}

    same = resolve_terminal([custody_row(first, "s/0", digest="h"), custody_row(second, "s/1", digest="h")], final)
    different = resolve_terminal(
        [custody_row(first, "s/0", digest="h"), custody_row(second, "s/1", digest="h2")], final
    )
    other_length = resolve_terminal(
        [custody_row(first, "s/0", digest="h"), custody_row(second, "s/1", digest="h", length=13)], final
    )

    assert same.model_call_id == "k-1"
    assert not different.attributed and not other_length.attributed


def test_a_custody_row_identifies_only_by_its_staged_hash_never_by_stray_token_arrays() -> None:
    first, second = record(ANSWER, "k-1", 0), record(ANSWER, "k-2", 1, body=reissued(body_of(ANSWER), "-2"))
    rows = []
    for entry, key in ((first, "s/0"), (second, "s/1")):
        row = custody_row(entry, key, digest="unused")
        del row["cumulative_hash"], row["chain_hash"]
        rows.append({**row, "prompt_token_ids": [1, 2], "completion_token_ids": [3]})

    attribution = resolve_terminal(rows, {"output": without_ids(output_of(first))})

    assert verdicts(attribution)["content"] == "abstained"


def test_fingerprints_ignore_item_ids_and_argument_formatting_but_not_tool_call_ids(
    rollout: list[ModelCallRecord],
) -> None:
    body = copy.deepcopy(rollout[0].response)
    assert body is not None
    body["output"][0]["arguments"] = '{ "b": 2331,  "a": 1231 }'
    body["output"][0]["id"] = "fc_other"
    original = output_fingerprint(rollout[0].response, dialect="responses")

    assert output_fingerprint(body, dialect="responses") == original
    assert output_fingerprint(reissued(body, "-x"), dialect="responses") != original
    assert output_fingerprint({"output": []}, dialect="responses") == ""
    assert output_fingerprint({"output": [1]}, dialect="responses") is None


# --- the reading rules of content-fingerprint.md -------------------------------------------------

CHAT_CALL, CHAT_ANSWER = "chat/tool-call-gpt4o", "chat/tool-result-followup-gpt4o"
CLAUDE_CALL, CLAUDE_ANSWER = "messages/tool-use-sonnet4", "messages/tool-result-followup-sonnet4"


def chat_message(name: str) -> dict[str, Any]:
    message = body_of(name)["choices"][0]["message"]
    assert isinstance(message, dict)
    return message


@pytest.fixture
def chat_rollout() -> list[ModelCallRecord]:
    return [record(CHAT_CALL, "k1", 0), record(CHAT_ANSWER, "k2", 1), record("chat/text-basic-gpt4o", "aux", 2)]


def finding(attribution: TerminalAttribution, witness: str) -> Any:
    return next(w for w in attribution.witnesses if w.witness == witness)


def test_chat_tool_calls_on_an_assistant_message_are_model_authored_content(
    chat_rollout: list[ModelCallRecord],
) -> None:
    user = {"role": "user", "content": "What's the weather in Florence,Italy?"}
    call = chat_message(CHAT_CALL)

    attribution = resolve_terminal(chat_rollout, {"output": [user, call]})

    assert named(attribution) == {"content": "k1"}
    assert attribution.method == "content_cumulative"  # a first call: its cumulative is its own output
    # Read as text only, the message would be an empty assistant turn and name nothing.
    text_only = resolve_terminal(chat_rollout, {"output": [user, {**call, "tool_calls": None}]})
    assert verdicts(text_only)["content"] == "abstained" and not text_only.attributed


def test_a_full_chat_transcript_matches_the_cumulative_fingerprint_of_its_last_call(
    chat_rollout: list[ModelCallRecord],
) -> None:
    context = copy.deepcopy(fixture(CHAT_ANSWER).request_json["messages"])
    attribution = resolve_terminal(chat_rollout, {"output": [*context, chat_message(CHAT_ANSWER)]})

    assert named(attribution) == {"content": "k2"}
    assert attribution.method == "content_cumulative"
    assert "cumulative" in finding(attribution, "content").detail


def test_a_transcript_that_ends_with_a_tool_result_has_no_trailing_block(chat_rollout: list[ModelCallRecord]) -> None:
    context = copy.deepcopy(fixture(CHAT_ANSWER).request_json["messages"])  # ends with the tool message
    attribution = resolve_terminal(chat_rollout, {"output": context})

    # Only the cumulative reading can match it: the spine is the first call's tool call.
    assert named(attribution) == {"content": "k1"}
    assert "trailing block" not in finding(attribution, "content").detail

    # A transcript whose earlier turns the harness rewrote matches nothing once a tool result ends it.
    rewritten = [{"role": "assistant", "content": "I looked it up."}, *context[1:]]
    assert verdicts(resolve_terminal(chat_rollout, {"output": rewritten}))["content"] == "abstained"


def test_the_trailing_block_stops_at_the_last_non_model_item(chat_rollout: list[ModelCallRecord]) -> None:
    composed = {"role": "assistant", "content": "Let me think about the weather."}
    answer = chat_message(CHAT_ANSWER)
    transcript = {"output": [composed, {"role": "user", "content": "go on"}, answer]}

    attribution = resolve_terminal(chat_rollout, transcript)

    assert named(attribution) == {"content": "k2"}
    assert attribution.method == "content_output"
    assert "trailing block" in finding(attribution, "content").detail
    # A reasoning item after the answer ends the block too: nothing trails.
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
    assert verdicts(resolve_terminal(chat_rollout, {"output": [*transcript["output"], reasoning]}))["content"] == (
        "abstained"
    )


def test_anthropic_tool_use_blocks_in_the_output_are_content_and_match_every_shape_of_the_turn() -> None:
    entries = [record(CLAUDE_CALL, "m1", 0), record(CLAUDE_ANSWER, "m2", 1)]
    served = body_of(CLAUDE_CALL)
    as_anthropic = {"role": "assistant", "content": served["content"]}
    text, tool_use = served["content"]
    as_responses = [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text["text"]}]},
        {
            "type": "function_call",
            "call_id": tool_use["id"],
            "name": "weather",
            "arguments": json.dumps(tool_use["input"]),
        },
    ]
    as_chat = {
        "role": "assistant",
        "content": text["text"],
        "tool_calls": [
            {
                "id": tool_use["id"],
                "type": "function",
                "function": {"name": "weather", "arguments": '{"location":"Florence,Italy"}'},
            }
        ],
    }

    for output in ([as_anthropic], as_responses, [as_chat]):
        attribution = resolve_terminal(entries, {"output": output})
        assert named(attribution)["content"] == "m1" and attribution.model_call_id == "m1"
    text_only = resolve_terminal(entries, {"output": [{"role": "assistant", "content": [text]}]})
    assert verdicts(text_only)["content"] == "abstained"


def test_tool_call_ids_are_part_of_the_content(chat_rollout: list[ModelCallRecord]) -> None:
    call = chat_message(CHAT_CALL)
    call["tool_calls"][0]["id"] = "call_someone_elses"

    attribution = resolve_terminal(chat_rollout, {"output": [call]})

    assert verdicts(attribution)["content"] == "abstained" and not attribution.attributed


def test_an_empty_assistant_message_still_fingerprints() -> None:
    empty = body_of("chat/text-basic-gpt4o")
    empty["choices"][0]["message"]["content"] = ""
    entries = [record("chat/text-basic-gpt4o", "silent-call", 0, body=empty), record(CHAT_CALL, "k1", 1)]

    attribution = resolve_terminal(entries, {"output": [{"role": "user", "content": "hi"}, {"role": "assistant"}]})

    assert named(attribution) == {"content": "silent-call"}


def test_a_message_with_no_role_is_not_model_authored(rollout: list[ModelCallRecord]) -> None:
    roleless = [{key: value for key, value in item.items() if key != "role"} for item in output_of(rollout[1])]

    attribution = resolve_terminal(rollout, {"output": roleless})

    assert verdicts(attribution)["content"] == "silent" and verdicts(attribution)["item_id"] == "silent"


def test_non_json_tool_arguments_compare_stripped() -> None:
    served = body_of(CALL)
    served["output"][0]["arguments"] = "multiply 1231 2331"
    entries = [record(CALL, "shell", 0, body=served), record(ANSWER, "c2", 1)]
    transcript_item = {**served["output"][0], "arguments": "  multiply 1231 2331\n"}

    attribution = resolve_terminal(entries, {"output": [transcript_item]})

    assert named(attribution) == {"item_id": "shell", "content": "shell"}
    other = resolve_terminal(entries, {"output": [{**transcript_item, "arguments": "multiply 1231  2331"}]})
    assert verdicts(other)["content"] == "abstained" and verdicts(other)["item_id"] == "abstained"


def test_witnesses_agreeing_on_one_identity_name_the_first_witness_call_not_the_smallest_id() -> None:
    tokens = ([1, 2], [3])
    kept = record(ANSWER, "z-kept", 0, tokens=tokens)
    retry = record(ANSWER, "a-retry", 1, body=reissued(body_of(ANSWER), "-2"), tokens=tokens)
    transcript = {"output": output_of(kept)}  # the kept call's message, with its served id

    attribution = resolve_terminal([kept, retry], transcript)

    assert named(attribution) == {"item_id": "z-kept", "content": "a-retry"}  # content collapses to the smallest
    assert attribution.model_call_id == "z-kept"
    assert attribution.method == "item_id" and attribution.corroborated_by == ("content_output",)


def test_empty_string_explicit_and_declared_ids_count_as_absent(rollout: list[ModelCallRecord]) -> None:
    attribution = resolve_terminal(rollout, rollout[1].response, explicit_call_id="", declared_response_id="")

    assert verdicts(attribution)["explicit"] == "silent" and verdicts(attribution)["declared"] == "silent"
    assert attribution.model_call_id == "c2" and attribution.method == "response_id"


# --- custody rows and lineage entries: stored fingerprints and their version ----------------------


def full_transcript(rollout: list[ModelCallRecord]) -> dict[str, Any]:
    tool_output = {"type": "function_call_output", "call_id": "call_nJmCK7SJe3ajdYYplIbH0KgL", "output": "2869461"}
    return {"output": without_ids([*output_of(rollout[0]), tool_output, *output_of(rollout[1])])}


def test_a_custody_row_of_version_2_is_attributed_with_the_method_content(rollout: list[ModelCallRecord]) -> None:
    rows = [custody_row(entry, f"stage/{i}", digest=f"h{i}") for i, entry in enumerate(rollout)]

    full = resolve_terminal(rows, full_transcript(rollout))
    final_turn = resolve_terminal(rows, {"output": without_ids(output_of(rollout[1]))})

    assert full.model_call_id == final_turn.model_call_id == "c2"
    assert full.method == final_turn.method == "content"
    assert "cumulative" in finding(full, "content").detail and "own output" in finding(final_turn, "content").detail


@pytest.mark.parametrize("version", [None, 1, 3, "2", 2.0, True])
def test_a_custody_row_of_any_other_version_is_not_comparable(rollout: list[ModelCallRecord], version: Any) -> None:
    rows = [
        {**custody_row(entry, f"stage/{i}", digest=f"h{i}"), "fingerprint_version": version}
        for i, entry in enumerate(rollout)
    ]
    if version is None:
        rows = [{key: value for key, value in row.items() if key != "fingerprint_version"} for row in rows]

    attribution = resolve_terminal(rows, full_transcript(rollout))

    content = finding(attribution, "content")
    assert content.verdict == "abstained" and "not comparable" in content.detail
    assert not attribution.attributed


def test_a_custody_row_is_told_by_its_staging_key_and_never_recomputes_from_payloads(
    rollout: list[ModelCallRecord],
) -> None:
    # A row with a staging key and the payloads too: only its stored fingerprints count.
    row = {**rollout[1].to_dict(), **custody_row(rollout[1], "stage/1", digest="h1"), "output_fingerprint": "0" * 64}
    del row["continuation_fingerprint"]

    attribution = resolve_terminal([row], {"output": without_ids(output_of(rollout[1]))})

    assert verdicts(attribution)["content"] == "abstained"


def lineage_entry(entry: ModelCallRecord, *, digest: str, length: int, version: Any = 2) -> dict[str, Any]:
    """A lineage-aware writer's entry: a recorded digest and continuation fingerprint, no payloads."""
    row = entry.to_dict(include_payloads=False)
    assert entry.dialect is not None
    row.update(
        digest=digest,
        cumulative_length=length,
        continuation_fingerprint=continuation_fingerprint(entry.request, entry.response, dialect=entry.dialect),
        fingerprint_version=version,
    )
    return row


@pytest.mark.parametrize("version", [2, None])
def test_a_lineage_entry_continuation_counts_with_version_2_or_null(
    rollout: list[ModelCallRecord], version: Any
) -> None:
    entries = [lineage_entry(entry, digest=f"d{i}", length=10 + i, version=version) for i, entry in enumerate(rollout)]

    attribution = resolve_terminal(entries, full_transcript(rollout))

    assert named(attribution) == {"content": "c2"} and attribution.method == "content_cumulative"


def test_a_lineage_entry_continuation_of_another_version_is_not_comparable(rollout: list[ModelCallRecord]) -> None:
    entries = [lineage_entry(entry, digest=f"d{i}", length=10 + i, version=1) for i, entry in enumerate(rollout)]

    attribution = resolve_terminal(entries, full_transcript(rollout))

    content = finding(attribution, "content")
    assert content.verdict == "abstained" and "not comparable" in content.detail


def test_a_recorded_digest_and_cumulative_length_identify_a_lineage_entry_and_are_trusted() -> None:
    first = record(ANSWER, "l-2", 0, tokens=([1], [2]))
    second = record(ANSWER, "l-1", 1, body=reissued(body_of(ANSWER), "-2"), tokens=([1], [9]))
    final = {"output": without_ids(output_of(first))}

    def entries(digest_2: str, length_2: int) -> list[dict[str, Any]]:
        return [
            {**first.to_dict(), "digest": "d", "cumulative_length": 3},
            {**second.to_dict(), "digest": digest_2, "cumulative_length": length_2},
        ]

    # The digests agree although the token arrays differ: the recorded digest is trusted.
    assert resolve_terminal(entries("d", 3), final).model_call_id == "l-1"
    assert not resolve_terminal(entries("d2", 3), final).attributed
    assert not resolve_terminal(entries("d", 4), final).attributed
    # A digest identity never equals a token identity, even for the same call's tokens.
    same_tokens = record(ANSWER, "l-1", 1, body=second.response, tokens=([1], [2]))
    mixed = [{**first.to_dict(), "digest": "d", "cumulative_length": 3}, same_tokens]
    assert not resolve_terminal(mixed, final).attributed


# --- malformed input -----------------------------------------------------------------------------

JUNK_RESPONSES: list[Any] = [
    None,
    [],
    "resp_1",
    42,
    {},
    {"id": 5, "output": "text"},
    {"output": [None, 1, "x", {"type": 3, "role": ["user"]}, {"type": "message", "content": {"text": 1}}]},
    {"choices": [None, {"message": "hi"}, {"message": {"tool_calls": [{"function": "f"}, None]}}]},
    {"content": [{"type": "tool_use", "input": "not json"}, {"type": "text", "text": None}], "id": ""},
    {"output": [{"type": "function_call", "arguments": "{", "call_id": 7}], "choices": [{"message": {"content": "x"}}]},
]


class _Exploding:
    """A record-like object whose every field access fails."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(name)


JUNK_ENTRIES: list[Any] = [
    None,
    5,
    "calls",
    {"model_call_id": "x"},
    [None, 1, "a", {}, {"model_call_id": 3}, _Exploding()],
    [{"model_call_id": "m", "dialect": "nope", "response": [1], "request": "r", "tool_calls": [1, {"call_id": 2}]}],
    [{"model_call_id": "m", "staging_key": "s", "cumulative_length": True, "assistant_fingerprint": 1}],
    [{"model_call_id": "m", "prompt_token_ids": [True], "completion_token_ids": "x", "response_id": ["r"]}],
]


@pytest.mark.parametrize("response", JUNK_RESPONSES, ids=repr)
@pytest.mark.parametrize("entries", JUNK_ENTRIES, ids=repr)
def test_malformed_responses_and_entries_never_raise_and_attribute_nothing(entries: Any, response: Any) -> None:
    attribution = resolve_terminal(entries, response, explicit_call_id=None, declared_response_id=None)

    assert not attribution.attributed
    json.dumps(attribution.to_dict())


def test_malformed_responses_beside_real_calls_never_raise(rollout: list[ModelCallRecord]) -> None:
    for response in JUNK_RESPONSES:
        attribution = resolve_terminal(rollout, response)
        assert not attribution.attributed
        assert attribution.fallback == FALLBACK_SINGLE_CHAIN


def test_a_dialect_that_fails_reads_as_an_abstention(
    rollout: list[ModelCallRecord], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(response: Any) -> Any:
        raise RuntimeError("dialect bug")

    monkeypatch.setattr(DIALECTS["responses"], "normalize", broken)
    attribution = resolve_terminal([entry.to_dict(include_payloads=False) for entry in rollout], body_of(ANSWER))

    assert named(attribution) == {"response_id": "c2"}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
field_names = st.sampled_from(
    [
        "model_call_id",
        "dialect",
        "response",
        "request",
        "response_id",
        "tool_calls",
        "staging_key",
        "cumulative_hash",
        "cumulative_length",
        "assistant_fingerprint",
        "continuation_fingerprint",
        "prompt_token_ids",
        "completion_token_ids",
        "id",
        "output",
        "choices",
        "content",
        "call_id",
        "type",
        "role",
    ]
)
plausible = st.recursive(
    json_values,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(field_names | st.text(max_size=4), inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    entries=st.lists(plausible, max_size=4) | plausible,
    response=plausible,
    explicit=json_values,
    declared=json_values,
)
def test_arbitrary_json_never_raises_and_stays_consistent(
    entries: Any, response: Any, explicit: Any, declared: Any
) -> None:
    attribution = resolve_terminal(entries, response, explicit, declared)

    data = attribution.to_dict()
    json.dumps(data)
    assert data["attributed"] == (data["method"] != "") == (data["model_call_id"] is not None)
    assert not (attribution.attributed and attribution.contradictions)
    assert (attribution.fallback is None) == attribution.attributed
    if attribution.attributed:
        ids = [e.get("model_call_id") for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
        assert attribution.model_call_id in ids
        assert attribution.method in METHODS and set(attribution.corroborated_by) <= set(METHODS)
    assert ("corroborated_by=" in attribution.reason) == bool(attribution.corroborated_by)


@settings(max_examples=100, deadline=None)
@given(real=st.sampled_from([CALL, ANSWER, PARALLEL]), response=plausible)
def test_arbitrary_responses_beside_real_calls_never_raise(real: str, response: Any) -> None:
    attribution = resolve_terminal([record(real, "real", 0)], response)

    json.dumps(attribution.to_dict())
    assert attribution.model_call_id in (None, "real")


# --- the attachment shape ------------------------------------------------------------------------


def test_to_dict_lists_every_witness_in_order_with_its_verdict(rollout: list[ModelCallRecord]) -> None:
    data = resolve_terminal(rollout, rollout[1].response, explicit_call_id="c1").to_dict()

    assert list(data) == ["model_call_id", "attributed", "method", "reason", "fallback", "witnesses", "contradictions"]
    assert list(data["witnesses"]) == list(WITNESSES)
    assert all(set(finding) == {"verdict", "model_call_id", "detail"} for finding in data["witnesses"].values())
    assert data["contradictions"] == [
        {"witness": "explicit", "model_call_id": "c1"},
        {"witness": "response_id", "model_call_id": "c2"},
        {"witness": "item_id", "model_call_id": "c2"},
        {"witness": "content", "model_call_id": "c2"},
    ]
