"""The OpenAI Responses API (`/v1/responses`): normalization, errors and the dialect.

Streams are rebuilt in `responses_stream`, request and response items read in
`responses_items`. Output items of the types the client runs (`function_call`,
`custom_tool_call`) are its tool calls; built-in tools the provider ran (web search, file
search, code interpreter, MCP, image generation, ...) are hosted tool calls, kept apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from . import responses_items
from .base import HostedToolCall, Normalized, ToolCall, Usage, as_count, as_str, parse_arguments, token_ids
from .chat import openai_error_body
from .items import HistoryItem
from .responses_stream import ResponsesAssembler

__all__ = ["ResponsesAssembler", "ResponsesDialect", "normalize_response"]

# Output item types the agent itself must run; built-in tools (web search, MCP...) run server-side.
_AGENT_TOOL_TYPES = {"function_call": "function", "custom_tool_call": "custom"}

# Output items the client runs itself even though they end in `_call`: never hosted.
_CLIENT_CALL_TYPES = responses_items.CLIENT_CALL_TYPES
# Keys of a hosted call item that hold what the provider returned for it.
_HOSTED_RESULT_KEYS = ("output", "results", "outputs", "result", "error")


def normalize_response(response: Any) -> Normalized:
    """Read a Responses object (or an error body) into provider-neutral terms; never raises."""
    if not isinstance(response, Mapping):
        return Normalized()
    status = as_str(response.get("status"))
    details = response.get("incomplete_details")
    reason = as_str(details.get("reason")) if isinstance(details, Mapping) else None
    items = _mappings(response.get("output"))
    tool_calls = [call for call in map(_tool_call, items) if call is not None]
    hosted = [call for call in map(_hosted_call, items) if call is not None]
    error = _error_object(response.get("error"))
    reasoning, redacted = _reasoning(items)
    prompt_ids, completion_ids = _token_ids(response, items)
    return Normalized(
        response_id=as_str(response.get("id")),
        model=as_str(response.get("model")),
        response_status=status,
        # The provider's own value: only an incomplete response names why it stopped.
        finish_reason=reason if status == "incomplete" else None,
        finish_reason_normalized=_normalized_finish(status, reason, error is not None, bool(tool_calls)),
        usage=_usage(response.get("usage")),
        tool_calls=tool_calls,
        hosted_tool_calls=hosted,
        reasoning_content="\n".join(reasoning) if reasoning else None,
        reasoning_redacted_blocks=redacted,
        refusal=_joined_parts(items, "refusal", "refusal"),
        output_text=_joined_parts(items, "output_text", "text"),
        served_item_ids=_served_item_ids(items),
        prompt_token_ids=prompt_ids,
        completion_token_ids=completion_ids,
        error=error,
    )


def _normalized_finish(status: str | None, reason: str | None, has_error: bool, has_tool_calls: bool) -> str | None:
    if has_error or status == "failed":
        return "error"
    if reason == "max_output_tokens":
        return "length"
    if reason == "content_filter":
        return "content_filter"
    if status == "completed":
        return "tool_calls" if has_tool_calls else "stop"
    if status is None and reason is None:
        return None
    return "other"


def _error_object(value: Any) -> dict[str, Any] | None:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str) and value:
        return {"message": value}
    return None


def _usage(value: Any) -> Usage:
    if not isinstance(value, Mapping):
        return Usage()
    tokens_in = as_count(value.get("input_tokens"))
    tokens_out = as_count(value.get("output_tokens"))
    total = as_count(value.get("total_tokens"))
    if total is None and tokens_in is not None and tokens_out is not None:
        total = tokens_in + tokens_out
    input_details = _mapping(value.get("input_tokens_details"))
    output_details = _mapping(value.get("output_tokens_details"))
    return Usage(
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        tokens_reasoning=as_count(output_details.get("reasoning_tokens")),
        tokens_total=total,
        cached_tokens=as_count(input_details.get("cached_tokens")),
        # Newer models report prompt-cache writes; they are already inside input_tokens.
        cache_creation_tokens=as_count(input_details.get("cache_write_tokens")),
    )


def _tool_call(item: Mapping[str, Any]) -> ToolCall | None:
    """The call an output item asks the client to execute: a function, custom or client-run built-in tool."""
    item_type = item.get("type")
    if isinstance(item_type, str) and item_type in _CLIENT_CALL_TYPES:
        return ToolCall(
            call_id=as_str(item.get("call_id")) or as_str(item.get("id")),
            name=as_str(item.get("name")) or item_type.removesuffix("_call"),
            arguments=_call_arguments(item) or {},
            type=item_type,
            item_id=as_str(item.get("id")),
        )
    kind = _AGENT_TOOL_TYPES.get(item_type) if isinstance(item_type, str) else None
    if kind is None:
        return None
    if kind == "custom":
        raw = item.get("input")
        arguments = {"_raw": raw} if isinstance(raw, str) and not raw.strip() else parse_arguments(raw)
    else:
        arguments = parse_arguments(item.get("arguments"))
    return ToolCall(
        call_id=as_str(item.get("call_id")),
        name=as_str(item.get("name")),
        arguments=arguments,
        type=kind,
        item_id=as_str(item.get("id")),
    )


def _hosted_call(item: Mapping[str, Any]) -> HostedToolCall | None:
    """A built-in tool call the provider ran (`web_search_call`, `mcp_call`, ...), with what it returned."""
    item_type = item.get("type")
    if (
        not isinstance(item_type, str)
        or not item_type.endswith("_call")
        or item_type in _AGENT_TOOL_TYPES
        or item_type in _CLIENT_CALL_TYPES
    ):
        return None
    results = {key: item[key] for key in _HOSTED_RESULT_KEYS if item.get(key) is not None}
    return HostedToolCall(
        type=item_type,
        call_id=as_str(item.get("call_id")) or as_str(item.get("id")),
        name=as_str(item.get("name")) or item_type.removesuffix("_call"),
        arguments=_call_arguments(item),
        result=results or None,
        status=as_str(item.get("status")),
    )


def _call_arguments(item: Mapping[str, Any]) -> dict[str, Any] | None:
    """A built-in call's input: its `arguments`, its `action`, its `code` or its `queries`; None when it has none."""
    if "arguments" in item:
        return parse_arguments(item.get("arguments"))
    action = item.get("action")
    if isinstance(action, Mapping):
        return dict(action)
    if isinstance(item.get("code"), str):
        return {"code": item["code"]}
    if isinstance(item.get("queries"), list):
        return {"queries": list(item["queries"])}
    return None


