"""Every recorded exchange's record fields, pinned against what the provider's own response says.

For each fixture the call goes through the capture path (an Exchange, its raw line, the
normalized `ModelCallRecord`), and the expected finish reasons (raw and normalized), tool calls
and hosted tool calls are read here, independently, from the recorded response JSON or event
stream: the provider's final object where it sends one, else its events. The rules are issue
17's: the raw finish reason is the provider's own value (Responses: `incomplete_details.reason`
when incomplete, else null), `tool_calls` holds only what the client must execute, and tools the
provider ran itself are `hosted_tool_calls` with their results.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmtap.exchange import Exchange
from llmtap.records import ModelCallRecord, raw_line_from_exchange
from tests.fixtures import RecordedExchange, all_fixtures

FIXTURES = all_fixtures()

# What a client runs among Responses output items; any other `*_call` item the provider ran.
RESPONSES_CLIENT_ITEMS = {"function_call", "custom_tool_call", "computer_call", "local_shell_call", "shell_call", "apply_patch_call"}
MESSAGES_HOSTED_BLOCKS = {"server_tool_use", "mcp_tool_use"}
CHAT_NORMALIZED = {"stop": "stop", "length": "length", "tool_calls": "tool_calls", "content_filter": "content_filter",
                   "function_call": "tool_calls", "error": "error"}
MESSAGES_NORMALIZED = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                       "model_context_window_exceeded": "length", "tool_use": "tool_calls", "refusal": "content_filter"}


def record_of(recorded: RecordedExchange) -> ModelCallRecord:
    exchange = Exchange(
        method="POST",
        path=recorded.request_path,
        request_body=json.dumps(recorded.request_json).encode(),
        status_code=recorded.status,
        response_headers={"content-type": recorded.content_type},
    )
    exchange.add_response_chunk(recorded.body_bytes)
    return ModelCallRecord.from_raw_line(raw_line_from_exchange(exchange), 0)


def events(recorded: RecordedExchange) -> list[dict[str, Any]]:
    """The JSON data of every event of a recorded stream, in order (keep-alives and `[DONE]` left out)."""
    found = []
    for line in recorded.body_text.splitlines():
        if line.startswith("data:"):
            data = line[len("data:") :].strip()
            if data and data != "[DONE]":
                found.append(json.loads(data))
    return found


def arguments(text: Any) -> Any:
    if isinstance(text, str):
        return json.loads(text) if text.strip() else {}
    return text


# --- what each provider's response says ----------------------------------------------------------


def chat_expected(recorded: RecordedExchange) -> dict[str, Any]:
    if recorded.is_stream:
        reasons: dict[int, str] = {}
        calls: dict[tuple[int, int], dict[str, Any]] = {}
        for chunk in events(recorded):
            for choice in chunk.get("choices") or []:
                index = choice.get("index", 0)
                if choice.get("finish_reason"):
                    reasons[index] = choice["finish_reason"]
                for call in (choice.get("delta") or {}).get("tool_calls") or []:
                    entry = calls.setdefault((index, call.get("index", 0)), {"id": None, "name": None, "arguments": ""})
                    entry["id"] = entry["id"] or call.get("id")
                    function = call.get("function") or {}
                    entry["name"] = entry["name"] or function.get("name")
                    entry["arguments"] += function.get("arguments") or ""
        raw = reasons.get(min(reasons)) if reasons else None
        tool_calls = [(c["id"], c["name"], arguments(c["arguments"])) for _, c in sorted(calls.items())]
        return {"raw": raw, "normalized": CHAT_NORMALIZED.get(raw, "other") if raw else None, "tool_calls": tool_calls,
                "hosted": []}
    body = json.loads(recorded.body_text)
    if "error" in body:
        return {"raw": None, "normalized": "error", "tool_calls": [], "hosted": []}
    choices = body["choices"]
    raw = choices[0]["finish_reason"]
    tool_calls = []
    for choice in choices:
        message = choice["message"]
        for call in message.get("tool_calls") or []:
            if "custom" in call:  # a custom tool's free-form input: kept raw unless it is a JSON object
                text = call["custom"]["input"]
                try:
                    parsed = json.loads(text)
                except ValueError:
                    parsed = None
                tool_calls.append((call["id"], call["custom"]["name"], parsed if isinstance(parsed, dict) else {"_raw": text}))
            else:
                tool_calls.append((call["id"], call["function"]["name"], arguments(call["function"]["arguments"])))
        if not message.get("tool_calls") and message.get("function_call"):  # the legacy field: no call id
            legacy = message["function_call"]
            tool_calls.append((None, legacy["name"], arguments(legacy["arguments"])))
    return {"raw": raw, "normalized": CHAT_NORMALIZED.get(raw, "other") if raw else None, "tool_calls": tool_calls,
            "hosted": []}


def responses_final(recorded: RecordedExchange) -> dict[str, Any]:
    """The provider's final response object: its body, or a stream's terminal envelope (else its
    last envelope with the items it finished)."""
    if not recorded.is_stream:
        return json.loads(recorded.body_text)
    stream = events(recorded)
    terminals = [e["response"] for e in stream if e.get("type") in ("response.completed", "response.incomplete", "response.failed")]
    if terminals:
        return terminals[-1]
    envelopes = [e["response"] for e in stream if isinstance(e.get("response"), dict)]
    done = [e["item"] for e in stream if e.get("type") == "response.output_item.done"]
    return {**(envelopes[-1] if envelopes else {}), "output": done}


def responses_expected(recorded: RecordedExchange) -> dict[str, Any]:
    body = responses_final(recorded)
    if body.get("error") or recorded.status >= 400:
        return {"raw": None, "normalized": "error", "tool_calls": [], "hosted": []}
    status = body.get("status")
    reason = (body.get("incomplete_details") or {}).get("reason")
    items = body.get("output") or []
    tool_calls = [(i.get("call_id"), i.get("name")) for i in items if i.get("type") in RESPONSES_CLIENT_ITEMS]
    hosted = [
        (i["type"], i.get("call_id") or i.get("id"), i.get("status"))
        for i in items
        if i.get("type", "").endswith("_call") and i["type"] not in RESPONSES_CLIENT_ITEMS
    ]
    if status == "failed":
        normalized = "error"
    elif reason == "max_output_tokens":
        normalized = "length"
    elif status == "completed":
        normalized = "tool_calls" if tool_calls else "stop"
    else:
        normalized = "other" if status else None
    return {"raw": reason if status == "incomplete" else None, "normalized": normalized, "tool_calls": tool_calls,
            "hosted": hosted}


def messages_final(recorded: RecordedExchange) -> dict[str, Any]:
    """The message: its body, or rebuilt from a stream's block starts, input deltas and stop reason."""
    if not recorded.is_stream:
        return json.loads(recorded.body_text)
    message: dict[str, Any] = {"content": []}
    blocks: dict[int, dict[str, Any]] = {}
    inputs: dict[int, str] = {}
    for event in events(recorded):
        kind = event.get("type")
        if kind == "message_start":
            message.update(event["message"])
        elif kind == "content_block_start":
            blocks[event["index"]] = dict(event["content_block"])
        elif kind == "content_block_delta" and event["delta"].get("type") == "input_json_delta":
            inputs[event["index"]] = inputs.get(event["index"], "") + event["delta"]["partial_json"]
        elif kind == "message_delta":
            message.update(event.get("delta") or {})
        elif kind == "error":
            message["error"] = event["error"]
    for index, text in inputs.items():
        blocks[index]["input"] = arguments(text)
    message["content"] = [blocks[index] for index in sorted(blocks)]
    return message


