"""A recorded call's answer as a replay sends it: status, headers, body, and the stream in chunks with delays.

The persisted line keeps the status, the response headers (credential headers were never
written), and the body: for a stream the whole event stream as it arrived (`response_raw`), for
a JSON body the parsed object (`response`), for anything else the raw text or bytes. It keeps no
each chunk's arrival (`response_chunks`) where it was written with it: a replayed stream then comes
back in the chunks the client got, each after its recorded gap, divided by `speed`. A line
without them (older, or another tool's) is cut at its event boundaries (each SSE event one
chunk): the first event after the recorded TTFT, the others spread evenly over the rest of the
recorded latency, divided by `speed`.

A JSON body comes back byte for byte: the line's `response` in the encoding whose length and
CRC match its `response_body_crc32` (`records.json_layout`). Where none matches (a server's own
spacing or escapes), or the line has no check (older, or another tool's), it comes back as the
same JSON value with the same key order, written compactly, and `RecordedAnswer.exact` is
False. `content-length` is set to the length actually sent, and `content-encoding` and
`transfer-encoding` are dropped, because the recorded body is the decoded one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import LlmtapError
from ..records import decode_raw_field, recorded_chunks
from ..records.json_layout import encode_as_recorded

__all__ = ["RecordedAnswer", "ReplayAnswerError", "answer_from_line", "split_events"]

# Headers that describe the bytes on the original wire, not the decoded body a replay sends.
_WIRE_HEADERS = frozenset({"content-length", "content-encoding", "transfer-encoding", "connection", "keep-alive"})
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


class ReplayAnswerError(LlmtapError):
    """Raised when a recorded call holds no answer a replay can send (it ended in an exception, or its line is damaged)."""


@dataclass(frozen=True, slots=True)
class RecordedAnswer:
    """What a replay sends for one recorded call: status, headers (name, value pairs), and timed chunks.

    `chunks` is a tuple of (seconds to wait before the chunk, bytes); their join is the body.
    `exact` is False when the body is the recorded JSON value re-encoded, not the recorded bytes.
    """

    status: int
    headers: tuple[tuple[str, str], ...]
    chunks: tuple[tuple[float, bytes], ...]
    stream: bool
    exact: bool = True  # False when only the JSON value is the recorded one, not its bytes

    @property
    def body(self) -> bytes:
        return b"".join(chunk for _, chunk in self.chunks)

    def header(self, name: str) -> str | None:
        wanted = name.lower()
        return next((value for key, value in self.headers if key == wanted), None)


def split_events(body: bytes) -> list[bytes]:
    """Cut an event stream after each blank line: every piece is one whole event, and the pieces join to `body`."""
    pieces: list[bytes] = []
    start = 0
    for found in _EVENT_END.finditer(body):
        pieces.append(body[start : found.end()])
        start = found.end()
    if start < len(body):
        pieces.append(body[start:])
    return pieces or [body]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def _delays(count: int, line: Mapping[str, Any], speed: float) -> list[float]:
    """Seconds before each of `count` chunks: TTFT first, the rest of the latency spread evenly; 0 at speed 0."""
    if speed <= 0 or count == 0:
        return [0.0] * count
    total = _number(line.get("latency_ms"))
    first = _number(line.get("latency_ttft_ms"))
    first_s = (first or 0.0) / 1000.0 / speed
    rest_s = max(0.0, ((total or 0.0) - (first or 0.0)) / 1000.0 / speed)
    if count == 1:
        return [first_s if first is not None else (total or 0.0) / 1000.0 / speed]
    gap = rest_s / (count - 1)
    return [first_s] + [gap] * (count - 1)


def _body(line: Mapping[str, Any]) -> tuple[bytes, bool]:
    """The recorded body and whether it is the recorded bytes (not only the same JSON value)."""
    raw = decode_raw_field(line, "response_raw")
    if raw is not None:
        return raw, True
    response = line.get("response")
    if response is None:
        return b"", True
    return encode_as_recorded(response, line.get("response_body_crc32"))


def answer_from_line(line: Mapping[str, Any] | None, *, speed: float = 0.0) -> RecordedAnswer:
    """Build the answer a replay sends for a recorded call's persisted line."""
    if not isinstance(line, Mapping):
        raise ReplayAnswerError(
            "Could not replay a recorded call: the recording holds no persisted line for it; replay from a capsule or capture directory."
        )
    status = line.get("status_code")
    if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
        raise ReplayAnswerError(
            f"Could not replay recorded call {line.get('model_call_id')!r}: it has no HTTP status "
            f"(it ended as {line.get('exception_type') or line.get('error_category') or 'unknown'}); re-record the run."
        )
    http = line.get("http")
    recorded = http.get("response_headers") if isinstance(http, Mapping) else None
    headers = [
        (str(name).lower(), str(value))
        for name, value in (recorded.items() if isinstance(recorded, Mapping) else ())
        if isinstance(name, str) and isinstance(value, str) and name.lower() not in _WIRE_HEADERS
    ]
    body, exact = _body(line)
    stream = bool(line.get("stream"))
    if not stream:
        headers.append(("content-length", str(len(body))))
        return RecordedAnswer(status, tuple(headers), tuple(zip(_delays(1, line, speed), [body])), stream, exact)
    chunks = recorded_chunks(line, body) if body else None
    if chunks is not None:
        arrivals = [arrival for arrival, _ in chunks]
        gaps = [max(0.0, now - before) for before, now in zip([0.0, *arrivals], arrivals)]
        delays = [gap / speed if speed > 0 else 0.0 for gap in gaps]
        return RecordedAnswer(status, tuple(headers), tuple(zip(delays, [piece for _, piece in chunks])), stream)
    pieces = split_events(body) if body else [body]
    return RecordedAnswer(status, tuple(headers), tuple(zip(_delays(len(pieces), line, speed), pieces)), stream)
