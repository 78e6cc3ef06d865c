"""Chat Completions stream reassembly: `chat.completion.chunk` events back into one `chat.completion`.

A stream is a run of `chat.completion.chunk` objects carrying per-choice deltas, an optional
usage-only chunk (`choices: []`) and a closing `data: [DONE]`. `ChatStreamAssembler` folds them
back into the `chat.completion` object a non-streaming call returns, keeping every choice
apart (`n > 1`) and every tool call apart (parallel calls), so nothing collides or merges.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .base import TerminalKind, as_count, as_str, parse_event_data, token_ids
from .sse import SSEEvent
from .token_template import TokenTemplate

__all__ = ["ChatStreamAssembler"]

# Chunk fields copied to the rebuilt completion: non-empty strings only, or a string or null.
_ENVELOPE_TEXT_KEYS = ("id", "model")
_ENVELOPE_NULLABLE_KEYS = ("system_fingerprint", "service_tier")

# Reasoning-detail fields that identify an entry rather than grow with each delta.
_DETAIL_IDENTITY_KEYS = frozenset({"type", "id", "format", "index"})

def _as_index(value: Any) -> int | None:
    """Return value when it is an int (not a bool): a choice or tool index, or a token id."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text_of(value: Any) -> str | None:
    """Return the text of a content value: a string, or the joined text of a list of parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = [part.get("text") for part in value if isinstance(part, dict)]
        strings = [text for text in texts if isinstance(text, str)]
        return "".join(strings) if strings else None
    return None


def _grown(parts: list[str] | None, text: str | None) -> list[str] | None:
    """Append text to parts in place, starting the list on the first text; None stays unsent."""
    if text is None:
        return parts
    if parts is None:
        return [text]
    parts.append(text)
    return parts


def _json_text(value: Any) -> str:
    """Serialize any value for a text field; the standard encoder takes integers of any size."""
    try:
        return json.dumps(value, ensure_ascii=False, skipkeys=True, default=repr)
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def _error_object(value: Any) -> dict[str, Any]:
    """Return a provider error as a dict; a bare string or other value becomes its message."""
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, str):
        return {"message": value}
    return {"message": _json_text(value)}


def _payload_error(payload: Mapping[str, Any]) -> dict[str, Any] | None:
    """Return the error a response or chunk carries, or None.

    OpenAI, llama.cpp and OpenRouter send `{"error": {...}}`; older vLLM sends the error itself
    as the object (`{"object": "error", "message": ...}`); some proxies add `"type": "error"`.
    """
    error = payload.get("error")
    if error is not None:
        return _error_object(error)
    if payload.get("object") == "error" or payload.get("type") == "error":
        return dict(payload)
    return None

@dataclass(slots=True)
class _ToolCallState:
    """One tool call being streamed: set-once identity, concatenated arguments."""

    call_id: str | None = None
    type: str | None = None
    name: str | None = None
    argument_parts: list[str] = field(default_factory=list)
    is_custom: bool = False

    def apply(self, delta: dict[str, Any]) -> None:
        call_id = as_str(delta.get("id"))
        if call_id is not None and self.call_id is None:
            self.call_id = call_id
        kind = as_str(delta.get("type"))
        if kind is not None and self.type is None:
            self.type = kind
        custom, function = delta.get("custom"), delta.get("function")
        if isinstance(custom, dict):
            self.is_custom = True
            self._apply_part(custom, "input")
        elif isinstance(function, dict):
            self._apply_part(function, "arguments")

    def _apply_part(self, part: dict[str, Any], text_key: str) -> None:
        # Servers that repeat the name on every delta must not grow it, so the first one wins.
        name = as_str(part.get("name"))
        if name is not None and self.name is None:
            self.name = name
        text = part.get(text_key)
        if isinstance(text, str):
            self.argument_parts.append(text)
        elif isinstance(text, dict):
            self.argument_parts.append(_json_text(text))

    def to_json(self) -> dict[str, Any]:
        text = "".join(self.argument_parts)
        if self.is_custom or self.type == "custom":
            custom = {"name": self.name, "input": text}
            return {"id": self.call_id, "type": self.type or "custom", "custom": custom}
        function = {"name": self.name, "arguments": text}
        return {"id": self.call_id, "type": self.type or "function", "function": function}


@dataclass(slots=True)
class _ChoiceState:
    """One choice being streamed; `apply` returns False when part of the delta was ill-typed.

    Text fields stay None until the provider sends one, so "never sent" and "empty" differ.
    """

    index: int
    role: str | None = None
    content: list[str] | None = None
    refusal: list[str] | None = None
    reasoning: list[str] | None = None
    tool_calls: list[_ToolCallState] = field(default_factory=list)
    tool_positions: dict[int, int] = field(default_factory=dict)
    function_call: _ToolCallState | None = None
    annotations: list[Any] | None = None
    reasoning_details: list[dict[str, Any]] | None = None
    detail_positions: dict[int, int] = field(default_factory=dict)
    finish_reason: str | None = None
    stop_reason: Any = None
    logprobs: dict[str, list[Any] | None] | None = None
    token_ids: list[int] | None = None

    def apply(self, choice: dict[str, Any]) -> bool:
        well_formed = True
        delta = choice.get("delta")
        if isinstance(delta, dict):
            content = delta.get("content")
            if len(delta) == 1 and type(content) is str:  # a plain token: most of every stream
                self.content = _grown(self.content, content)
            else:
                well_formed = self._apply_delta(delta)
        elif delta is not None:
            well_formed = False
        finish_reason = choice.get("finish_reason")
        if finish_reason is not None and as_str(finish_reason) is not None:
            self.finish_reason = finish_reason
        if choice.get("stop_reason") is not None:
            self.stop_reason = choice["stop_reason"]
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict):
            self._apply_logprobs(logprobs)
        elif logprobs is not None:
            well_formed = False
        sent_ids = choice.get("token_ids")
        if sent_ids is not None:
            received = token_ids(sent_ids)
            if received is None:
                well_formed = False
            elif self.token_ids is not None:
                self.token_ids.extend(received)
            else:
                self.token_ids = received
        return well_formed

    def _apply_delta(self, delta: dict[str, Any]) -> bool:
        well_formed = True
        role = as_str(delta.get("role"))
        if role is not None:
            self.role = role
        self.content = _grown(self.content, _text_of(delta.get("content")))
        refusal = delta.get("refusal")
        self.refusal = _grown(self.refusal, refusal if isinstance(refusal, str) else None)
        # vLLM has sent both names at once with the same text, so one delta adds it once.
        named = (delta.get("reasoning_content"), delta.get("reasoning"))
        if named != (None, None):
            texts = [text for text in named if isinstance(text, str)]
            reasoning = next((text for text in texts if text), texts[0] if texts else None)
            self.reasoning = _grown(self.reasoning, reasoning)
        tool_calls = delta.get("tool_calls")
        if isinstance(tool_calls, list):
            for tool_delta in tool_calls:
                if isinstance(tool_delta, dict):
                    self._tool_call_for(tool_delta).apply(tool_delta)
                else:
                    well_formed = False
        elif tool_calls is not None:
            well_formed = False
        function_call = delta.get("function_call")
        if isinstance(function_call, dict):
            self.function_call = self.function_call or _ToolCallState()
            self.function_call.apply({"function": function_call})
        elif function_call is not None:
            well_formed = False
        annotations = delta.get("annotations")
        if isinstance(annotations, list):
            self.annotations = self.annotations or []
            self.annotations.extend(annotations)
        details = delta.get("reasoning_details")
        if isinstance(details, list):
            for detail in details:
                if isinstance(detail, dict):
                    self._apply_reasoning_detail(detail)
        return well_formed

    def _tool_call_for(self, delta: dict[str, Any]) -> _ToolCallState:
        """Find the call a delta continues, or start one, so parallel calls never collide.

        Keyed by the tool `index`; a delta bringing a different id than the call already at
        that index (servers that reuse index 0) starts a new call. Without an index, a new id
        starts a new call and a delta without id continues the last one.
        """
        call_id = as_str(delta.get("id"))
        index = _as_index(delta.get("index"))
        if index is not None:
            position = self.tool_positions.get(index)
            if position is not None and not self._same_call(self.tool_calls[position], call_id):
                position = None
            if position is None:
                position = self._new_tool_call()
                self.tool_positions[index] = position
            return self.tool_calls[position]
        if self.tool_calls and self._same_call(self.tool_calls[-1], call_id):
            return self.tool_calls[-1]
        return self.tool_calls[self._new_tool_call()]

    @staticmethod
    def _same_call(call: _ToolCallState, call_id: str | None) -> bool:
        return call_id is None or call.call_id is None or call.call_id == call_id

    def _new_tool_call(self) -> int:
        self.tool_calls.append(_ToolCallState())
        return len(self.tool_calls) - 1

    def _apply_reasoning_detail(self, detail: dict[str, Any]) -> None:
        """Merge OpenRouter reasoning details by `index`, growing their text fields."""
        index = _as_index(detail.get("index"))
        position = None if index is None else self.detail_positions.get(index)
        if self.reasoning_details is None:
            self.reasoning_details = []
        if position is None:
            if index is not None:
                self.detail_positions[index] = len(self.reasoning_details)
            self.reasoning_details.append(dict(detail))
            return
        merged = self.reasoning_details[position]
        for key, value in detail.items():
            previous = merged.get(key)
            if key not in _DETAIL_IDENTITY_KEYS and isinstance(previous, str) and isinstance(value, str):
                merged[key] = previous + value
            elif value is not None:
                merged[key] = value

    def _apply_logprobs(self, logprobs: dict[str, Any]) -> None:
        """Merge the `content` and `refusal` token lists; a list never sent stays None."""
        merged = self.logprobs = self.logprobs or {"content": None, "refusal": None}
        for key in ("content", "refusal"):
            tokens = logprobs.get(key)
            kept = merged[key]
            if isinstance(tokens, list) and kept is None:
                merged[key] = list(tokens)
            elif isinstance(tokens, list) and kept is not None:
                kept.extend(tokens)

    def to_json(self) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": self.role or "assistant",
            "content": None if self.content is None else "".join(self.content),
            "refusal": None if self.refusal is None else "".join(self.refusal),
        }
        if self.reasoning is not None:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.tool_calls:
            message["tool_calls"] = [call.to_json() for call in self.tool_calls]
        if self.function_call is not None:
            legacy = self.function_call.to_json()["function"]
            message["function_call"] = {"name": legacy["name"], "arguments": legacy["arguments"]}
        if self.annotations is not None:
            message["annotations"] = list(self.annotations)
        if self.reasoning_details is not None:
            message["reasoning_details"] = [dict(detail) for detail in self.reasoning_details]
        logprobs = None
        if self.logprobs is not None:
            logprobs = {key: None if tokens is None else list(tokens) for key, tokens in self.logprobs.items()}
        choice = {"index": self.index, "message": message, "logprobs": logprobs}
        choice["finish_reason"] = self.finish_reason
        if self.stop_reason is not None:
            choice["stop_reason"] = self.stop_reason
        if self.token_ids is not None:
            choice["token_ids"] = list(self.token_ids)
        return choice


# Chunk and choice keys whose values the general path applies: a token chunk to learn a template
# from has none of them but null, so applying the same chunk again changes nothing but the content.
_TOKEN_CHUNK_NULL_KEYS = ("usage", "prompt_token_ids")
_TOKEN_CHOICE_NULL_KEYS = ("logprobs", "finish_reason", "stop_reason", "token_ids")


def _token_template(event: SSEEvent, chunk: dict[str, Any], choices: dict[int, _ChoiceState]) -> TokenTemplate | None:
    """The template of a chunk just applied, when it is a plain token chunk: one choice whose
    delta is only `content`, and nothing else the general path would apply."""
    listed = chunk.get("choices")
    if type(listed) is not list or len(listed) != 1 or type(listed[0]) is not dict:
        return None
    choice = listed[0]
    delta = choice.get("delta")
    if type(delta) is not dict or len(delta) != 1:
        return None
    token = delta.get("content")
    if type(token) is not str:
        return None
    for holder, keys in ((chunk, _TOKEN_CHUNK_NULL_KEYS), (choice, _TOKEN_CHOICE_NULL_KEYS)):
        for key in keys:
            if holder.get(key) is not None:
                return None
    index = _as_index(choice.get("index", 0))
    state = choices.get(index) if index is not None else None
    if state is None or state.content is None:
        return None
    return TokenTemplate.around(event, "content", token, state.content)


class ChatStreamAssembler:
    """Rebuilds a Chat Completions stream into one `chat.completion` object, event by event.

    `terminal` becomes "completed" on `data: [DONE]` and "error" on `event: error` or a chunk
    carrying an error (which stays on the result as `error`). A last choice with a
    `finish_reason` but no `[DONE]` leaves `terminal` None: OpenAI, vLLM and llama.cpp all send
    `[DONE]`, so its absence means the stream was cut. "incomplete" is never set: chat has no
    such state, and a `length` finish is a completed stream whose finish reason says so.

    Usage::

        assembler = ChatDialect().stream_assembler()
        for event in decode_sse(body):
            assembler.feed(event)
        completion = assembler.result()
    """

    def __init__(self) -> None:
        self.terminal: TerminalKind | None = None
        self.malformed_events = 0
        self._envelope: dict[str, Any] = {}
        self._choices: dict[int, _ChoiceState] = {}
        self._usage: dict[str, Any] | None = None
        self._prompt_token_ids: list[int] | None = None
        self._error: dict[str, Any] | None = None
        self._tokens: TokenTemplate | None = None  # see `token_template`

    def feed(self, event: SSEEvent) -> None:
        """Apply one event; malformed ones are counted and skipped, never raised."""
        tokens = self._tokens
        if tokens is not None and tokens.take(event):
            return
        is_error_event = event.event == "error"
        data = event.data.strip()
        if data == "[DONE]" and not is_error_event:
            if self.terminal is None:
                self.terminal = "completed"
            return
        if not data and not is_error_event:
            return  # a bare `data:` keep-alive
        payload = parse_event_data(event)
        if not isinstance(payload, dict):
            if is_error_event:
                self._fail({"message": event.data})
            else:
                self.malformed_events += 1
            return
        error = _payload_error(payload)
        if error is not None or is_error_event:
            self._fail(error or dict(payload))
        # An error chunk may still carry choices (OpenRouter sends `finish_reason: "error"`).
        if not self._apply_chunk(payload):
            self.malformed_events += 1
        elif error is None and not is_error_event and (tokens is None or not event.data.startswith(tokens.prefix)):
            # A token chunk the template has just refused (its token unreadable, as a bad escape)
            # needs no new template.
            self._tokens = _token_template(event, payload, self._choices) or tokens

    @property
    def answered(self) -> bool:
        """True once every choice seen has its `finish_reason`: usage and `[DONE]` may follow.

        With `n > 1` a choice that has not started yet cannot be told from one that never will;
        an answer judged complete early only holds the rest of the stream until it is durable.
        """
        if self.terminal is not None:
            return True
        if not self._choices:
            return False
        for choice in self._choices.values():  # nearly always one: a plain loop, no generator
            if choice.finish_reason is None:
                return False
        return True

    def take_raw(self, chunk: bytes) -> bool:
        """Apply a whole chunk of the stream, undecoded, when it is one plain token event that
        fits the learnt template; False to decode it. Call only at an event boundary."""
        tokens = self._tokens
        return tokens is not None and tokens.take_raw(chunk)

    def result(self) -> dict[str, Any] | None:
        """Return the `chat.completion` rebuilt so far, or None when nothing was learned."""
        if not (self._envelope or self._choices or self._usage or self._prompt_token_ids or self._error):
            return None
        completion: dict[str, Any] = {
            "id": self._envelope.get("id"),
            "object": "chat.completion",
            "created": self._envelope.get("created"),
            "model": self._envelope.get("model"),
        }
        for key in ("system_fingerprint", "service_tier"):
            if key in self._envelope:
                completion[key] = self._envelope[key]
        completion["choices"] = [self._choices[index].to_json() for index in sorted(self._choices)]
        completion["usage"] = None if self._usage is None else dict(self._usage)
        if self._prompt_token_ids is not None:
            completion["prompt_token_ids"] = list(self._prompt_token_ids)
        if self._error is not None:
            completion["error"] = dict(self._error)
        return completion

    def _fail(self, error: dict[str, Any]) -> None:
        self.terminal = "error"
        self._error = error

    def _apply_chunk(self, chunk: dict[str, Any]) -> bool:
        well_formed = True
        envelope = self._envelope
        for key in _ENVELOPE_TEXT_KEYS:
            value = chunk.get(key)
            if isinstance(value, str) and value:
                envelope[key] = value
        created = as_count(chunk.get("created"))
        if created is not None:
            envelope["created"] = created
        for key in _ENVELOPE_NULLABLE_KEYS:
            if key in chunk:
                value = chunk[key]
                if isinstance(value, str) or key not in envelope:
                    envelope[key] = value if isinstance(value, str) else None
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = dict(usage)
        elif usage is not None:
            well_formed = False
        prompt_token_ids = chunk.get("prompt_token_ids")
        if prompt_token_ids is not None:
            parsed_ids = token_ids(prompt_token_ids)
            if parsed_ids is None:
                well_formed = False
            else:
                self._prompt_token_ids = parsed_ids
        choices = chunk.get("choices")
        if isinstance(choices, list):
            for position, choice in enumerate(choices):
                if not isinstance(choice, dict):
                    well_formed = False
                    continue
                index = _as_index(choice.get("index"))
                if index is None:
                    index = position
                state = self._choices.get(index)
                if state is None:
                    state = self._choices[index] = _ChoiceState(index)
                well_formed = state.apply(choice) and well_formed
        elif choices is not None:
            well_formed = False
        return well_formed