def messages_expected(recorded: RecordedExchange) -> dict[str, Any]:
    body = messages_final(recorded)
    if body.get("type") == "error" or body.get("error") or recorded.status >= 400:
        return {"raw": body.get("stop_reason"), "normalized": "error", "tool_calls": [], "hosted": []}
    raw = body.get("stop_reason")
    blocks = body.get("content") or []
    results = {b["tool_use_id"]: b.get("content") for b in blocks
               if b["type"].endswith("_tool_result") and b["type"] != "tool_result"}
    tool_calls = [(b["id"], b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"]
    hosted = [(b["type"], b["id"], b["name"], b["input"], results.get(b["id"])) for b in blocks
              if b["type"] in MESSAGES_HOSTED_BLOCKS]
    return {"raw": raw, "normalized": MESSAGES_NORMALIZED.get(raw, "other") if raw else None, "tool_calls": tool_calls,
            "hosted": hosted}


# --- the record against it -----------------------------------------------------------------------


def actual(recorded: RecordedExchange, record: ModelCallRecord) -> dict[str, Any]:
    if recorded.dialect == "responses":
        tool_calls: list[Any] = [(c["call_id"], c["name"]) for c in record.tool_calls]
        hosted: list[Any] = [(h["type"], h["call_id"], h.get("status")) for h in record.hosted_tool_calls]
    elif recorded.dialect == "messages":
        tool_calls = [(c["call_id"], c["name"], c["arguments"]) for c in record.tool_calls]
        hosted = [(h["type"], h["call_id"], h["name"], h.get("arguments"), h.get("result")) for h in record.hosted_tool_calls]
    else:
        tool_calls = [(c["call_id"], c["name"], c["arguments"]) for c in record.tool_calls]
        hosted = list(record.hosted_tool_calls)
    return {"raw": record.finish_reason, "normalized": record.finish_reason_normalized, "tool_calls": tool_calls,
            "hosted": hosted}


EXPECTED = {"chat": chat_expected, "responses": responses_expected, "messages": messages_expected}


@pytest.mark.parametrize("recorded", FIXTURES, ids=lambda f: f.id)
def test_record_fields_say_what_the_provider_response_says(recorded: RecordedExchange) -> None:
    record = record_of(recorded)
    assert actual(recorded, record) == EXPECTED[recorded.dialect](recorded)


def test_the_recordings_hold_hosted_calls_of_both_dialects_and_completed_responses_with_no_raw_reason() -> None:
    """The pins above cover the cases issue 17 names: they are in the recordings, not assumed."""
    records = {recorded.id: (recorded, record_of(recorded)) for recorded in FIXTURES}
    hosted_types = {h["type"] for _, record in records.values() for h in record.hosted_tool_calls}
    assert {"server_tool_use", "web_search_call", "file_search_call", "code_interpreter_call", "mcp_call"} <= hosted_types
    completed = [r for f, r in records.values() if f.dialect == "responses" and r.response_status == "completed"]
    assert completed and all(r.finish_reason is None and r.finish_reason_normalized in ("stop", "tool_calls") for r in completed)
    assert any(h.get("result") is not None for _, r in records.values() for h in r.hosted_tool_calls)
