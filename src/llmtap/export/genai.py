"""One OpenTelemetry GenAI record per captured call: the capsule's `model-calls.jsonl`.

Each record is shaped like a client inference span (name `{operation} {model}`, kind CLIENT,
start and end, status) with the GenAI attributes of the semantic conventions pinned in
`SEMCONV_VERSION`: provider and operation, request model and sampling parameters, response id,
model and finish reasons, usage (input tokens include cached ones, output tokens include
reasoning), and the content attributes `gen_ai.system_instructions`, `gen_ai.input.messages`,
`gen_ai.output.messages` and `gen_ai.tool.definitions` as structured values (role plus typed
parts: `text`, `tool_call`, `tool_call_response`, `reasoning`, `uri`, ...).

Usage numbers and finish reasons come from the dialect's normalization (`ModelCallRecord`);
message content is read from the stored request and the reassembled response. Unknown stays
absent: an attribute is never written as 0 or "" to mean "not reported".
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any, Mapping

from ..dialects.base import parse_arguments
from .semconv import SEMCONV_NAME, SEMCONV_VERSION

if TYPE_CHECKING:
    from ..records import ModelCallRecord

__all__ = ["SEMCONV_NAME", "SEMCONV_VERSION", "genai_record"]

RECORD_SCHEMA_VERSION = 1

# Normalized finish reasons (llmtap) -> the output-message finish_reason values of the conventions.
_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_call", "content_filter": "content_filter", "error": "error"}
_DIALECT_PROVIDER = {"chat": "openai", "responses": "openai", "messages": "anthropic"}
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


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(content: str) -> dict[str, Any]:
    return {"type": "text", "content": content}


def genai_record(line: Mapping[str, Any], record: ModelCallRecord, *, rollout_id: str) -> dict[str, Any]:
    """Project one stored call (its raw line and normalized record) onto a GenAI span-like record."""
    request = record.request or {}
    dialect = record.dialect
    operation = line.get("operation") if isinstance(line.get("operation"), str) else "chat"
    provider = record.provider or _DIALECT_PROVIDER.get(dialect or "", "unknown")
    attributes: dict[str, Any] = {"gen_ai.operation.name": operation, "gen_ai.provider.name": provider}
    model = request.get("model") if isinstance(request.get("model"), str) else None
    if model:
        attributes["gen_ai.request.model"] = model
    _sampling(request, attributes)
    _response_attributes(record, attributes)
    _usage(record, attributes)
    _server(line, attributes)
    system, inputs = _input_messages(dialect, request)
    if system:
        attributes["gen_ai.system_instructions"] = system
    if inputs:
        attributes["gen_ai.input.messages"] = inputs
    outputs = _output_messages(dialect, record)
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


def _sampling(request: Mapping[str, Any], attributes: dict[str, Any]) -> None:
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


# --- input messages, per dialect -----------------------------------------------------------------


def _input_messages(dialect: str | None, request: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    if dialect == "responses":
        return _responses_input(request)
    if dialect == "messages":
        return _anthropic_input(request)
    messages = request.get("messages")
    if isinstance(messages, list):
        return [], [_chat_message(message) for message in messages if isinstance(message, Mapping)]
    prompt = request.get("prompt")
    if isinstance(prompt, str):
        return [], [{"role": "user", "parts": [_text(prompt)]}]
    return [], []


def _chat_content_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [_text(content)]
    parts: list[dict[str, Any]] = []
    if isinstance(content, list):
        for part in content:
            if not isinstance(part, Mapping):
                continue
            kind = part.get("type")
            if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
                parts.append(_text(part["text"]))
            elif kind in ("image_url", "input_image"):
                image = part.get("image_url")
                url = image.get("url") if isinstance(image, Mapping) else image
                parts.append({"type": "uri", "modality": "image", "uri": url} if isinstance(url, str) else {"type": str(kind)})
            elif kind == "refusal" and isinstance(part.get("refusal"), str):
                parts.append(_text(part["refusal"]))
            elif isinstance(kind, str):
                parts.append({"type": kind})
    return parts


def _chat_message(message: Mapping[str, Any]) -> dict[str, Any]:
    role = message.get("role") if isinstance(message.get("role"), str) else "user"
    if role == "tool":
        return {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": message.get("tool_call_id"), "response": message.get("content")}],
        }
    parts = _chat_content_parts(message.get("content"))
    for call in _list(message.get("tool_calls")):
        if isinstance(call, Mapping):
            function = _mapping(call.get("function"))
            parts.append(
                {
                    "type": "tool_call",
                    "id": call.get("id"),
                    "name": function.get("name"),
                    "arguments": parse_arguments(function.get("arguments")),
                }
            )
    result: dict[str, Any] = {"role": role, "parts": parts}
    if isinstance(message.get("name"), str):
        result["name"] = message["name"]
    return result


def _responses_input(request: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    system = [_text(request["instructions"])] if isinstance(request.get("instructions"), str) else []
    items = request.get("input")
    if isinstance(items, str):
        return system, [{"role": "user", "parts": [_text(items)]}]
    messages: list[dict[str, Any]] = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role") if isinstance(item.get("role"), str) else "user"
            messages.append({"role": role, "parts": _chat_content_parts(item.get("content"))})
        elif kind == "function_call":
            part = {"type": "tool_call", "id": item.get("call_id"), "name": item.get("name"), "arguments": parse_arguments(item.get("arguments"))}
            messages.append({"role": "assistant", "parts": [part]})
        elif kind == "function_call_output":
            part = {"type": "tool_call_response", "id": item.get("call_id"), "response": item.get("output")}
            messages.append({"role": "tool", "parts": [part]})
        elif kind == "reasoning":
            messages.append({"role": "assistant", "parts": _reasoning_summary_parts(item)})
        elif isinstance(kind, str):
            messages.append({"role": "assistant", "parts": [{"type": kind}]})
    return system, messages


def _reasoning_summary_parts(item: Mapping[str, Any]) -> list[dict[str, Any]]:
    texts = [part.get("text") for part in _list(item.get("summary")) if isinstance(part, Mapping)]
    content = "\n".join(text for text in texts if isinstance(text, str))
    return [{"type": "reasoning", "content": content}]


def _anthropic_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [_text(content)]
    parts: list[dict[str, Any]] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(_text(block["text"]))
        elif kind in ("tool_use", "server_tool_use"):
            arguments = block.get("input") if isinstance(block.get("input"), Mapping) else parse_arguments(block.get("input"))
            parts.append({"type": "tool_call", "id": block.get("id"), "name": block.get("name"), "arguments": arguments})
        elif kind == "tool_result":
            parts.append({"type": "tool_call_response", "id": block.get("tool_use_id"), "response": block.get("content")})
        elif kind == "thinking":
            parts.append({"type": "reasoning", "content": block.get("thinking") or ""})
        elif kind == "image":
            source = _mapping(block.get("source"))
            if source.get("type") == "url":
                parts.append({"type": "uri", "modality": "image", "uri": source.get("url")})
            else:
                parts.append({"type": "blob", "modality": "image", "mime_type": source.get("media_type")})
        elif isinstance(kind, str):
            parts.append({"type": kind})
    return parts


def _anthropic_input(request: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    system = _anthropic_blocks(request.get("system")) if request.get("system") is not None else []
    messages = []
    for message in _list(request.get("messages")):
        if isinstance(message, Mapping):
            role = message.get("role") if isinstance(message.get("role"), str) else "user"
            messages.append({"role": role, "parts": _anthropic_blocks(message.get("content"))})
    return system, messages


# --- output messages -----------------------------------------------------------------------------


def _finish_reason(record: ModelCallRecord) -> str | None:
    normalized = record.finish_reason_normalized
    if normalized in _FINISH:
        return _FINISH[normalized]
    return record.finish_reason


def _output_messages(dialect: str | None, record: ModelCallRecord) -> list[dict[str, Any]]:
    response = record.response
    if not response:
        return []
    if dialect == "chat" and isinstance(response.get("choices"), list):
        return [_chat_choice(choice) for choice in response["choices"] if isinstance(choice, Mapping)]
    if dialect == "responses":
        parts = _responses_output_parts(response.get("output"))
    elif dialect == "messages":
        parts = _anthropic_blocks(response.get("content"))
    elif isinstance(response.get("message"), Mapping):  # Ollama-style {"message": {...}}
        parts = _chat_message(response["message"])["parts"]
    else:
        return []
    message: dict[str, Any] = {"role": "assistant", "parts": parts}
    reason = _finish_reason(record)
    if reason:
        message["finish_reason"] = reason
    return [message]


_CHAT_FINISH = {"tool_calls": "tool_call", "function_call": "tool_call"}


def _chat_choice(choice: Mapping[str, Any]) -> dict[str, Any]:
    message = _mapping(choice.get("message"))
    converted = _chat_message({**message, "role": message.get("role") or "assistant"})
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        converted["parts"].insert(0, {"type": "reasoning", "content": reasoning})
    reason = choice.get("finish_reason")
    if isinstance(reason, str):
        converted["finish_reason"] = _CHAT_FINISH.get(reason, reason)
    return converted


def _responses_output_parts(output: Any) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for item in output if isinstance(output, list) else []:
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type")
        if kind == "message":
            parts.extend(_chat_content_parts(item.get("content")))
        elif kind == "function_call":
            parts.append({"type": "tool_call", "id": item.get("call_id"), "name": item.get("name"), "arguments": parse_arguments(item.get("arguments"))})
        elif kind == "reasoning":
            parts.extend(_reasoning_summary_parts(item))
        elif isinstance(kind, str):
            parts.append({"type": kind, "id": item.get("id")})
    return parts
