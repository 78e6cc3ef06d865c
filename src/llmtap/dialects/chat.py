"""OpenAI Chat Completions (`/v1/chat/completions`), also spoken by llama.cpp, vLLM, LiteLLM, OpenRouter.

Streams are rebuilt in `chat_stream`, request and response items read in `chat_items`; this
module normalizes a completion and answers errors in OpenAI's shape.

Choices about what `normalize` reports for `n > 1`: `finish_reason`, `output_text`, `refusal`,
`reasoning_content` and `completion_token_ids` describe choice 0, the same choice the provider's
top-level view (and most SDKs) treat as the answer; tool calls and `served_item_ids` come from
every choice (tool calls carry `choice_index`), and `choice_finish_reasons` lists every choice.
The other choices' text stays whole in the stored response.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import orjson

from . import chat_items
from .base import Normalized, ToolCall, Usage, as_count, as_str, parse_arguments, token_ids
from .chat_stream import ChatStreamAssembler, _as_index, _payload_error, _text_of
from .items import HistoryItem

__all__ = ["ChatDialect", "ChatStreamAssembler", "openai_error_body"]

# Provider finish reasons with a normalized meaning; any other non-null value becomes "other".
# "error" is OpenRouter's value for a generation that failed mid-stream.
_FINISH_REASONS: dict[str, str] = {
    **{reason: reason for reason in ("stop", "length", "tool_calls", "content_filter", "error")},
    "function_call": "tool_calls",
}

# OpenRouter's reasoning detail type for reasoning the provider served only encrypted.
_ENCRYPTED_REASONING = "reasoning.encrypted"


def openai_error_body(message: str, code: str, status: int) -> bytes:
    """Return an error body in OpenAI's shape, which both OpenAI dialects (and their SDKs) read."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return orjson.dumps({"error": {"message": message, "type": kind, "code": code}})


def _usage_of(value: Any) -> Usage:
    """Read Chat Completions usage; `prompt_tokens` already includes cached tokens, so no fold.

    Cached count: OpenAI's `prompt_tokens_details.cached_tokens`, else DeepSeek's
    `prompt_cache_hit_tokens`, else an Anthropic-style `cache_read_input_tokens` some proxies
    add; none of them is ever added to `tokens_in` (that would count them twice).
    """
    if not isinstance(value, dict):
        return Usage()
    prompt_details = value.get("prompt_tokens_details")
    prompt_details = prompt_details if isinstance(prompt_details, dict) else {}
    completion_details = value.get("completion_tokens_details")
    completion_details = completion_details if isinstance(completion_details, dict) else {}
    tokens_in = as_count(value.get("prompt_tokens"))
    tokens_out = as_count(value.get("completion_tokens"))
    tokens_total = as_count(value.get("total_tokens"))
    if tokens_total is None and tokens_in is not None and tokens_out is not None:
        tokens_total = tokens_in + tokens_out
    return Usage(
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        tokens_reasoning=as_count(completion_details.get("reasoning_tokens")),
        tokens_total=tokens_total,
        cached_tokens=_first_count(
            prompt_details.get("cached_tokens"),
            value.get("prompt_cache_hit_tokens"),
            value.get("cache_read_input_tokens"),
        ),
        cache_creation_tokens=_first_count(
            prompt_details.get("cache_write_tokens"), value.get("cache_creation_input_tokens")
        ),
    )


def _first_count(*values: Any) -> int | None:
    return next((count for count in map(as_count, values) if count is not None), None)


def _tool_calls_of(message: dict[str, Any], choice_index: int) -> list[ToolCall]:
    """Every tool call of one message: its `tool_calls` entries, or else a legacy `function_call`."""
    found: list[ToolCall] = []
    tool_calls = message.get("tool_calls")
    for call in tool_calls if isinstance(tool_calls, list) else []:
        if not isinstance(call, dict):
            continue
        custom = call.get("custom")
        if isinstance(custom, dict):
            kind = as_str(call.get("type")) or "custom"
            name, arguments = as_str(custom.get("name")), parse_arguments(custom.get("input"))
        else:
            function = call.get("function")
            function = function if isinstance(function, dict) else {}
            kind = as_str(call.get("type")) or "function"
            name, arguments = as_str(function.get("name")), parse_arguments(function.get("arguments"))
        found.append(ToolCall(as_str(call.get("id")), name, arguments, type=kind, choice_index=choice_index))
    function_call = message.get("function_call")
    # Some servers (llama.cpp) mirror the first tool call into the legacy field too: it is the
    # same call, not another one. OpenAI sends one field or the other, never both.
    if isinstance(function_call, dict) and not found:
        name = as_str(function_call.get("name"))
        arguments = parse_arguments(function_call.get("arguments"))
        found.append(ToolCall(None, name, arguments, choice_index=choice_index))
    return found


