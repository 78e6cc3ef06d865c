"""One OpenTelemetry GenAI record per captured call: the capsule's `model-calls.jsonl`.

Each record is shaped like a client inference span (name `{operation} {model}`, kind CLIENT,
start and end, status) with the GenAI attributes of the semantic conventions pinned in
`SEMCONV_VERSION`: provider and operation, request model and sampling parameters, response id,
model and finish reasons, usage (input tokens include cached ones, output tokens include
reasoning), and the content attributes `gen_ai.system_instructions`, `gen_ai.input.messages`,
`gen_ai.output.messages` and `gen_ai.tool.definitions` as structured values (role plus typed
parts: `text`, `tool_call`, `tool_call_response`, `reasoning`, `uri`, ...).

Usage numbers and finish reasons come from the dialect's normalization (`ModelCallRecord`);
message content comes from the dialects' provider-neutral items (`dialects.history`), the same
reading the OTLP spans (`export.spans`) use, so no provider JSON is parsed here. Unknown stays
absent: an attribute is never written as 0 or "" to mean "not reported".
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Mapping

from ..dialects import DIALECTS
from ..dialects.history import HistoryItem, is_instructions, request_items, response_outputs
from .semconv import SEMCONV_NAME, SEMCONV_VERSION

if TYPE_CHECKING:
    from ..records import ModelCallRecord

__all__ = ["SEMCONV_NAME", "SEMCONV_VERSION", "finish_reasons", "genai_messages", "genai_record", "sampling_attributes"]

RECORD_SCHEMA_VERSION = 1

# Normalized finish reasons (llmtap) whose name the conventions spell differently.
_ITEM_FINISH = {"tool_calls": "tool_call"}
_SAMPLING = (
    ("temperature", "gen_ai.request.temperature"),
    ("top_p", "gen_ai.request.top_p"),
    ("top_k", "gen_ai.request.top_k"),
    ("frequency_penalty", "gen_ai.request.frequency_penalty"),
    ("presence_penalty", "gen_ai.request.presence_penalty"),
    ("seed", "gen_ai.request.seed"),
)
_MAX_TOKENS_KEYS = ("max_completion_tokens", "max_output_tokens", "max_tokens")


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return dt.datetime.fromtimestamp(seconds, tz=dt.timezone.utc).isoformat().replace("+00:00", "Z")


def _number(value: Any) -> int | float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def genai_record(line: Mapping[str, Any], record: ModelCallRecord, *, rollout_id: str) -> dict[str, Any]:
    """Project one stored call (its raw line and normalized record) onto a GenAI span-like record."""
    request = record.request or {}
    dialect = record.dialect
    operation = line.get("operation") if isinstance(line.get("operation"), str) else "chat"
    known = DIALECTS.get(dialect) if dialect else None
    provider = record.provider or (known.provider if known is not None else "unknown")
    attributes: dict[str, Any] = {"gen_ai.operation.name": operation, "gen_ai.provider.name": provider}
    model = request.get("model") if isinstance(request.get("model"), str) else None
    if model:
        attributes["gen_ai.request.model"] = model
    attributes.update(sampling_attributes(request))
    _response_attributes(record, attributes)
    _usage(record, attributes)
    _server(line, attributes)
    items = request_items(dialect, request) or []
    system = [_part(item) for item in items if is_instructions(item)]
    if system:
        attributes["gen_ai.system_instructions"] = system
    inputs = _messages(item for item in items if not is_instructions(item))
    if inputs:
        attributes["gen_ai.input.messages"] = inputs
    outputs = _output_messages(record)
    if outputs:
        attributes["gen_ai.output.messages"] = outputs
        reasons = [message["finish_reason"] for message in outputs if message.get("finish_reason")]
        if reasons:
            attributes["gen_ai.response.finish_reasons"] = reasons
    tools = request.get("tools")
    if isinstance(tools, list) and tools:
        attributes["gen_ai.tool.definitions"] = tools
    if record.error_category is not None:
        attributes["error.type"] = _error_type(line, record)
    return {
        "schema_version": RECORD_SCHEMA_VERSION,
        "semconv_version": SEMCONV_VERSION,
        "name": f"{operation} {model}" if model else operation,
        "kind": "CLIENT",
        "model_call_id": record.model_call_id,
        "rollout_id": rollout_id,
        "call_index": record.call_index,
        "start_time": _iso(record.started_at),
        "end_time": _iso(record.completed_at),
        "duration_ms": record.latency_total_ms,
        "status": "error" if record.error_category is not None else "ok",
        "error_category": record.error_category,
        "attributes": attributes,
    }


def sampling_attributes(request: Mapping[str, Any]) -> dict[str, Any]:
    """Return a request's sampling parameters as GenAI `gen_ai.request.*` attributes (the one reader of them)."""
    attributes: dict[str, Any] = {}
    for key, name in _SAMPLING:
        value = _number(request.get(key))
        if value is not None:
            attributes[name] = value
    options = request.get("options")  # Ollama keeps sampling under "options"
    if isinstance(options, Mapping):
        for key, name in _SAMPLING:
            value = _number(options.get(key))
            if value is not None and name not in attributes:
                attributes[name] = value
    for key in _MAX_TOKENS_KEYS:
        value = _number(request.get(key))
        if isinstance(value, int):
            attributes["gen_ai.request.max_tokens"] = value
            break
    stop = request.get("stop_sequences", request.get("stop"))
    if isinstance(stop, str):
        attributes["gen_ai.request.stop_sequences"] = [stop]
    elif isinstance(stop, list) and all(isinstance(item, str) for item in stop) and stop:
        attributes["gen_ai.request.stop_sequences"] = stop
    count = request.get("n")
    if isinstance(count, int) and not isinstance(count, bool) and count != 1:
        attributes["gen_ai.request.choice.count"] = count
    if isinstance(request.get("stream"), bool):
        attributes["gen_ai.request.stream"] = request["stream"]
    return attributes


