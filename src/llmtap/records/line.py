"""The persisted raw line: built from a finished `Exchange`, and the stream tracker that reads a stream as it passes.

Pure functions, no I/O. A capture point hands a finished `Exchange` to `raw_line_from_exchange`,
which lets the call's dialect reassemble and read it; the store persists the line; readers turn
each line back into a `ModelCallRecord` (`records.model_call`).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from ..dialects import Dialect, dialect_for_path
from ..dialects.base import WRITE_HEADROOM, writable, writable_json
from ..dialects.sse import SSEDecoder
from ..exchange import Exchange, new_model_call_id
from .categories import category_for_exception, category_for_status, status_from_exception
from .content_coding import DEFAULT_MAX_DECODED_BYTES, DecodedTooLarge, UndecodableContent, decode_content
from .fingerprint import FINGERPRINT_VERSION, FieldMemo, continuation_fingerprint
from .json_layout import body_check

__all__ = [
    "SCHEMA_VERSION",
    "StreamTracker",
    "decode_raw_field",
    "encode_line",
    "raw_line_from_exchange",
    "recorded_chunks",
]

# Version of the persisted line. Readers accept every version up to this one (and lines without
# a version, as written by the reference system, which read as version 0).
SCHEMA_VERSION = 1


def _text_fields(name: str, body: bytes) -> dict[str, str]:
    """Return `{name: text}`, or `{name_base64: ...}` when the bytes are not UTF-8, so nothing is lost."""
    try:
        return {name: body.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{name}_base64": base64.b64encode(body).decode("ascii")}


@dataclass(slots=True)
class _StreamOutcome:
    response: dict[str, Any] | None
    terminal: str | None
    malformed: int


class StreamTracker:
    """Follows a stream through its dialect as chunks pass, so a capture point knows when the
    client holds the complete answer (a chat choice's `finish_reason`, a Messages stop reason, a
    Responses terminal event) and must hold that chunk and what follows until the record is durable.

    Never raises: a dialect failure marks the tracker `broken`, and the record is then rebuilt
    from the stored bytes instead.
    """

    __slots__ = ("_decoder", "_assembler", "broken", "_outcome", "_take_raw", "_answered")

    def __init__(self, dialect: Dialect) -> None:
        self._decoder = SSEDecoder()
        self._assembler = dialect.stream_assembler()
        self.broken = False
        self._outcome: _StreamOutcome | None = None
        # An assembler that can read a plain token chunk without SSE decoding (see `token_template`).
        self._take_raw: Callable[[bytes], bool] | None = getattr(self._assembler, "take_raw", None)
        self._answered = False  # once the answer is complete, it stays so (chunks after it are held too)

    @property
    def terminal(self) -> str | None:
        """How the stream ended, once its terminal event was seen."""
        return None if self.broken else self._assembler.terminal

    def feed(self, chunk: bytes) -> bool:
        """Take one chunk; return True once the answer is complete (or the terminal event has been seen)."""
        if self.broken or self._outcome is not None:
            return self.terminal is not None
        try:
            if self._take_raw is not None and self._decoder.at_event_boundary and self._take_raw(chunk):
                return self._answered  # a plain token event: never the one that completes the answer
            for event in self._decoder.feed(chunk):
                self._assembler.feed(event)
            if not self._answered:
                self._answered = self._assembler.answered
            return self._answered
        except Exception:
            self.broken = True
            return False

    def outcome(self) -> _StreamOutcome | None:
        """Close the stream and return what was reassembled, or None when the tracker broke."""
        if self._outcome is None and not self.broken:
            try:
                for event in self._decoder.close():
                    self._assembler.feed(event)
                self._outcome = _StreamOutcome(
                    self._assembler.result(), self._assembler.terminal, self._assembler.malformed_events
                )
            except Exception:
                self.broken = True
        return self._outcome


def _reassemble(dialect: Dialect, chunks: Iterable[bytes]) -> _StreamOutcome:
    tracker = StreamTracker(dialect)
    for chunk in chunks:
        tracker.feed(chunk)
    outcome = tracker.outcome()
    return outcome if outcome is not None else _StreamOutcome(None, None, 0)


def raw_line_from_exchange(
    exchange: Exchange,
    *,
    dialect: Dialect | None = None,
    tracker: StreamTracker | None = None,
    max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES,
    check_depth: bool = True,
) -> dict[str, Any]:
    """Build the persisted line for one finished call.

    The shape is the spec's raw CaptureStore line plus `schema_version`, `stream` and
    `stream_truncated` for streams, `request_raw`/`response_raw` where a body is not a JSON object
    or is a stream, `response_body_crc32` so a JSON response can be sent back byte for byte
    (`records.json_layout`), `continuation_fingerprint` and `fingerprint_version` where both the
    request and the response were read, and a few optional fields (`provider`, `rollout_id`,
    `http`, `sampling`, `exception_type`). Parsing problems become `capture_parse_error`, never an exception.

    An uncompressed stream also keeps `response_chunks`: `[offset_us, length]` per body chunk as it
    arrived (offset from the call's start), so `response_raw` can be cut back into the chunks the
    client got, when it got them: what replay serves and the viewer shows.

    A compressed response is decoded to at most `max_decoded_bytes`; past that (or when it cannot
    be decoded at all) the line keeps the raw bytes and says why in `response_decoding`:
    `{"content_encoding", "decoded": false, "reason": "decoded_size_limit" | "undecodable",
    "limit_bytes"}`. This is pure CPU: a capture point calls it off its event loop for a large body.

    A body parsed from hostile JSON may nest too deep to be written back (orjson reads 1,024
    levels, writes 254); with `check_depth` each parsed body is checked and one that is too deep
    is kept as raw text. A capture point that encodes the line with `encode_line` may pass False
    and skip those checks (two bracket counts of each body, about 3 instructions a byte): the
    encode checks the whole line at once, and only when it fails is the line built again with
    the checks.
    """
    exchange.finish()
    dialect = dialect or dialect_for_path(exchange.path, exact=False)
    line: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "model_call_id": exchange.model_call_id or new_model_call_id(),
        "dialect": dialect.name if dialect else None,
        "model_ref": exchange.model_ref,
        "started_at": exchange.started_at,
        "completed_at": exchange.completed_at,
        "latency_ms": exchange.latency_ms,
        "latency_ttft_ms": exchange.ttft_ms,
        "status_code": exchange.status_code,
        "error_category": None,
        "request": None,
        "response": None,
    }
    _read_request(exchange, line, check_depth)
    parse_failed, terminal, is_stream = _read_response(exchange, dialect, line, tracker, max_decoded_bytes, check_depth)
    line["error_category"] = _categorize(exchange, line, parse_failed, terminal, is_stream)
    _add_fingerprint(dialect, line)
    if is_stream:
        line["stream"] = True
        line["stream_truncated"] = terminal is None
        if "content-encoding" not in exchange.response_headers:
            # Whole microseconds: an integer encodes at a fraction of a float's cost, per chunk.
            line["response_chunks"] = [[int(offset * 1_000_000), len(chunk)] for offset, chunk in exchange.response_chunks]
    _add_context(exchange, line)
    return line


def _json_object(body: bytes, check_depth: bool) -> dict[str, Any] | None:
    """The body parsed, when it is a JSON object the store can write back; None for anything else."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) and (not check_depth or writable_json(parsed, body)) else None


def _read_request(exchange: Exchange, line: dict[str, Any], check_depth: bool) -> None:
    body = exchange.request_body
    if not body:
        return
    parsed = _json_object(body, check_depth)
    if parsed is not None:
        line["request"] = parsed
    else:
        line.update(_text_fields("request_raw", body))


def _read_response(
    exchange: Exchange,
    dialect: Dialect | None,
    line: dict[str, Any],
    tracker: StreamTracker | None,
    max_decoded_bytes: int,
    check_depth: bool,
) -> tuple[bool, str | None, bool]:
    """Fill `response`/`response_raw`; return (parse failed, stream terminal, is stream)."""
    raw = exchange.response_body
    encoding = exchange.response_headers.get("content-encoding", "")
    try:
        body = decode_content(raw, encoding, limit=max_decoded_bytes)
    except UndecodableContent as exc:
        line.update(_text_fields("response_raw", raw))
        line["response_decoding"] = {
            "content_encoding": encoding,
            "decoded": False,
            "reason": "decoded_size_limit" if isinstance(exc, DecodedTooLarge) else "undecodable",
            "limit_bytes": max_decoded_bytes,
        }
        return bool(raw), None, exchange.is_stream
    if exchange.is_stream:
        line.update(_text_fields("response_raw", body))
        if dialect is None:
            return bool(body), None, True
        outcome = tracker.outcome() if tracker is not None and not encoding else None
        if outcome is None:
            outcome = _reassemble(dialect, [body] if encoding else (chunk for _, chunk in exchange.response_chunks))
        assembled = outcome.response
        line["response"] = assembled if assembled is None or not check_depth or writable(assembled) else None
        return line["response"] is None and bool(body.strip()), outcome.terminal, True
    if not body:
        return False, None, False
    parsed = _json_object(body, check_depth)
    if parsed is not None:
        line["response"] = parsed
        line["response_body_crc32"] = body_check(body)  # lets a replay send these exact bytes (records.json_layout)
        return False, None, False
    line.update(_text_fields("response_raw", body))
    return True, None, False


def _categorize(
    exchange: Exchange, line: dict[str, Any], parse_failed: bool, terminal: str | None, is_stream: bool
) -> str | None:
    if exchange.cancelled:
        return "cancelled"
    status_category = category_for_status(exchange.status_code)
    if exchange.exception is not None:
        if exchange.status_synthesized:
            # The capture point answered for an upstream it could not reach: the exception says why.
            return category_for_exception(exchange.exception)
        if exchange.status_code is None:
            line["status_code"] = status_from_exception(exchange.exception)
            status_category = category_for_status(line["status_code"])
        return status_category or category_for_exception(exchange.exception)
    if status_category:
        return status_category
    if is_stream:
        if terminal == "error":
            return "upstream_error"
        if terminal == "incomplete":
            return "incomplete"
        if terminal is None:
            return "stream_truncated"
    if parse_failed:
        return "capture_parse_error"
    if exchange.status_code is None:
        return "exception"
    return None


# The turns of the conversations passing through this process, read once (see `FieldMemo`).
_FINGERPRINT_MEMO = FieldMemo()


def _add_fingerprint(dialect: Dialect | None, line: dict[str, Any]) -> None:
    """Store the call's continuation fingerprint (specs/content-fingerprint.md, version 2), so a line
    llmtap writes is a lineage row to the reference system's resolver as well as to llmtap's."""
    request, response = line["request"], line["response"]
    if dialect is None or request is None or response is None:
        return
    found = continuation_fingerprint(request, response, dialect=dialect, memo=_FINGERPRINT_MEMO)
    if found is not None:
        line["continuation_fingerprint"] = found
        line["fingerprint_version"] = FINGERPRINT_VERSION


def _add_context(exchange: Exchange, line: dict[str, Any]) -> None:
    if exchange.exception is not None:
        # The type only: exception messages can quote prompt text or secrets.
        line["exception_type"] = type(exchange.exception).__name__
    if exchange.rollout_id is not None:
        line["rollout_id"] = exchange.rollout_id
    if exchange.provider is not None:
        line["provider"] = exchange.provider
    if exchange.sampling is not None:
        line["sampling"] = exchange.sampling
    line["http"] = {
        "method": exchange.method,
        "path": exchange.path,
        "request_headers": exchange.request_headers,
        "response_headers": exchange.response_headers,
    }
    if exchange.extra:
        line.update({key: value for key, value in exchange.extra.items() if key not in line})


# The line itself is one level; the rows that later hold it keep the rest of `WRITE_HEADROOM`.
_LINE_WRAPS = WRITE_HEADROOM - 1


def encode_line(line: Mapping[str, Any]) -> bytes | None:
    """The line as the store writes it (compact JSON and a newline), or None when it cannot be written
    with `WRITE_HEADROOM` levels to spare (a body nested too deep: build the line again with
    `check_depth`). One encode, of the line inside `WRITE_HEADROOM - 1` lists, then the lists cut off.
    """
    wrapped: Any = line if isinstance(line, dict) else dict(line)
    for _ in range(_LINE_WRAPS):
        wrapped = [wrapped]
    try:
        data = orjson.dumps(wrapped)
    except orjson.JSONEncodeError:  # too deep, or not JSON at all: the caller decides
        return None
    return data[_LINE_WRAPS:-_LINE_WRAPS] + b"\n"


def decode_raw_field(line: Mapping[str, Any], name: str) -> bytes | None:
    """Return the exact bytes of `request_raw`/`response_raw`, whichever form the line stored."""
    text = line.get(name)
    if isinstance(text, str):
        return text.encode("utf-8")
    encoded = line.get(f"{name}_base64")
    if isinstance(encoded, str):
        try:
            return base64.b64decode(encoded, validate=True)
        except binascii.Error:
            return None
    return None


def recorded_chunks(line: Mapping[str, Any], body: bytes) -> list[tuple[float, bytes]] | None:
    """`body` cut back into the chunks the client got, each with its arrival in seconds from the call's start.

    From the line's `response_chunks`. None when the line has none, or a list that does not cut
    these exact bytes (a line another tool wrote or edited): a reader then shows no times and a
    replay picks its own boundaries, rather than wrong ones.
    """
    chunks = line.get("response_chunks")
    if not isinstance(chunks, list) or not chunks:
        return None
    pieces: list[tuple[float, bytes]] = []
    position = 0
    for entry in chunks:
        if not (isinstance(entry, list) and len(entry) == 2):
            return None
        offset_us, length = entry
        if type(offset_us) is not int or type(length) is not int or offset_us < 0 or length < 0:
            return None
        pieces.append((offset_us / 1_000_000, body[position : position + length]))
        position += length
    return pieces if position == len(body) else None
