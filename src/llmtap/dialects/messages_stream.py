"""Anthropic Messages stream reassembly: the event stream of `/v1/messages` back into the message.

A Messages stream is `message_start` (the message with empty content), then for each content
block a `content_block_start`, its deltas and a `content_block_stop`, all keyed by `index`, then
`message_delta` (stop reason, cumulative usage) and `message_stop`; `ping` may come anywhere and
an `error` event can end the stream early. The assembler rebuilds the message a non-streaming
call returns and keeps everything a replay needs: thinking signatures, redacted thinking, and
block types it does not know, exactly as given.
"""

from __future__ import annotations

from typing import Any, Mapping

import orjson

from .base import NOT_JSON, TerminalKind, parse_event_data
from .sse import SSEEvent
from .token_template import TokenTemplate

__all__ = ["MessagesStreamAssembler"]

# Deltas whose string value (under the same key as the block field) is appended to the block.
_APPENDING_DELTAS: dict[str, str] = {"text_delta": "text", "thinking_delta": "thinking"}
_UNPARSED = object()


class _Block:
    """One content block being streamed: the block as started plus what its deltas added."""

    __slots__ = ("fields", "appended", "citations", "json_parts", "_parsed")

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields
        self.appended: dict[str, list[str]] = {}
        self.citations: list[Any] = []
        # Pieces of `input_json_delta.partial_json`; None until the first one arrives.
        self.json_parts: list[str] | None = None
        self._parsed: tuple[int, Any] | None = None

    def append(self, field: str, text: str) -> None:
        self.appended.setdefault(field, []).append(text)

    def add_json(self, text: str) -> None:
        if self.json_parts is None:
            self.json_parts = []
        self.json_parts.append(text)

    def parsed_input(self) -> Any:
        """The accumulated tool input: a dict when it parses, else its raw text; cached per size."""
        if self.json_parts is None:
            return _UNPARSED
        if self._parsed is None or self._parsed[0] != len(self.json_parts):
            self._parsed = (len(self.json_parts), _parse_input("".join(self.json_parts)))
        return self._parsed[1]

    def snapshot(self) -> dict[str, Any]:
        block = dict(self.fields)
        for field, pieces in self.appended.items():
            prefix = block.get(field)
            block[field] = (prefix if isinstance(prefix, str) else "") + "".join(pieces)
        if self.citations:
            existing = block.get("citations")
            block["citations"] = (list(existing) if isinstance(existing, list) else []) + self.citations
        parsed = self.parsed_input()
        if parsed is not _UNPARSED:
            block["input"] = parsed
        return block


def _parse_input(text: str) -> Any:
    """Parse streamed tool input; keep the text itself when it is empty or not a JSON object.

    A stream cut mid-arguments leaves text that does not parse; keeping it (rather than `{}`)
    lets `normalize` report it as `{"_raw": text}` and lets a reader see how far the call got.
    """
    if not text.strip():
        return {}
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
    return value if isinstance(value, dict) else text


def _merge_usage(current: Any, update: Mapping[str, Any]) -> dict[str, Any]:
    """Merge a later usage object into an earlier one, key by key.

    `message_delta` carries cumulative counts (always `output_tokens`, sometimes input and cache
    counts), so a later value replaces an earlier one; a key the later object leaves out, or
    sends as null, keeps its earlier value instead of being erased.
    """
    merged: dict[str, Any] = dict(current) if isinstance(current, dict) else {}
    for key, value in update.items():
        previous = merged.get(key)
        if value is None and key in merged:
            continue
        if isinstance(value, Mapping) and isinstance(previous, dict):
            merged[key] = _merge_usage(previous, value)
        else:
            merged[key] = value
    return merged


def _index(data: Mapping[str, Any]) -> int | None:
    index = data.get("index")
    if isinstance(index, bool) or not isinstance(index, int):
        return None
    return index