def _reasoning(items: list[Mapping[str, Any]]) -> tuple[list[str], int]:
    """Readable reasoning texts, and how many reasoning items carried none (encrypted or withheld)."""
    texts: list[str] = []
    redacted = 0
    for item in items:
        if item.get("type") != "reasoning":
            continue
        found = [text for part in _mappings(item.get("summary")) if (text := as_str(part.get("text")))]
        found += [
            text
            for part in _mappings(item.get("content"))
            if part.get("type") == "reasoning_text" and (text := as_str(part.get("text")))
        ]
        if found:
            texts.extend(found)
        else:
            redacted += 1
    return texts, redacted


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _mappings(value: Any) -> list[Mapping[str, Any]]:
    """The objects of a JSON list, skipping anything else; [] when value is not a list."""
    return [entry for entry in value if isinstance(entry, Mapping)] if isinstance(value, list) else []


def _joined_parts(items: list[Mapping[str, Any]], part_type: str, key: str) -> str | None:
    """Concatenate one kind of part across message items; None when there is no such part."""
    found: list[str] = []
    for item in items:
        if item.get("type") != "message":
            continue
        content = item.get("content")
        if part_type == "output_text" and isinstance(content, str):
            found.append(content)
            continue
        for part in _mappings(item.get("content")):
            value = part.get(key)
            if part.get("type") == part_type and isinstance(value, str):
                found.append(value)
    return "".join(found) if found else None


def _served_item_ids(items: list[Mapping[str, Any]]) -> list[str]:
    ids: dict[str, None] = {}
    for item in items:
        for key in ("id", "call_id"):
            value = as_str(item.get(key))
            if value is not None:
                ids.setdefault(value, None)
    return list(ids)


def _token_ids(
    response: Mapping[str, Any], items: list[Mapping[str, Any]]
) -> tuple[list[int] | None, list[int] | None]:
    """Token ids at the top level (vLLM style), else from the one output item carrying them.

    NeMo Gym's training items put `prompt_token_ids`/`generation_token_ids` on the last item of a
    generation; with several carriers the ids cannot be assigned to this call without guessing.
    """
    prompt = token_ids(response.get("prompt_token_ids"))
    completion = token_ids(response.get("token_ids"))
    carriers = [item for item in items if token_ids(item.get("generation_token_ids")) is not None]
    if len(carriers) == 1:
        if prompt is None:
            prompt = token_ids(carriers[0].get("prompt_token_ids"))
        if completion is None:
            completion = token_ids(carriers[0].get("generation_token_ids"))
    return prompt, completion


class ResponsesDialect:
    """The OpenAI Responses API, as served at `/v1/responses`."""

    name: ClassVar[str] = "responses"
    paths: ClassVar[frozenset[str]] = frozenset({"/v1/responses"})
    path_suffixes: ClassVar[tuple[str, ...]] = ("/responses",)
    provider: ClassVar[str] = "openai"
    max_tokens_keys: ClassVar[tuple[str, ...]] = ("max_output_tokens",)

    def stream_assembler(self) -> ResponsesAssembler:
        """Return a fresh assembler for one stream."""
        return ResponsesAssembler()

    def error_body(self, message: str, code: str, status: int) -> bytes:
        """Return an error body in OpenAI's shape, which the Responses API shares."""
        return openai_error_body(message, code, status)

    def request_items(
        self, request: Mapping[str, Any], memo: dict[bytes, list[HistoryItem]] | None = None
    ) -> list[HistoryItem] | None:
        """Return the request's `instructions` and `input` as items (see `dialects.history`)."""
        return responses_items.request_items(request, memo)

    def response_outputs(self, response: Mapping[str, Any]) -> list[list[HistoryItem]] | None:
        """Return the response's `output` as one list of items."""
        return responses_items.response_outputs(response)

    def fingerprint_request_items(self, request: Mapping[str, Any]) -> list[Any] | None:
        """Return the raw `input` items the content fingerprint reads."""
        return responses_items.fingerprint_request_items(request)

    def fingerprint_outputs(self, response: Mapping[str, Any]) -> list[list[Any]] | None:
        """Return the raw `output` list."""
        return responses_items.fingerprint_outputs(response)

    def continued_response_id(self, request: Mapping[str, Any]) -> str | None:
        """Return the `previous_response_id` the request continues server-side, or None."""
        return responses_items.continued_response_id(request)

    def normalize(self, response: Mapping[str, Any]) -> Normalized:
        """Normalize a Responses object or error body; never raises, whatever the JSON."""
        return normalize_response(response)