def _normalized_finish(finish_reason: str | None, error: dict[str, Any] | None) -> str | None:
    """An error wins over any finish reason sent before it, as in the other dialects."""
    if error is not None:
        return "error"
    return None if finish_reason is None else _FINISH_REASONS.get(finish_reason, "other")


def _encrypted_reasoning_count(message: dict[str, Any]) -> int:
    details = message.get("reasoning_details")
    if not isinstance(details, list):
        return 0
    return sum(1 for detail in details if isinstance(detail, dict) and detail.get("type") == _ENCRYPTED_REASONING)


class ChatDialect:
    """OpenAI Chat Completions: `/v1/chat/completions`, streamed or not, and its error bodies."""

    name: ClassVar[str] = "chat"
    paths: ClassVar[frozenset[str]] = frozenset({"/v1/chat/completions"})
    path_suffixes: ClassVar[tuple[str, ...]] = ("/chat/completions",)
    provider: ClassVar[str] = "openai"
    max_tokens_keys: ClassVar[tuple[str, ...]] = ("max_tokens", "max_completion_tokens")

    def stream_assembler(self) -> ChatStreamAssembler:
        """Return a fresh assembler for one stream."""
        return ChatStreamAssembler()

    def error_body(self, message: str, code: str, status: int) -> bytes:
        """Return an error body in OpenAI's shape."""
        return openai_error_body(message, code, status)

    def request_items(
        self, request: Mapping[str, Any], memo: dict[bytes, list[HistoryItem]] | None = None
    ) -> list[HistoryItem] | None:
        """Return the request's `messages` as items (see `dialects.history`)."""
        return chat_items.request_items(request, memo)

    def response_outputs(self, response: Mapping[str, Any]) -> list[list[HistoryItem]] | None:
        """Return each choice's message as items, in index order."""
        return chat_items.response_outputs(response)

    def fingerprint_request_items(self, request: Mapping[str, Any]) -> list[Any] | None:
        """Return the raw `messages` the content fingerprint reads."""
        return chat_items.fingerprint_request_items(request)

    def fingerprint_outputs(self, response: Mapping[str, Any]) -> list[list[Any]] | None:
        """Return each choice's raw `message`, in index order."""
        return chat_items.fingerprint_outputs(response)

    def continued_response_id(self, request: Mapping[str, Any]) -> str | None:
        """Return None: a chat request always carries its whole conversation."""
        return None

    def normalize(self, response: Mapping[str, Any]) -> Normalized:
        """Read ids, usage, finish reasons, tool calls, text and errors; never raises on any JSON value."""
        normalized = Normalized()
        if not isinstance(response, Mapping):
            return normalized
        normalized.response_id = as_str(response.get("id"))
        normalized.model = as_str(response.get("model"))
        normalized.error = _payload_error(response)
        normalized.usage = _usage_of(response.get("usage"))
        normalized.prompt_token_ids = token_ids(response.get("prompt_token_ids"))
        raw_choices = response.get("choices")
        choices = [c for c in raw_choices if isinstance(c, dict)] if isinstance(raw_choices, list) else []
        normalized.choice_finish_reasons = [as_str(choice.get("finish_reason")) for choice in choices]
        for position, choice in enumerate(choices):
            index = _as_index(choice.get("index"))
            message = choice.get("message")
            if isinstance(message, dict):
                normalized.tool_calls.extend(_tool_calls_of(message, position if index is None else index))
        call_ids = [call.call_id for call in normalized.tool_calls if call.call_id is not None]
        normalized.served_item_ids = list(dict.fromkeys(call_ids))
        if choices:
            first = choices[0]
            normalized.finish_reason = normalized.choice_finish_reasons[0]
            normalized.completion_token_ids = token_ids(first.get("token_ids"))
            message = first.get("message")
            if isinstance(message, dict):
                normalized.output_text = as_str(_text_of(message.get("content")))
                normalized.refusal = as_str(message.get("refusal"))
                normalized.reasoning_content = as_str(message.get("reasoning_content")) or as_str(
                    message.get("reasoning")
                )
                normalized.reasoning_redacted_blocks = _encrypted_reasoning_count(message)
        normalized.finish_reason_normalized = _normalized_finish(normalized.finish_reason, normalized.error)
        return normalized
