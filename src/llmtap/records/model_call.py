"""ModelCallRecord: one persisted line normalized, what consumers read instead of provider JSON."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..dialects import DIALECTS, Dialect, Normalized

__all__ = ["PAYLOAD_FIELDS", "RECORD_FIELDS", "ModelCallRecord"]

PAYLOAD_FIELDS = ("request", "response", "request_raw", "response_raw")


# Every key llmtap's own lines hold (records/line.py and the capture points' `Exchange.extra`):
# a key outside this set is kept in `ModelCallRecord.extra`.
_LINE_FIELDS = frozenset(
    {
        "schema_version",
        "model_call_id",
        "dialect",
        "model_ref",
        "started_at",
        "completed_at",
        "latency_ms",
        "latency_ttft_ms",
        "status_code",
        "error_category",
        "request",
        "response",
        "request_raw",
        "response_raw",
        "request_raw_base64",
        "response_raw_base64",
        "response_decoding",
        "response_body_crc32",
        "stream",
        "stream_truncated",
        "response_chunks",
        "exception_type",
        "rollout_id",
        "provider",
        "sampling",
        "http",
        "continuation_fingerprint",
        "fingerprint_version",
        "capture",
        "operation",
        "server",
        "rejected",
    }
)


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
    them out for rollout attachments. `continuation_fingerprint` is the call's stored content
    fingerprint (with `fingerprint_version`, see records/fingerprint.py); `extra` keeps the
    line's fields llmtap does not read (the reference system's `client_session_id`,
    `upstream_attempted`, ...), so reading a line never drops what its writer recorded.
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
    continuation_fingerprint: str | None = None
    fingerprint_version: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
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
        error_category = _str(line.get("error_category"))
        stream = line.get("stream") is True
        stream_truncated = line.get("stream_truncated") is True
        if "schema_version" not in line and error_category == "stream_truncated":
            # The reference system's store writes no stream flags; its category says both.
            stream = stream_truncated = True
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
            error_category=error_category,
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
            stream=stream,
            stream_truncated=stream_truncated,
            error=normalized.error,
            prompt_token_ids=normalized.prompt_token_ids,
            completion_token_ids=normalized.completion_token_ids,
            schema_version=_int(line.get("schema_version")) or 0,
            continuation_fingerprint=_str(line.get("continuation_fingerprint")),
            fingerprint_version=_int(line.get("fingerprint_version")),
            extra={key: value for key, value in line.items() if key not in _LINE_FIELDS},
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
