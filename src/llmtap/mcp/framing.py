"""Bounded framing of a copy of MCP traffic: newline-delimited JSON-RPC lines, and SSE events.

The proxies forward bytes as they arrive and hand a copy to these framers, which find whole
messages for the recorder. Neither ever holds more than its bound: a line (or event) longer than
`max_bytes` is not kept; the framer keeps its first `prefix_bytes` and its full size, so the
recorder can still close the call it answers (`OversizedMessage`). Lines that are not JSON-RPC
are counted in `FramingStats` and otherwise ignored: the bytes went through regardless.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from ..dialects.sse import SSEDecoder

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "FramingStats",
    "LineFramer",
    "OversizedMessage",
    "SSEFramer",
    "decode_messages",
    "oversized_response_id",
]

DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024
PREFIX_BYTES = 4096


@dataclass(slots=True)
class FramingStats:
    """What a framer (and `decode_messages`) saw besides messages: counted, never raised."""

    messages: int = 0
    malformed: int = 0
    oversized: int = 0


@dataclass(frozen=True, slots=True)
class OversizedMessage:
    """A line or event longer than the bound: its first bytes and its full size."""

    prefix: bytes
    size: int


class LineFramer:
    """Splits a byte stream into lines (LF-terminated; a trailing CR is dropped), each at most `max_bytes`.

    Usage::

        framer = LineFramer(max_bytes=1 << 20)
        for line in framer.feed(chunk):   # bytes, or OversizedMessage
            ...
    """

    __slots__ = ("_oversized_size", "_parts", "_pending", "_prefix", "max_bytes", "prefix_bytes", "stats")

    def __init__(self, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, prefix_bytes: int = PREFIX_BYTES) -> None:
        self.max_bytes = max_bytes
        self.prefix_bytes = min(prefix_bytes, max_bytes)
        self.stats = FramingStats()
        self._parts: list[bytes] = []
        self._pending = 0
        self._oversized_size: int | None = None  # set while skipping the rest of a line too long to keep
        self._prefix = b""

    def feed(self, chunk: bytes) -> list[bytes | OversizedMessage]:
        """Return the lines `chunk` completed."""
        out: list[bytes | OversizedMessage] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                self._hold(chunk[start:])
                return out
            self._hold(chunk[start:end])
            out.append(self._finish())
            start = end + 1

    def close(self) -> bytes | OversizedMessage | None:
        """Return an unterminated last line, if any (a peer that exited mid-line)."""
        if not self._parts and self._oversized_size is None:
            return None
        return self._finish()

    def _hold(self, piece: bytes) -> None:
        if not piece:
            return
        if self._oversized_size is not None:
            self._oversized_size += len(piece)
            return
        self._pending += len(piece)
        self._parts.append(piece)
        if self._pending > self.max_bytes:
            joined = b"".join(self._parts)
            self._prefix = joined[: self.prefix_bytes]
            self._oversized_size = self._pending
            self._parts = []
            self._pending = 0

    def _finish(self) -> bytes | OversizedMessage:
        if self._oversized_size is not None:
            message = OversizedMessage(self._prefix, self._oversized_size)
            self._oversized_size = None
            self._prefix = b""
            self.stats.oversized += 1
            return message
        line = b"".join(self._parts) if len(self._parts) != 1 else self._parts[0]
        self._parts = []
        self._pending = 0
        return line[:-1] if line.endswith(b"\r") else line


class SSEFramer:
    """Decodes an SSE stream into events' `data`, holding at most `max_bytes` of an unfinished event.

    An event that outgrows the bound is dropped and reported as an `OversizedMessage` once it
    ends (its size is the stream bytes it spanned), and decoding resumes at the next event.
    """

    __slots__ = ("_decoder", "_held", "_prefix", "_skip_size", "_skipping", "_tail", "max_bytes", "stats")

    def __init__(self, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.stats = FramingStats()
        self._decoder = SSEDecoder()
        self._held = 0
        self._skipping = False
        self._skip_size = 0
        self._prefix = b""
        self._tail = b""

    def feed(self, chunk: bytes) -> list[str | OversizedMessage]:
        """Return the `data` of each event `chunk` completed (events with no data are left out)."""
        out: list[str | OversizedMessage] = []
        while chunk:
            if self._skipping:
                chunk = self._skip(chunk, out)
                continue
            events = self._decoder.feed(chunk)
            out.extend(event.data for event in events if event.data)
            self._held = 0 if self._decoder.at_event_boundary else self._held + len(chunk)
            if self._held > self.max_bytes:
                self._skipping = True
                self._skip_size = self._held
                self._prefix = chunk[-self._held :][:PREFIX_BYTES]
                self._decoder = SSEDecoder()
                self._held = 0
                self._tail = chunk[-3:]
            chunk = b""
        return out

    def close(self) -> list[str | OversizedMessage]:
        """Return what the stream's end completed (an event missing its final blank line)."""
        if self._skipping:
            self._skipping = False
            self.stats.oversized += 1
            return [OversizedMessage(self._prefix, self._skip_size)]
        return [event.data for event in self._decoder.close() if event.data]

    def _skip(self, chunk: bytes, out: list[str | OversizedMessage]) -> bytes:
        """Pass over an oversized event's bytes; return what follows its end (a blank line)."""
        window = self._tail + chunk
        match = _EVENT_END.search(window)
        if match is None:
            self._skip_size += len(chunk)
            self._tail = window[-3:]
            return b""
        used = match.end() - len(self._tail)
        self._skip_size += max(used, 0)
        self._skipping = False
        self._tail = b""
        self.stats.oversized += 1
        out.append(OversizedMessage(self._prefix, self._skip_size))
        return chunk[max(used, 0) :]


_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")

# The id of a response too long to keep, read only where the SDKs put it: first, or after "jsonrpc".
_LEADING_ID = re.compile(
    rb'\A\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?'
    rb'"id"\s*:\s*(-?[0-9]{1,18}|"(?:[^"\\]|\\.){0,256}")\s*,\s*"(result|error)"'
)


def oversized_response_id(prefix: bytes) -> tuple[int | str, str] | None:
    """Return `(id, "result" | "error")` of an oversized response whose id leads it, else None."""
    match = _LEADING_ID.match(prefix)
    if match is None:
        return None
    try:
        value = orjson.loads(match.group(1))
    except orjson.JSONDecodeError:
        return None
    if not isinstance(value, (int, str)) or isinstance(value, bool):
        return None
    return value, match.group(2).decode()


def decode_messages(data: bytes | str, stats: FramingStats) -> list[dict[str, Any]]:
    """Return the JSON-RPC messages in one line or event (a batch gives several); count what is not one.

    A blank line is nothing; anything else that is not a JSON-RPC 2.0 object (or an array of them)
    is counted in `stats.malformed` and yields no message.
    """
    if not data.strip():
        return []
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        stats.malformed += 1
        return []
    items = value if isinstance(value, list) else [value]
    messages = [item for item in items if isinstance(item, dict) and item.get("jsonrpc") == "2.0"]
    if not messages or len(messages) != len(items):
        stats.malformed += 1
    stats.messages += len(messages)
    return messages
