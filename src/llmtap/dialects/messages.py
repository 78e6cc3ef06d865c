"""Anthropic Messages (`/v1/messages`): normalization, errors and the dialect.

Streams are rebuilt in `messages_stream`, request and response items read in `messages_items`.

Usage follows OpenTelemetry's `gen_ai.usage.input_tokens`, which counts cached input. Anthropic's
`input_tokens` leaves out cache reads and writes, so this dialect (and only this one) adds them
back; see `_usage`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import orjson

from . import messages_items
from .base import HostedToolCall, Normalized, ToolCall, Usage, as_count, as_str, parse_arguments, token_ids
from .items import HistoryItem
from .messages_stream import MessagesStreamAssembler

__all__ = ["MessagesDialect", "MessagesStreamAssembler"]

# Provider stop reasons mapped onto the normalized finish reasons; any other value is "other"
# (for example `pause_turn`, where a server tool loop paused and the caller should continue).
_FINISH_REASONS: dict[str, str] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}

# Blocks of tool calls Anthropic runs itself (web search, code execution, MCP): hosted, never the
# agent's `tool_calls`; their results come back in a later `*_tool_result` block naming their id.
_HOSTED_CALL_TYPES = frozenset({"server_tool_use", "mcp_tool_use"})
_AGENT_RESULT_TYPE = "tool_result"

# Anthropic's error `type` for each HTTP status llmtap itself answers with.
_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


class MessagesDialect:
    """Anthropic Messages API: `POST /v1/messages`."""

    name: ClassVar[str] = "messages"
    paths: ClassVar[frozenset[str]] = frozenset({"/v1/messages"})
    path_suffixes: ClassVar[tuple[str, ...]] = ("/messages",)
    provider: ClassVar[str] = "anthropic"
    max_tokens_keys: ClassVar[tuple[str, ...]] = ("max_tokens",)

    def stream_assembler(self) -> MessagesStreamAssembler:
        """Return a fresh assembler for one stream."""
        return MessagesStreamAssembler()

    def error_body(self, message: str, code: str, status: int) -> bytes:
        """Return an error body in Anthropic's shape (`{"type": "error", "error": {type, message}}`).

        The Anthropic SDK reads `error.type` and `error.message`; llmtap's own machine-readable
        reason rides along as `error.code`, which the SDK ignores.
        """
        kind = _ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
        return orjson.dumps({"type": "error", "error": {"type": kind, "message": message, "code": code}})

    def request_items(
        self, request: Mapping[str, Any], memo: dict[bytes, list[HistoryItem]] | None = None
    ) -> list[HistoryItem] | None:
        """Return the request's `system` and `messages` as items (see `dialects.history`)."""
        return messages_items.request_items(request, memo)

    def response_outputs(self, response: Mapping[str, Any]) -> list[list[HistoryItem]] | None:
        """Return the message's content blocks as one list of items."""
        return messages_items.response_outputs(response)

    def fingerprint_request_items(self, request: Mapping[str, Any]) -> list[Any] | None:
        """Return the raw `messages` the content fingerprint reads."""
        return messages_items.fingerprint_request_items(request)

    def fingerprint_outputs(self, response: Mapping[str, Any]) -> list[list[Any]] | None:
        """Return the response itself, as the one assistant message served."""
        return messages_items.fingerprint_outputs(response)

    def continued_response_id(self, request: Mapping[str, Any]) -> str | None:
        """Return None: a Messages request always carries its whole conversation."""
        return None

    def normalize(self, response: Mapping[str, Any]) -> Normalized:
        """Read a message (or an error body) into provider-neutral terms; never raises.

        Choices worth knowing:

        - `tool_calls` holds the `tool_use` blocks in order (type "function"): the calls the agent
          must answer. `server_tool_use` and `mcp_tool_use` blocks, which Anthropic already ran,
          are `hosted_tool_calls` instead, each with the content of the `*_tool_result` block
          that answers it when the response carries one. All their ids go in
          `served_item_ids`, after the message id.
        - `reasoning_content` joins the `thinking` texts with a newline. `redacted_thinking`
          blocks, and `thinking` blocks whose text is empty but which carry a signature (thinking
          shown as omitted), count in `reasoning_redacted_blocks`.
        - `refusal` is set only when `stop_reason` is "refusal": the text the model wrote, or
          else the provider's `stop_details.explanation`.
        - `response_status` stays None: the Messages API has no status field (how a stream
          ended is the assembler's `terminal`).
        """
        normalized = Normalized()
        if not isinstance(response, Mapping):
            return normalized
        normalized.error = _error_object(response)
        normalized.response_id = as_str(response.get("id"))
        normalized.model = as_str(response.get("model"))
        stop_reason = as_str(response.get("stop_reason"))
        normalized.finish_reason = stop_reason
        if normalized.error is not None:
            normalized.finish_reason_normalized = "error"
        elif stop_reason is not None:
            normalized.finish_reason_normalized = _FINISH_REASONS.get(stop_reason, "other")
        normalized.usage = _usage(response.get("usage"))
        _read_content(response.get("content"), normalized)
        if stop_reason == "refusal":
            normalized.refusal = as_str(normalized.output_text) or _refusal_explanation(response)
        served = [normalized.response_id] if normalized.response_id else []
        served += _call_ids(response.get("content"))
        normalized.served_item_ids = list(dict.fromkeys(served))
        normalized.prompt_token_ids = token_ids(response.get("prompt_token_ids"))
        normalized.completion_token_ids = token_ids(response.get("token_ids"))
        return normalized


