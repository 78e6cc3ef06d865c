"""The one protocol every API dialect implements, the shapes it returns, and the registry.

A dialect knows one provider API's JSON: which paths it owns, how to reassemble its event stream
into the object the non-streaming API would have returned (incrementally, and from a partial
stream), and how to normalize a response into `Normalized`. Nothing outside `dialects/` reads a
provider's JSON shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Mapping, Protocol

import orjson

from .sse import SSEEvent

__all__ = [
    "FINISH_REASONS",
    "WRITE_HEADROOM",
    "Dialect",
    "HostedToolCall",
    "Normalized",
    "StreamAssembler",
    "TerminalKind",
    "ToolCall",
    "Usage",
    "as_count",
    "as_str",
    "parse_arguments",
    "parse_event_data",
    "token_ids",
    "writable",
    "writable_json",
]

# The normalized finish reasons every dialect maps its provider value onto.
FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter", "error", "other")

# How a stream ended: a clean end, an end the provider itself calls incomplete, or an error.
TerminalKind = Literal["completed", "incomplete", "error"]


@dataclass(slots=True)
class Usage:
    """Token counts; None means the provider did not report it, never zero.

    `tokens_in` includes cached input tokens (read and written), as OpenTelemetry's
    `gen_ai.usage.input_tokens` defines; `tokens_out` includes reasoning tokens.
    """

    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_reasoning: int | None = None
    tokens_total: int | None = None
    cached_tokens: int | None = None
    cache_creation_tokens: int | None = None


@dataclass(slots=True)
class ToolCall:
    """One tool call the model asked for.

    `arguments` is always a dict: parsed JSON, or `{"_raw": text}` when the text is not a JSON
    object (a custom tool's free-form input, or a stream cut mid-arguments). `choice_index` keeps
    chat choices apart when `n > 1`.
    """

    call_id: str | None
    name: str | None
    arguments: dict[str, Any]
    type: str = "function"
    choice_index: int | None = None
    item_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """Return the JSON shape stored on records."""
        result: dict[str, Any] = {"call_id": self.call_id, "name": self.name, "arguments": self.arguments}
        if self.type != "function":
            result["type"] = self.type
        if self.choice_index is not None:
            result["choice_index"] = self.choice_index
        if self.item_id is not None:
            result["item_id"] = self.item_id
        return result


@dataclass(slots=True)
class HostedToolCall:
    """One tool call the provider ran itself (a web search, code execution, an MCP call).

    Never in `Normalized.tool_calls`, which holds only what the client must execute. `type` is
    the provider's own block or item type (`server_tool_use`, `web_search_call`, ...); `result`
    is what the provider returned for it when the response carries that, else None (unknown).
    """

    type: str
    call_id: str | None
    name: str | None
    arguments: dict[str, Any] | None = None
    result: Any = None
    status: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """Return the JSON shape stored on records; unknown fields are left out."""
        result: dict[str, Any] = {"type": self.type, "call_id": self.call_id, "name": self.name}
        if self.arguments is not None:
            result["arguments"] = self.arguments
        if self.status is not None:
            result["status"] = self.status
        if self.result is not None:
            result["result"] = self.result
        return result


@dataclass(slots=True)
class Normalized:
    """What a dialect reads out of one response object, in provider-neutral terms."""

    response_id: str | None = None
    model: str | None = None
    response_status: str | None = None
    finish_reason: str | None = None
    finish_reason_normalized: str | None = None
    usage: Usage = field(default_factory=Usage)
    # Calls the client must execute; `hosted_tool_calls` holds those the provider ran itself.
    tool_calls: list[ToolCall] = field(default_factory=list)
    hosted_tool_calls: list[HostedToolCall] = field(default_factory=list)
    reasoning_content: str | None = None
    reasoning_redacted_blocks: int = 0
    refusal: str | None = None
    output_text: str | None = None
    # Ids the provider gave to what it served (message and item ids, tool call ids): terminal
    # attribution matches a rollout's final answer against them.
    served_item_ids: list[str] = field(default_factory=list)
    # Per-choice detail for chat `n > 1`: finish reasons in choice order.
    choice_finish_reasons: list[str | None] = field(default_factory=list)
    # Token ids when the upstream returned them (for example vLLM's `return_token_ids`).
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    # The provider's error object, for error bodies and failed streams.
    error: dict[str, Any] | None = None


class StreamAssembler(Protocol):
    """Rebuilds one dialect's stream into the response the non-streaming API would return.

    Fed events one at a time as they arrive; `result()` may be called at any moment, including
    after a stream that was cut short, and returns the best reconstruction so far (or None when
    nothing was learned). Never raises on malformed events: it skips them and counts them.
    """

    terminal: TerminalKind | None
    malformed_events: int

    @property
    def answered(self) -> bool:
        """True once the events so far hold the complete answer, whatever usage or end marker
        may still follow (a capture point holds what comes from then on until it is durable)."""
        ...

    def feed(self, event: SSEEvent) -> None: ...

    def result(self) -> dict[str, Any] | None: ...


class Dialect(Protocol):
    """One provider API: its paths, stream assembler, normalizer, error shape and items.

    `request_items` and `response_outputs` read the model-visible content into the
    provider-neutral items `dialects.history` documents; `fingerprint_request_items` and
    `fingerprint_outputs` select the raw objects the content fingerprint hashes. All of them
    return None for a shape they cannot read and never raise.
    """

    name: ClassVar[str]
    # The provider the API belongs to, as OpenTelemetry's `gen_ai.provider.name` spells it.
    provider: ClassVar[str]
    paths: ClassVar[frozenset[str]]
    path_suffixes: ClassVar[tuple[str, ...]]
    # Request keys that limit output length, in the order sampling should set them.
    max_tokens_keys: ClassVar[tuple[str, ...]]

    def stream_assembler(self) -> StreamAssembler: ...

    def normalize(self, response: Mapping[str, Any]) -> Normalized: ...

    def error_body(self, message: str, code: str, status: int) -> bytes:
        """Return an error body in the provider's own shape, so the client's SDK reads it as one."""
        ...

    def request_items(
        self, request: Mapping[str, Any], memo: dict[bytes, list[dict[str, Any]]] | None = None
    ) -> list[dict[str, Any]] | None: ...

    def response_outputs(self, response: Mapping[str, Any]) -> list[list[dict[str, Any]]] | None: ...

    def fingerprint_request_items(self, request: Mapping[str, Any]) -> list[Any] | None: ...

    def fingerprint_outputs(self, response: Mapping[str, Any]) -> list[list[Any]] | None: ...

    def continued_response_id(self, request: Mapping[str, Any]) -> str | None: ...


def as_count(value: Any) -> int | None:
    """Return value when it is a real token count (a non-negative int, not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def token_ids(value: Any) -> list[int] | None:
    """Return value as token ids when it is a list of non-negative ints (no bools), else None.

    The one rule every dialect and reader applies: a token id indexes a vocabulary, so a
    negative one (a padding or "no token" marker some servers use) is not a token, and a list
    holding one is unknown as a whole rather than kept with a value no tokenizer decodes.
    """
    if not isinstance(value, list):
        return None
    for item in value:
        if type(item) is not int or item < 0:
            return None
    return list(value)


def as_str(value: Any) -> str | None:
    """Return value when it is a non-empty string, else None."""
    return value if isinstance(value, str) and value else None


# orjson reads JSON nested up to 1,024 levels but writes at most 254, so a value parsed from a
# hostile body may never be written back. Source text with fewer brackets than this cannot nest
# that deep; the levels a record and the rows holding it add are kept free by `WRITE_HEADROOM`.
_SURELY_WRITABLE_BRACKETS = 200
WRITE_HEADROOM = 32


def writable_json(value: Any, source: bytes | str) -> bool:
    """True when `value`, parsed from `source`, can be written as JSON again, with room to spare for
    the levels a record and the rows holding it add around it. Costs two counts of `source`, and a
    trial write only when `source` holds many brackets."""
    if isinstance(source, bytes):
        brackets = source.count(b"[") + source.count(b"{")
    else:
        brackets = source.count("[") + source.count("{")
    return brackets < _SURELY_WRITABLE_BRACKETS or writable(value)


def writable(value: Any) -> bool:
    """True when `value` can be written as JSON with `WRITE_HEADROOM` levels to spare: one trial
    write, cheaper than `writable_json`'s counts when the source is much larger than the value
    (a reassembled stream against its event stream)."""
    wrapped = value
    for _ in range(WRITE_HEADROOM):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
    except orjson.JSONEncodeError:
        return False
    return True


def parse_arguments(value: Any) -> dict[str, Any]:
    """Turn tool-call arguments into a dict: a dict as is, a JSON object string parsed, else `_raw`
    (also for arguments nested too deep to be written out again)."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            parsed = orjson.loads(value)
        except orjson.JSONDecodeError:
            return {"_raw": value}
        return parsed if isinstance(parsed, dict) and writable_json(parsed, value) else {"_raw": value}
    if value is None:
        return {}
    return {"_raw": value}


_NOT_JSON = object()


def parse_event_data(event: SSEEvent) -> Any:
    """Parse an event's data as JSON, returning the module constant `NOT_JSON` when it is not."""
    try:
        return orjson.loads(event.data)
    except orjson.JSONDecodeError:
        return _NOT_JSON


NOT_JSON = _NOT_JSON
