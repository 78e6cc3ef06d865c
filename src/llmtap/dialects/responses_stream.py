"""Responses stream reassembly: the event stream of `/v1/responses` back into the response object.

A Responses stream announces the response (`response.created`, `response.in_progress`), streams
output items with the deltas of their parts, and ends with an envelope event
(`response.completed`, `response.incomplete`, `response.failed`) or an `error` event. The terminal
envelope is the provider's own final object, so it wins. Without one (a stream cut short) the
response is rebuilt from the last envelope seen plus the items and deltas received so far, so
partial text and partial tool arguments are never lost.
"""

from __future__ import annotations

from typing import Any

from .base import NOT_JSON, TerminalKind, as_count, parse_event_data
from .sse import SSEEvent
from .token_template import TokenTemplate

__all__ = ["ResponsesAssembler"]

_TERMINALS: dict[str, TerminalKind] = {
    "response.completed": "completed",
    "response.incomplete": "incomplete",
    "response.failed": "error",
    "error": "error",
}

# Streamed text, by event prefix (`<prefix>.delta` appends, `<prefix>.done` gives the whole value
# under the same key): where the text lives (`content` or `summary` parts, or None for a field of
# the item itself), its key, and the item and part types to assume when the stream never
# announced them.
_STREAMED_TEXT: dict[str, tuple[str | None, str, str, str | None]] = {
    "response.output_text": ("content", "text", "message", "output_text"),
    "response.refusal": ("content", "refusal", "message", "refusal"),
    "response.reasoning_text": ("content", "text", "reasoning", "reasoning_text"),
    "response.reasoning_summary_text": ("summary", "text", "reasoning", "summary_text"),
    "response.function_call_arguments": (None, "arguments", "function_call", None),
    "response.custom_tool_call_input": (None, "input", "custom_tool_call", None),
    "response.mcp_call_arguments": (None, "arguments", "mcp_call", None),
    "response.code_interpreter_call_code": (None, "code", "code_interpreter_call", None),
}

# Part events: which list of the item they fill, and the item type to assume.
_PART_EVENTS: dict[str, tuple[str, str]] = {
    "response.content_part.added": ("content", "message"),
    "response.content_part.done": ("content", "message"),
    "response.reasoning_summary_part.added": ("summary", "reasoning"),
    "response.reasoning_summary_part.done": ("summary", "reasoning"),
}

_INDEX_KEYS = {"content": "content_index", "summary": "summary_index"}

# Values of a text delta that change with every event and that rebuilding ignores: a template of
# the delta event lets them vary (see `token_template`).
_VARYING_KEYS = ("sequence_number", "obfuscation")

# Built-in tool items announce progress as `response.<item type>.<status>`; the status is the item's.
_PROGRESS_ITEM_TYPES = frozenset(
    {"web_search_call", "file_search_call", "code_interpreter_call", "mcp_call", "image_generation_call"}
)
_PROGRESS_STATES = frozenset({"in_progress", "searching", "interpreting", "generating", "completed", "failed"})


class _Text:
    """Text built from deltas; the `.done` value, when it comes, is the provider's whole text."""

    __slots__ = ("_chunks", "_final")

    def __init__(self, initial: str = "") -> None:
        self._chunks = [initial] if initial else []
        self._final: str | None = None

    def append(self, delta: str) -> None:
        if self._final is None:
            self._chunks.append(delta)

    def finish(self, text: str) -> None:
        self._final = text

    def value(self) -> str:
        if self._final is not None:
            return self._final
        if len(self._chunks) > 1:
            # Join once and keep the join, so repeated result() calls stay linear.
            self._chunks = ["".join(self._chunks)]
        return self._chunks[0] if self._chunks else ""


class _Part:
    """One content or summary part of an item being rebuilt."""

    __slots__ = ("base", "key", "text", "logprobs", "annotations", "final")

    def __init__(self, base: dict[str, Any]) -> None:
        self.base = base
        self.key = "refusal" if base.get("type") == "refusal" else "text"
        initial = base.get(self.key)
        self.text = _Text(initial if isinstance(initial, str) else "")
        self.logprobs: list[Any] | None = None
        self.annotations: list[Any] = []
        self.final: dict[str, Any] | None = None

    def build(self) -> dict[str, Any]:
        if self.final is not None:
            return dict(self.final)
        part = dict(self.base)
        part[self.key] = self.text.value()
        if self.logprobs is not None:
            part["logprobs"] = list(self.logprobs)
        if self.annotations:
            earlier = part.get("annotations")
            part["annotations"] = [*(earlier if isinstance(earlier, list) else []), *self.annotations]
        return part


