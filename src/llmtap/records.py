"""Records: the persisted raw line, the normalized ModelCallRecord, error categories and metrics.

Pure functions, no I/O. A capture point hands a finished `Exchange` to `raw_line_from_exchange`,
which lets the call's dialect reassemble and read it; the store persists the line; readers turn
each line back into a `ModelCallRecord` with `ModelCallRecord.from_raw_line`.
"""

from __future__ import annotations

import base64
import binascii
import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterable, Mapping

import orjson

from .content_coding import DEFAULT_MAX_DECODED_BYTES, DecodedTooLarge, UndecodableContent, decode_content
from .dialects import DIALECTS, Dialect, Normalized, dialect_for_path
from .dialects.base import writable_json
from .dialects.sse import SSEDecoder
from .exchange import Exchange, new_model_call_id

__all__ = [
    "ERROR_CATEGORIES",
    "PAYLOAD_FIELDS",
    "SCHEMA_VERSION",
    "ModelCallRecord",
    "aggregate_metrics",
    "category_for_exception",
    "category_for_status",
    "StreamTracker",
    "raw_line_from_exchange",
]

# Version of the persisted line. Readers accept every version up to this one (and lines without
# a version, as written by the reference system, which read as version 0).
SCHEMA_VERSION = 1

ERROR_CATEGORIES = (
    "timeout",
    "rate_limit",
    "auth",
    "not_found",
    "client_error",
    "upstream_error",
    "incomplete",
    "stream_truncated",
    "capture_parse_error",
    "connection",
    "exception",
    "cancelled",
)

PAYLOAD_FIELDS = ("request", "response", "request_raw", "response_raw")


def category_for_status(status: int | None) -> str | None:
    """Return the error category an HTTP status implies, or None for success or unknown."""
    if status is None or status < 400:
        return None
    if status in (408, 504):
        return "timeout"
    if status == 429:
        return "rate_limit"
    if status in (401, 403):
        return "auth"
    if status == 404:
        return "not_found"
    if status < 500:
        return "client_error"
    return "upstream_error"


# Exception class-name fragments that mean the connection failed (httpx's ConnectError,
# RemoteProtocolError, ReadError; aiohttp's ClientConnectorError, ClientPayloadError, ServerDisconnectedError).
_CONNECTION_WORDS = ("connect", "protocol", "payload", "readerror", "writeerror", "reset", "broken", "closed")


def category_for_exception(exc: BaseException) -> str:
    """Return the error category of an exception raised during a call."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = type(current).__name__.lower()
        if isinstance(current, TimeoutError) or "timeout" in name:
            return "timeout"
        if isinstance(current, ConnectionError) or any(word in name for word in _CONNECTION_WORDS):
            return "connection"
        current = current.__cause__ or current.__context__
    return "exception"


def status_from_exception(exc: BaseException) -> int | None:
    """Return the HTTP status an exception carries (`status`, `status_code`, `response.status_code`)."""
    for holder_name, attribute in (("", "status"), ("", "status_code"), ("response", "status_code")):
        try:
            holder = getattr(exc, holder_name, None) if holder_name else exc
            value = getattr(holder, attribute, None)
        except Exception:  # a lazy attribute may itself fail; the status is then unknown
            continue
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
            return value
    return None


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
) -> dict[str, Any]:
    """Build the persisted line for one finished call.

    The shape is the spec's raw CaptureStore line plus `schema_version`, `stream` and
    `stream_truncated` for streams, `request_raw`/`response_raw` where a body is not a JSON object
    or is a stream, and a few optional fields (`provider`, `rollout_id`, `http`, `sampling`,
    `exception_type`). Parsing problems become `capture_parse_error`, never an exception.

    A compressed response is decoded to at most `max_decoded_bytes`; past that (or when it cannot
    be decoded at all) the line keeps the raw bytes and says why in `response_decoding`:
    `{"content_encoding", "decoded": false, "reason": "decoded_size_limit" | "undecodable",
    "limit_bytes"}`. This is pure CPU: a capture point calls it off its event loop for a large body.
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
    _read_request(exchange, line)
    parse_failed, terminal, is_stream = _read_response(exchange, dialect, line, tracker, max_decoded_bytes)
    line["error_category"] = _categorize(exchange, line, parse_failed, terminal, is_stream)
    if is_stream:
        line["stream"] = True
        line["stream_truncated"] = terminal is None
    _add_context(exchange, line)
    return line