class MessagesStreamAssembler:
    """Rebuilds a Messages event stream into the message a non-streaming call returns.

    Events are dispatched on the `type` inside their data (so `data:`-only streams work) and on
    the `event:` name when the data has none. Malformed events (data that is not JSON, wrong
    types, a delta for a block that never started) are skipped and counted in
    `malformed_events`; well-formed events of a type this module does not know are skipped and
    counted in `unknown_events`, so a newer API never breaks capture.

    Usage::

        assembler = MessagesDialect().stream_assembler()
        for event in decode_sse(body):
            assembler.feed(event)
        message = assembler.result()
    """

    __slots__ = ("terminal", "malformed_events", "unknown_events", "_message", "_blocks", "_error", "_tokens", "_stopped")

    def __init__(self) -> None:
        self.terminal: TerminalKind | None = None
        self.malformed_events = 0
        self.unknown_events = 0
        self._message: dict[str, Any] | None = None
        self._blocks: dict[int, _Block] = {}
        self._error: dict[str, Any] | None = None
        self._tokens: TokenTemplate | None = None  # see `token_template`
        self._stopped = False  # a `message_delta` gave the stop reason: the content is final

    @property
    def answered(self) -> bool:
        """True once a `message_delta` carried the stop reason (only `message_stop` follows), or the stream ended."""
        return self._stopped or self.terminal is not None

    def feed(self, event: SSEEvent) -> None:
        """Apply one event; never raises."""
        tokens = self._tokens
        if tokens is not None and tokens.take(event):
            return
        data = parse_event_data(event)
        if data is NOT_JSON:
            if event.event == "error":
                # A proxy may send a plain-text error; it still ends the stream with an error.
                self._on_error({"message": event.data} if event.data else {})
            elif event.data.strip() != "[DONE]":
                self.malformed_events += 1
            return
        kind = data.get("type") if isinstance(data, dict) else None
        if not isinstance(kind, str):
            kind = event.event
        if kind == "error" or event.event == "error":
            self._on_error(data)
            return
        if not isinstance(data, dict):
            self.malformed_events += 1
            return
        match kind:
            case "message_start":
                self._tokens = None  # a message started again: learn afresh
                self._on_message_start(data)
            case "content_block_start":
                self._tokens = None  # the block may replace the one the template fills
                self._on_block_start(data)
            case "content_block_delta":
                self._on_block_delta(data)
                if tokens is None or not event.data.startswith(tokens.prefix):
                    # A delta the template has just refused (its text unreadable, as a bad escape)
                    # needs no new template.
                    self._tokens = self._token_template(event, data) or tokens
            case "content_block_stop":
                self._on_block_stop(data)
            case "message_delta":
                self._on_message_delta(data)
            case "message_stop":
                if self.terminal is None:
                    self.terminal = "completed"
            case "ping":
                pass
            case None:
                self.malformed_events += 1
            case _:
                self.unknown_events += 1

    def take_raw(self, chunk: bytes) -> bool:
        """Apply a whole chunk of the stream, undecoded, when it is one text or thinking delta that
        fits the learnt template; False to decode it. Call only at an event boundary."""
        tokens = self._tokens
        return tokens is not None and tokens.take_raw(chunk)

    def _token_template(self, event: SSEEvent, data: Mapping[str, Any]) -> TokenTemplate | None:
        """The template of a text or thinking delta just appended, when the delta holds nothing else."""
        delta = data.get("delta")
        if type(delta) is not dict or len(delta) != 2 or type(delta.get("type")) is not str:
            return None
        field = _APPENDING_DELTAS.get(delta["type"])
        index = _index(data)
        block = self._blocks.get(index) if index is not None else None
        if field is None or type(delta.get(field)) is not str or block is None or field not in block.appended:
            return None
        return TokenTemplate.around(event, field, delta[field], block.appended[field])

    def result(self) -> dict[str, Any] | None:
        """Return the message rebuilt so far (with an `error` key after an error), or None."""
        if self._message is None and not self._blocks:
            if self._error is None:
                return None
            return {"type": "error", "error": dict(self._error)}
        message: dict[str, Any] = dict(self._message) if self._message is not None else {}
        message["content"] = [self._blocks[index].snapshot() for index in sorted(self._blocks)]
        usage = message.get("usage")
        if isinstance(usage, dict):
            message["usage"] = dict(usage)
        if self._error is not None:
            message["error"] = dict(self._error)
        return message

    def _on_error(self, data: Any) -> None:
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict):
            self._error = dict(error)
        elif isinstance(error, str) and error:
            self._error = {"message": error}
        elif isinstance(data, dict):
            self._error = {key: value for key, value in data.items() if key != "type"}
        else:
            self._error = {"message": data}
        self.terminal = "error"

    def _on_message_start(self, data: Mapping[str, Any]) -> None:
        message = data.get("message")
        if not isinstance(message, dict):
            self.malformed_events += 1
            return
        self._message = dict(message)
        content = message.get("content")
        if isinstance(content, list):
            # The API sends `content: []` here; a prefilled block would take the first indexes.
            for index, block in enumerate(content):
                if isinstance(block, dict) and index not in self._blocks:
                    self._blocks[index] = _Block(dict(block))

    def _on_block_start(self, data: Mapping[str, Any]) -> None:
        index = _index(data)
        block = data.get("content_block")
        if index is None or not isinstance(block, dict):
            self.malformed_events += 1
            return
        self._blocks[index] = _Block(dict(block))

    def _on_block_delta(self, data: Mapping[str, Any]) -> None:
        index = _index(data)
        delta = data.get("delta")
        block = self._blocks.get(index) if index is not None else None
        if block is None or not isinstance(delta, dict):
            self.malformed_events += 1
            return
        kind = delta.get("type")
        if not isinstance(kind, str):
            self.malformed_events += 1
        elif kind in _APPENDING_DELTAS:
            field = _APPENDING_DELTAS[kind]
            self._append(block, field, delta.get(field))
        elif kind == "input_json_delta":
            partial = delta.get("partial_json")
            if isinstance(partial, str):
                block.add_json(partial)
            else:
                self.malformed_events += 1
        elif kind == "signature_delta":
            # The signature arrives whole and replaces the empty one of the block start; it is
            # what lets a later request replay this thinking block.
            signature = delta.get("signature")
            if isinstance(signature, str):
                block.fields["signature"] = signature
            else:
                self.malformed_events += 1
        elif kind == "citations_delta":
            citation = delta.get("citation")
            if citation is None:
                self.malformed_events += 1
            else:
                block.citations.append(citation)
        else:
            self.unknown_events += 1

    def _append(self, block: _Block, field: str, text: Any) -> None:
        if isinstance(text, str):
            block.append(field, text)
        else:
            self.malformed_events += 1

    def _on_block_stop(self, data: Mapping[str, Any]) -> None:
        index = _index(data)
        block = self._blocks.get(index) if index is not None else None
        if block is None:
            self.malformed_events += 1
            return
        block.parsed_input()

    def _on_message_delta(self, data: Mapping[str, Any]) -> None:
        delta = data.get("delta")
        usage = data.get("usage")
        if not isinstance(delta, dict) and not isinstance(usage, dict):
            self.malformed_events += 1
            return
        if self._message is None:
            self._message = {}
        if isinstance(delta, dict):
            # stop_reason, stop_sequence, and whatever else the API adds (stop_details, container).
            self._message.update(delta)
            if delta.get("stop_reason") is not None:
                self._stopped = True
        if isinstance(usage, dict):
            self._message["usage"] = _merge_usage(self._message.get("usage"), usage)
        for key, value in data.items():
            if key not in ("type", "delta", "usage"):
                self._message[key] = value