def _read_content(content: Any, normalized: Normalized) -> None:
    """Fill output text, reasoning and tool calls from the content blocks, in order."""
    if not isinstance(content, list):
        return
    texts: list[str] = []
    thoughts: list[str] = []
    results: dict[str | None, Any] = {}
    for block in content:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if isinstance(text, str):
                texts.append(text)
        elif kind == "thinking":
            thinking = as_str(block.get("thinking"))
            if thinking is not None:
                thoughts.append(thinking)
            elif as_str(block.get("signature")) is not None:
                normalized.reasoning_redacted_blocks += 1
        elif kind == "redacted_thinking":
            normalized.reasoning_redacted_blocks += 1
        elif kind == "tool_use":
            normalized.tool_calls.append(
                ToolCall(
                    call_id=as_str(block.get("id")),
                    name=as_str(block.get("name")),
                    arguments=parse_arguments(block.get("input")),
                )
            )
        elif isinstance(kind, str) and kind in _HOSTED_CALL_TYPES:
            normalized.hosted_tool_calls.append(
                HostedToolCall(
                    type=kind,
                    call_id=as_str(block.get("id")),
                    name=as_str(block.get("name")),
                    arguments=parse_arguments(block.get("input")),
                )
            )
        elif isinstance(kind, str) and kind.endswith(_AGENT_RESULT_TYPE) and kind != _AGENT_RESULT_TYPE:
            results[as_str(block.get("tool_use_id"))] = block.get("content")
    for hosted in normalized.hosted_tool_calls:
        hosted.result = results.get(hosted.call_id) if hosted.call_id is not None else None
    normalized.output_text = "".join(texts) if texts else None
    normalized.reasoning_content = "\n".join(thoughts) if thoughts else None


def _call_ids(content: Any) -> list[str]:
    """The ids of the agent's and the hosted tool calls, in the order their blocks came."""
    if not isinstance(content, list):
        return []
    ids = []
    for block in content:
        if isinstance(block, Mapping) and (block.get("type") == "tool_use" or block.get("type") in _HOSTED_CALL_TYPES):
            call_id = as_str(block.get("id"))
            if call_id:
                ids.append(call_id)
    return ids


def _usage(raw: Any) -> Usage:
    """Read Anthropic usage, folding cache reads and writes into `tokens_in`.

    The fold rule: with `input_tokens` known, `tokens_in` = input + cache read + cache creation,
    a cache count the provider left out adding nothing (older models report no cache fields).
    Without `input_tokens`, `tokens_in` is the cache sum only when that sum is positive (a lower
    bound the provider did report), and None otherwise, since zero cache counts say nothing about
    the input. `tokens_reasoning` comes from `output_tokens_details.thinking_tokens` when the
    provider sends it (newer models do) and is None otherwise.
    """
    if not isinstance(raw, Mapping):
        return Usage()
    base = as_count(raw.get("input_tokens"))
    read = as_count(raw.get("cache_read_input_tokens"))
    creation = as_count(raw.get("cache_creation_input_tokens"))
    cache_sum = (read or 0) + (creation or 0)
    if base is not None:
        tokens_in: int | None = base + cache_sum
    else:
        tokens_in = cache_sum if cache_sum > 0 else None
    tokens_out = as_count(raw.get("output_tokens"))
    details = raw.get("output_tokens_details")
    reasoning = as_count(details.get("thinking_tokens")) if isinstance(details, Mapping) else None
    total = as_count(raw.get("total_tokens"))
    if total is None and tokens_in is not None and tokens_out is not None:
        total = tokens_in + tokens_out
    return Usage(
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        tokens_reasoning=reasoning,
        tokens_total=total,
        cached_tokens=read,
        cache_creation_tokens=creation,
    )


def _error_object(response: Mapping[str, Any]) -> dict[str, Any] | None:
    """The provider's error: `{"type": "error", "error": {...}}` bodies and stream errors."""
    error = response.get("error")
    if isinstance(error, Mapping):
        return dict(error)
    if isinstance(error, str) and error:
        return {"message": error}
    if response.get("type") == "error":
        return {key: value for key, value in response.items() if key != "type"}
    return None


def _refusal_explanation(response: Mapping[str, Any]) -> str | None:
    details = response.get("stop_details")
    return as_str(details.get("explanation")) if isinstance(details, Mapping) else None