def _json_object(body: bytes) -> dict[str, Any] | None:
    """The body parsed, when it is a JSON object the store can write back; None for anything else."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) and writable_json(parsed, body) else None


def _read_request(exchange: Exchange, line: dict[str, Any]) -> None:
    body = exchange.request_body
    if not body:
        return
    parsed = _json_object(body)
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
        line["response"] = outcome.response if writable_json(outcome.response, body) else None
        return line["response"] is None and bool(body.strip()), outcome.terminal, True
    if not body:
        return False, None, False
    parsed = _json_object(body)
    if parsed is not None:
        line["response"] = parsed
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


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(slots=True, kw_only=True)
class ModelCallRecord:
    """One captured model call, normalized: what consumers read instead of provider JSON.

    Every field but `call_index` and the lists may be None, which always means unknown. The
    payload fields hold the raw request and response; `to_dict(include_payloads=False)` leaves
    them out for rollout attachments.
    """

    model_call_id: str
    response_id: str | None = None
    call_index: int
    model_ref: dict[str, Any] | None = None
    model: str | None = None
    dialect: str | None = None
    provider: str | None = None
    status_code: int | None = None
    response_status: str | None = None
    finish_reason: str | None = None
    finish_reason_normalized: str | None = None
    error_category: str | None = None
    started_at: float | None = None
    completed_at: float | None = None
    latency_total_ms: float | None = None
    latency_ttft_ms: float | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_reasoning: int | None = None
    tokens_total: int | None = None
    cache_hit: bool | None = None
    cached_tokens: int | None = None
    cache_creation_tokens: int | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    hosted_tool_calls: list[dict[str, Any]] = field(default_factory=list)
    reasoning_content: str | None = None
    reasoning_redacted_blocks: int = 0
    refusal: str | None = None
    served_item_ids: list[str] = field(default_factory=list)
    stream: bool = False
    stream_truncated: bool = False
    error: dict[str, Any] | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    schema_version: int = 0
    request: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    request_raw: str | None = None
    response_raw: str | None = None

    @classmethod
    def from_raw_line(cls, line: Mapping[str, Any], call_index: int) -> ModelCallRecord:
        """Normalize one persisted line.

        Raises ValueError when the line is not a capture record at all (no string
        `model_call_id`); every other oddity becomes None fields, never an exception.
        """
        model_call_id = line.get("model_call_id")
        if not isinstance(model_call_id, str) or not model_call_id:
            raise ValueError("the line has no string model_call_id")
        request = line.get("request") if isinstance(line.get("request"), dict) else None
        response = line.get("response") if isinstance(line.get("response"), dict) else None
        dialect_name = _str(line.get("dialect"))
        dialect = DIALECTS.get(dialect_name) if dialect_name else None
        normalized = _normalize(dialect, response)
        usage = normalized.usage
        model_ref = line.get("model_ref")
        record = cls(
            model_call_id=model_call_id,
            response_id=normalized.response_id,
            call_index=call_index,
            model_ref=model_ref if isinstance(model_ref, dict) else None,
            model=normalized.model or (_str(request.get("model")) if request else None),
            dialect=dialect_name,
            provider=_str(line.get("provider")),
            status_code=_int(line.get("status_code")),
            response_status=normalized.response_status,
            finish_reason=normalized.finish_reason,
            finish_reason_normalized=normalized.finish_reason_normalized,
            error_category=_str(line.get("error_category")),
            started_at=_float(line.get("started_at")),
            completed_at=_float(line.get("completed_at")),
            latency_total_ms=_float(line.get("latency_ms")),
            latency_ttft_ms=_float(line.get("latency_ttft_ms")),
            tokens_in=usage.tokens_in,
            tokens_out=usage.tokens_out,
            tokens_reasoning=usage.tokens_reasoning,
            tokens_total=usage.tokens_total,
            cache_hit=None if usage.cached_tokens is None else usage.cached_tokens > 0,
            cached_tokens=usage.cached_tokens,
            cache_creation_tokens=usage.cache_creation_tokens,
            tool_calls=[call.as_dict() for call in normalized.tool_calls],
            hosted_tool_calls=[call.as_dict() for call in normalized.hosted_tool_calls],
            reasoning_content=normalized.reasoning_content,
            reasoning_redacted_blocks=normalized.reasoning_redacted_blocks,
            refusal=normalized.refusal,
            served_item_ids=list(normalized.served_item_ids),
            stream=line.get("stream") is True,
            stream_truncated=line.get("stream_truncated") is True,
            error=normalized.error,
            prompt_token_ids=normalized.prompt_token_ids,
            completion_token_ids=normalized.completion_token_ids,
            schema_version=_int(line.get("schema_version")) or 0,
            request=request,
            response=response,
            request_raw=_str(line.get("request_raw")),
            response_raw=_str(line.get("response_raw")),
        )
        return record

    def to_dict(self, *, include_payloads: bool = True) -> dict[str, Any]:
        """Return the record as JSON-able data, with or without the request/response payloads.

        Shallow: nested values (payloads, tool calls) are shared with the record, not copied, so
        serializing a rollout's records costs no deep copies. Treat the result as read-only.
        """
        names = RECORD_FIELDS if include_payloads else _FIELDS_WITHOUT_PAYLOADS
        return {name: getattr(self, name) for name in names}

    @property
    def is_error(self) -> bool:
        """True when the call has an error category."""
        return self.error_category is not None


def _normalize(dialect: Dialect | None, response: dict[str, Any] | None) -> Normalized:
    if dialect is None or response is None:
        return Normalized()
    try:
        return dialect.normalize(response)
    except Exception:  # a dialect bug must not make a stored record unreadable
        return Normalized()


RECORD_FIELDS = tuple(f.name for f in fields(ModelCallRecord))
_FIELDS_WITHOUT_PAYLOADS = tuple(name for name in RECORD_FIELDS if name not in PAYLOAD_FIELDS)

_SUMMED = ("tokens_in", "tokens_out", "tokens_reasoning", "tokens_total", "cached_tokens", "cache_creation_tokens")


def _percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an already sorted, non-empty list."""
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