class _Item:
    """One output item being rebuilt; `output_item.done` makes the provider's item authoritative."""

    __slots__ = ("base", "fields", "parts", "final")

    def __init__(self, base: dict[str, Any]) -> None:
        self.base = base
        self.fields: dict[str, _Text] = {}
        self.parts: dict[str, dict[int, _Part]] = {}
        self.final: dict[str, Any] | None = None

    def field(self, key: str) -> _Text:
        text = self.fields.get(key)
        if text is None:
            initial = self.base.get(key)
            text = self.fields[key] = _Text(initial if isinstance(initial, str) else "")
        return text

    def build(self) -> dict[str, Any]:
        if self.final is not None:
            return dict(self.final)
        item = dict(self.base)
        for key, text in self.fields.items():
            item[key] = text.value()
        for place, parts in self.parts.items():
            item[place] = [parts[index].build() for index in sorted(parts)]
        return item


class ResponsesAssembler:
    """Rebuilds a Responses event stream into the response object, one event at a time.

    Usage::

        assembler = ResponsesDialect().stream_assembler()
        for event in decode_sse(body):
            assembler.feed(event)
        response, terminal = assembler.result(), assembler.terminal
    """

    def __init__(self) -> None:
        self.terminal: TerminalKind | None = None
        self.malformed_events = 0
        self._envelope: dict[str, Any] | None = None
        self._final: dict[str, Any] | None = None
        self._error: dict[str, Any] | None = None
        self._items: dict[int, _Item] = {}
        self._index_by_id: dict[str, int] = {}
        # The text the last event's delta grew, and the template learnt from that event: used only
        # while deltas follow one another (any other event may change what an index refers to).
        self._delta_text: _Text | None = None
        self._tokens: TokenTemplate | None = None

    def feed(self, event: SSEEvent) -> None:
        """Apply one event; malformed events are skipped and counted, never raised."""
        tokens = self._tokens
        if tokens is not None and tokens.take(event):
            return
        self._tokens = self._delta_text = None
        data = parse_event_data(event)
        if data is NOT_JSON or not isinstance(data, dict):
            if event.data.strip() == "[DONE]":
                return
            self.malformed_events += 1
            if event.event == "error":
                # The provider announced an error even if its payload is unreadable.
                self.terminal = "error"
                self._error = {"message": event.data} if event.data else {}
            return
        kind = data.get("type")
        if not isinstance(kind, str):
            kind = event.event
        terminal = _TERMINALS.get(kind or "") or _TERMINALS.get(event.event or "")
        if terminal is not None:
            self.terminal = terminal
        if kind is None or not self._apply(kind, data):
            self.malformed_events += 1
        elif self._delta_text is not None and not data.get("logprobs"):
            # A text delta with nothing else to apply (log probabilities would be): later ones
            # like it can skip all this.
            self._tokens = TokenTemplate.around(event, "delta", data["delta"], self._delta_text, _VARYING_KEYS)

    @property
    def answered(self) -> bool:
        """True once `response.completed`, `response.incomplete` or `response.failed` (or an error) arrived."""
        return self.terminal is not None

    def take_raw(self, chunk: bytes) -> bool:
        """Apply a whole chunk of the stream, undecoded, when it is one text delta that fits the
        learnt template; False to decode it. Call only at an event boundary."""
        tokens = self._tokens
        return tokens is not None and tokens.take_raw(chunk)

    def result(self) -> dict[str, Any] | None:
        """The best reconstruction so far, or None when nothing at all was learned.

        The response, its items and parts are fresh dicts; deeper values are shared with the parsed
        events, so treat the result as read-only.
        """
        items = [self._items[index].build() for index in sorted(self._items)]
        if self._final is not None:
            response = dict(self._final)
            output = response.get("output")
            if items and not (isinstance(output, list) and output):
                response["output"] = items
        elif self._envelope is not None:
            response = dict(self._envelope)
            if items:
                response["output"] = items
        elif items:
            response = {"output": items}
        elif self._error is not None:
            response = {}
        else:
            return None
        if self._error is not None:
            response["error"] = self._error
        return response

    def _apply(self, kind: str, data: dict[str, Any]) -> bool:
        """Apply one parsed event; False when it is malformed."""
        if kind == "error":
            nested = data.get("error")
            self._error = (
                nested
                if isinstance(nested, dict)
                else {key: value for key, value in data.items() if key not in ("type", "sequence_number")}
            )
            return True
        if "response" in data or kind in _TERMINALS:
            response = data.get("response")
            if not isinstance(response, dict):
                return False
            if kind in _TERMINALS:
                self._final = response
            else:
                self._envelope = response
            return True
        if kind in ("response.output_item.added", "response.output_item.done"):
            return self._on_item(data, done=kind.endswith(".done"))
        if kind in _PART_EVENTS:
            place, item_type = _PART_EVENTS[kind]
            return self._on_part(data, place, item_type, done=kind.endswith(".done"))
        if kind == "response.output_text.annotation.added":
            return self._on_annotation(data)
        prefix, _, suffix = kind.rpartition(".")
        spec = _STREAMED_TEXT.get(prefix)
        if spec is not None and suffix in ("delta", "done"):
            return self._on_text(data, spec, done=suffix == "done")
        item_type = prefix.removeprefix("response.")
        if item_type in _PROGRESS_ITEM_TYPES and suffix in _PROGRESS_STATES:
            item = self._item_for(data, item_type)
            if item is None:
                return False
            item.base["status"] = suffix
        return True  # a well-formed event this assembler has no use for

    def _on_item(self, data: dict[str, Any], *, done: bool) -> bool:
        raw = data.get("item")
        if not isinstance(raw, dict):
            return False
        item_id = raw.get("id")
        index = data.get("output_index")
        if index is None:
            index = self._index_by_id.get(item_id) if isinstance(item_id, str) else None
            if index is None:
                index = self._next_index()
        elif as_count(index) is None:
            return False
        item = self._items.get(index)
        if item is None:
            item = self._items[index] = _Item(dict(raw))
        elif not done:
            item.base = {**item.base, **raw}
        if done:
            item.final = raw
        if isinstance(item_id, str):
            self._index_by_id[item_id] = index
        return True

    def _on_part(self, data: dict[str, Any], place: str, item_type: str, *, done: bool) -> bool:
        raw = data.get("part")
        item = self._item_for(data, item_type)
        if item is None or not isinstance(raw, dict):
            return False
        index = self._part_index(data, place)
        if index is None:
            return False
        parts = item.parts.setdefault(place, {})
        part = parts.get(index)
        if part is None:
            part = parts[index] = _Part(dict(raw))
        elif not done:
            part.base = {**part.base, **raw}
        if done:
            part.final = raw
        return True

    def _on_annotation(self, data: dict[str, Any]) -> bool:
        annotation = data.get("annotation")
        part = self._part_for(data, ("content", "text", "message", "output_text"))
        if part is None or annotation is None:
            return False
        part.annotations.append(annotation)
        return True

    def _on_text(self, data: dict[str, Any], spec: tuple[str | None, str, str, str | None], *, done: bool) -> bool:
        place, key, item_type, _ = spec
        value = data.get(key if done else "delta")
        if not isinstance(value, str):
            return False
        if place is None:
            item = self._item_for(data, item_type)
            if item is None:
                return False
            text = item.field(key)
        else:
            part = self._part_for(data, spec)
            if part is None:
                return False
            text = part.text
            logprobs = data.get("logprobs")
            if isinstance(logprobs, list) and (done or logprobs):
                if done or part.logprobs is None:
                    part.logprobs = []
                part.logprobs.extend(logprobs)
        if done:
            text.finish(value)
        else:
            text.append(value)
            self._delta_text = text
        return True

    def _part_for(self, data: dict[str, Any], spec: tuple[str | None, str, str, str | None]) -> _Part | None:
        place, _, item_type, part_type = spec
        item = self._item_for(data, item_type)
        if item is None or place is None:
            return None
        index = self._part_index(data, place)
        if index is None:
            return None
        parts = item.parts.setdefault(place, {})
        part = parts.get(index)
        if part is None:
            part = parts[index] = _Part({"type": part_type})
        return part

    def _item_for(self, data: dict[str, Any], item_type: str) -> _Item | None:
        """The item an event refers to (by `output_index`, else `item_id`), created if unseen."""
        item_id = data.get("item_id")
        if item_id is not None and not isinstance(item_id, str):
            return None
        index = data.get("output_index")
        if index is None:
            if item_id is None:
                return None
            index = self._index_by_id.get(item_id)
            if index is None:
                index = self._next_index()
        elif as_count(index) is None:
            return None
        item = self._items.get(index)
        if item is None:
            base: dict[str, Any] = {"type": item_type}
            if item_id is not None:
                base["id"] = item_id
            item = self._items[index] = _Item(base)
        if item_id is not None:
            self._index_by_id.setdefault(item_id, index)
        return item

    @staticmethod
    def _part_index(data: dict[str, Any], place: str) -> int | None:
        raw = data.get(_INDEX_KEYS[place])
        return 0 if raw is None else as_count(raw)

    def _next_index(self) -> int:
        return max(self._items) + 1 if self._items else 0