def _response_attributes(record: ModelCallRecord, attributes: dict[str, Any]) -> None:
    if record.response_id:
        attributes["gen_ai.response.id"] = record.response_id
    response_model = (record.response or {}).get("model")
    if isinstance(response_model, str) and response_model:
        attributes["gen_ai.response.model"] = response_model
    if record.stream and record.latency_ttft_ms is not None:
        attributes["gen_ai.response.time_to_first_chunk"] = round(record.latency_ttft_ms / 1000.0, 6)


def _usage(record: ModelCallRecord, attributes: dict[str, Any]) -> None:
    for value, name in (
        (record.tokens_in, "gen_ai.usage.input_tokens"),
        (record.tokens_out, "gen_ai.usage.output_tokens"),
        (record.cached_tokens, "gen_ai.usage.cache_read.input_tokens"),
        (record.cache_creation_tokens, "gen_ai.usage.cache_creation.input_tokens"),
        (record.tokens_reasoning, "gen_ai.usage.reasoning.output_tokens"),
    ):
        if value is not None:
            attributes[name] = value


def _server(line: Mapping[str, Any], attributes: dict[str, Any]) -> None:
    server = line.get("server")
    if isinstance(server, Mapping):
        if isinstance(server.get("address"), str):
            attributes["server.address"] = server["address"]
        if isinstance(server.get("port"), int):
            attributes["server.port"] = server["port"]


def _error_type(line: Mapping[str, Any], record: ModelCallRecord) -> str:
    exception_type = line.get("exception_type")
    if isinstance(exception_type, str):
        return exception_type
    if record.status_code is not None and record.status_code >= 400:
        return str(record.status_code)
    return record.error_category or "_OTHER"


def genai_messages(record: ModelCallRecord) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Return (input messages, output messages) in the conventions' role-plus-parts shape.

    Read from the dialects' items: consecutive items of one role form one message; each chat
    choice is its own output message. Empty lists when the payloads are unknown.
    """
    inputs = _messages(request_items(record.dialect, record.request) or [])
    return inputs, _output_messages(record)


def finish_reasons(record: ModelCallRecord) -> list[str] | None:
    """`gen_ai.response.finish_reasons` for a span: the provider's own reason, else llmtap's normalized one.

    Responses carries a raw reason only for an incomplete response; a completed one still stopped
    for a reason (`stop`, `tool_call`), which the normalized finish reason names. None when unknown.
    """
    if record.finish_reason is not None:
        return [record.finish_reason]
    normalized = record.finish_reason_normalized
    return None if normalized is None else [_ITEM_FINISH.get(normalized, normalized)]


def _output_messages(record: ModelCallRecord) -> list[dict[str, Any]]:
    outputs: list[dict[str, Any]] = []
    finish = _ITEM_FINISH.get(record.finish_reason_normalized or "", record.finish_reason_normalized)
    for served in response_outputs(record.dialect, record.response) or []:
        # An alternative served with no content (a refusal before any text) is still an answer.
        for message in _messages(served, default_role="assistant") or [{"role": "assistant", "parts": []}]:
            if finish is not None:
                message["finish_reason"] = finish
            outputs.append(message)
    return outputs


def _messages(items: Iterable[HistoryItem], *, default_role: str = "user") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for item in items:
        role = item.get("role") or default_role
        part = _part(item)
        if messages and messages[-1]["role"] == role and item.get("type") != "tool_result":
            messages[-1]["parts"].append(part)
        else:
            messages.append({"role": role, "parts": [part]})
    return messages


def _part(item: HistoryItem) -> dict[str, Any]:
    kind = item.get("type")
    if kind == "tool_call":
        arguments = item.get("arguments")
        return {"type": "tool_call", "id": item.get("call_id"), "name": item.get("name"), "arguments": arguments}
    if kind == "tool_result":
        return {"type": "tool_call_response", "id": item.get("call_id"), "response": item.get("text")}
    if kind == "reasoning":
        return {"type": "reasoning", "content": item.get("text") or ""}
    part: dict[str, Any] = {"type": "text", "content": item.get("text") or ""}
    return part