def aggregate_metrics(records: Iterable[ModelCallRecord]) -> dict[str, Any]:
    """Sum a rollout's calls into the attachment's metrics.

    Sums include only known values; a sum is None when every value is unknown (null means
    unknown, never zero). `num_calls` counts failed calls too. `latency_total_ms` is the plain
    sum the spec defines (concurrent calls inflate it); `wall_clock_ms` is the span from the first
    start to the last end, and TTFT percentiles use nearest rank over the calls that reported one.
    """
    totals: dict[str, int | None] = dict.fromkeys(_SUMMED)
    latency_total: float | None = None
    ttfts: list[float] = []
    errors: dict[str, int] = {}
    first_start: float | None = None
    last_end: float | None = None
    num_calls = 0
    for record in records:
        num_calls += 1
        for name in _SUMMED:
            value = getattr(record, name)
            if value is not None:
                totals[name] = (totals[name] or 0) + value
        if record.latency_total_ms is not None:
            latency_total = (latency_total or 0.0) + record.latency_total_ms
        if record.latency_ttft_ms is not None:
            ttfts.append(record.latency_ttft_ms)
        if record.error_category is not None:
            errors[record.error_category] = errors.get(record.error_category, 0) + 1
        if record.started_at is not None:
            first_start = record.started_at if first_start is None else min(first_start, record.started_at)
        if record.completed_at is not None:
            last_end = record.completed_at if last_end is None else max(last_end, record.completed_at)
    ttfts.sort()
    wall_clock = None
    if first_start is not None and last_end is not None and last_end >= first_start:
        wall_clock = round((last_end - first_start) * 1000.0, 3)
    return {
        **totals,
        "latency_total_ms": None if latency_total is None else round(latency_total, 3),
        "num_calls": num_calls,
        "num_errors": sum(errors.values()),
        "errors_by_category": dict(sorted(errors.items())),
        "wall_clock_ms": wall_clock,
        "latency_ttft_ms_p50": _percentile(ttfts, 0.50) if ttfts else None,
        "latency_ttft_ms_p90": _percentile(ttfts, 0.90) if ttfts else None,
        "latency_ttft_ms_p99": _percentile(ttfts, 0.99) if ttfts else None,
    }


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
