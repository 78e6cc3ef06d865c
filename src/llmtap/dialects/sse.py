"""Incremental server-sent events decoding, fed arbitrary byte chunks.

Follows the WHATWG event-stream rules (LF, CRLF and CR line ends, comments, multi-line `data:`,
`event:`/`id:`/`retry:` fields, one optional space after the colon), with one deliberate
difference: an event still open when the stream ends is delivered by `close()`, because a
model server that drops the final blank line has still sent a whole event.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SSEDecoder", "SSEEvent", "decode_sse"]

_LINE_END = re.compile(rb"\r\n|\r|\n")


@dataclass(slots=True)
class SSEEvent:
    """One dispatched event: its type (None when the stream named none), data, id and retry.

    Not frozen: a frozen dataclass's `__init__` costs three times as much, once per streamed event.
    """

    event: str | None
    data: str
    id: str | None = None
    retry: int | None = None


class SSEDecoder:
    """Turns chunks of an event stream into events, however the bytes are split.

    Usage::

        decoder = SSEDecoder()
        for chunk in chunks:
            for event in decoder.feed(chunk):
                ...
        for event in decoder.close():
            ...
    """

    __slots__ = ("_buffer", "_pending_cr", "_event", "_data", "_id", "_retry", "_has_fields", "_closed")

    def __init__(self) -> None:
        self._buffer = b""
        self._pending_cr = False
        self._event: str | None = None
        self._data: list[str] = []
        self._id: str | None = None
        self._retry: int | None = None
        self._has_fields = False
        self._closed = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Decode one chunk and return the events it completed."""
        if self._closed or not chunk:
            return []
        if self.at_event_boundary and chunk.endswith(b"\n\n") and b"\r" not in chunk:
            return self._feed_whole_events(chunk)
        if self._pending_cr:
            self._pending_cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        data = self._buffer + chunk if self._buffer else chunk
        # Model servers end lines with LF: a plain split then; CR and CRLF take the general path.
        lines = _LINE_END.split(data) if b"\r" in data else data.split(b"\n")
        self._buffer = lines.pop()  # the unterminated remainder (empty when data ends a line)
        events: list[SSEEvent] = []
        for line in lines:
            self._process_line(line, events)
        if data.endswith(b"\r"):
            # A CR ends a line, but a LF in the next chunk may complete the same CRLF.
            self._pending_cr = True
        return events

    def _feed_whole_events(self, chunk: bytes) -> list[SSEEvent]:
        """Decode a chunk of whole LF-ended events with nothing pending: how model servers send them.

        An event of one `data:` line, or of an `event:` line then one `data:` line, is built
        directly, after any comment lines before it; any other event goes line by line. Same
        events as the general path.
        """
        events: list[SSEEvent] = []
        for block in chunk[:-2].split(b"\n\n"):
            while block.startswith(b":"):  # comment lines (keep-alives, a proxy's notes) carry nothing
                block = block.partition(b"\n")[2]
            if not block:
                continue
            if block.startswith(b"data: ") and b"\n" not in block:
                events.append(SSEEvent(None, block[6:].decode("utf-8", errors="replace"), self._id))
                continue
            if block.startswith(b"event: ") and block.count(b"\n") == 1:
                name, _, data = block.partition(b"\n")
                if data.startswith(b"data: "):
                    event = name[7:].decode("utf-8", errors="replace")
                    events.append(SSEEvent(event, data[6:].decode("utf-8", errors="replace"), self._id))
                    continue
            for line in block.split(b"\n"):
                self._process_line(line, events)
            self._dispatch(events)
        return events

    def close(self) -> list[SSEEvent]:
        """End the stream and return any event left open (a last line, or a missing blank line)."""
        if self._closed:
            return []
        events: list[SSEEvent] = []
        if self._buffer:
            self._process_line(self._buffer, events)
            self._buffer = b""
        self._dispatch(events)
        self._closed = True
        return events

    @property
    def has_pending(self) -> bool:
        """True when bytes or fields of an undispatched event are waiting."""
        return bool(self._buffer) or self._has_fields

    @property
    def at_event_boundary(self) -> bool:
        """True when the next byte starts a new line of a new event: nothing pending, no CR half-read."""
        return not (self._buffer or self._has_fields or self._pending_cr or self._closed)

    def _process_line(self, raw: bytes, events: list[SSEEvent]) -> None:
        if not raw:
            self._dispatch(events)
            return
        if raw.startswith(b"data:"):  # nearly every line of a model stream: no str work on the name
            data = raw[6:] if raw[5:6] == b" " else raw[5:]
            self._data.append(data.decode("utf-8", errors="replace"))
            self._has_fields = True
            return
        if raw.startswith(b":"):
            return
        line = raw.decode("utf-8", errors="replace")
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._has_fields = True
        elif name == "event":
            self._event = value
            self._has_fields = True
        elif name == "id":
            if "\x00" not in value:
                self._id = value
                self._has_fields = True
        elif name == "retry":
            if value.isascii() and value.isdigit():
                self._retry = int(value)
                self._has_fields = True

    def _dispatch(self, events: list[SSEEvent]) -> None:
        if self._has_fields and (self._data or self._event is not None):
            data = self._data[0] if len(self._data) == 1 else "\n".join(self._data)
            events.append(SSEEvent(self._event, data, self._id, self._retry))
        self._event = None
        self._data = []
        self._retry = None
        self._has_fields = False
        # The last event id persists across events, as in the WHATWG model.


def decode_sse(body: bytes) -> list[SSEEvent]:
    """Decode a whole event stream at once."""
    decoder = SSEDecoder()
    return decoder.feed(body) + decoder.close()
