"""One OpenTelemetry span per captured call: ids, times, GenAI attributes and optional content.

Spans are built directly as `ReadableSpan`s rather than through a `Tracer`: a tracer stamps the
current time and random ids, while an exported call must keep the times it was captured with and
ids derived from the store. The trace id is a hash of the rollout id, so every call of a rollout
lands in one trace whichever `llmtap serve` instance or export run sent it; the span id is a hash
of `model_call_id`, so sending a call twice gives the same span (collectors deduplicate or
overwrite it) instead of a second one.

Attributes come from the normalized `ModelCallRecord`; message content, only when asked for, comes
from the dialects' provider-neutral items (`export.genai.genai_messages`), written as the conventions' JSON
`gen_ai.input.messages` / `gen_ai.output.messages`. Unknown stays absent, never 0 or "".
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

import orjson
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from .. import __version__
from ..records import ModelCallRecord
from . import attributes as names
from .genai import finish_reasons, genai_messages, sampling_attributes

__all__ = [
    "content_capture_enabled",
    "default_resource",
    "genai_messages",
    "span_attributes",
    "span_for_record",
    "span_id_for_call",
    "span_weight",
    "trace_id_for_rollout",
]

# Fixed namespaces: changing one would move every exported call into new traces and spans.
_TRACE_NAMESPACE = b"llmtap/otel/trace/v1\x00"
_SPAN_NAMESPACE = b"llmtap/otel/span/v1\x00"
_OPERATION = "chat"  # the three dialects (Responses, Chat Completions, Messages) are all chat inference
# The API family a dialect speaks, when the capture point did not name a provider.
_DIALECT_PROVIDER = {"chat": "openai", "responses": "openai", "messages": "anthropic"}
_SCOPE = InstrumentationScope("llmtap", __version__, names.SCHEMA_URL)


def trace_id_for_rollout(rollout_id: str) -> int:
    """Return the 128-bit trace id of a rollout: the first 16 bytes of sha256(namespace + id)."""
    value = int.from_bytes(hashlib.sha256(_TRACE_NAMESPACE + rollout_id.encode("utf-8")).digest()[:16], "big")
    return value or 1  # an all-zero id is invalid in OpenTelemetry


def span_id_for_call(model_call_id: str) -> int:
    """Return the 64-bit span id of a call: the first 8 bytes of sha256(namespace + model_call_id)."""
    value = int.from_bytes(hashlib.sha256(_SPAN_NAMESPACE + model_call_id.encode("utf-8")).digest()[:8], "big")
    return value or 1


def content_capture_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """True when `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT` is `true` (any case)."""
    value = (os.environ if environ is None else environ).get(names.CONTENT_SWITCH_ENV, "")
    return value.strip().lower() == "true"


def default_resource() -> Resource:
    """The resource of exported spans: the standard `OTEL_RESOURCE_ATTRIBUTES` / `OTEL_SERVICE_NAME`,
    with `service.name` "llmtap" when neither names a service."""
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "llmtap"}))
    return resource


def span_for_record(
    record: ModelCallRecord,
    rollout_id: str,
    *,
    resource: Resource,
    content: bool = False,
) -> ReadableSpan | None:
    """Build the span of one call, or None when the record has no start or end time to place it."""
    start = record.started_at
    end = record.completed_at
    if end is None and start is not None and record.latency_total_ms is not None:
        end = start + record.latency_total_ms / 1000.0
    if start is None or end is None:
        return None
    context = SpanContext(
        trace_id=trace_id_for_rollout(rollout_id),
        span_id=span_id_for_call(record.model_call_id),
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    if record.error_category is not None:
        status = Status(StatusCode.ERROR, record.error_category)
    else:
        status = Status(StatusCode.UNSET)
    model = _request_model(record) or record.model
    return ReadableSpan(
        name=f"{_OPERATION} {model}" if model else _OPERATION,
        context=context,
        parent=None,
        resource=resource,
        attributes=span_attributes(record, rollout_id, content=content),
        kind=SpanKind.CLIENT,
        status=status,
        start_time=_nanoseconds(start),
        end_time=max(_nanoseconds(end), _nanoseconds(start)),
        instrumentation_scope=_SCOPE,
    )


def span_weight(span: ReadableSpan) -> int:
    """About how many bytes a span adds to an export request: its content attributes dominate."""
    attributes = span.attributes or {}
    weight = 1024
    for name in (names.INPUT_MESSAGES, names.OUTPUT_MESSAGES):
        value = attributes.get(name)
        if isinstance(value, str):
            weight += len(value)
    return weight


def span_attributes(record: ModelCallRecord, rollout_id: str, *, content: bool = False) -> dict[str, Any]:
    """Return the span attributes of one call (OpenTelemetry attribute values only)."""
    attributes: dict[str, Any] = {
        names.OPERATION_NAME: _OPERATION,
        names.PROVIDER_NAME: record.provider or _DIALECT_PROVIDER.get(record.dialect or "", "unknown"),
        names.ROLLOUT_ID: rollout_id,
        names.MODEL_CALL_ID: record.model_call_id,
        names.STREAM: record.stream,
    }
    if record.call_index >= 0:  # a call exported live, before any reader numbered it, has none
        attributes[names.CALL_INDEX] = record.call_index
    _set(attributes, names.DIALECT, record.dialect)
    _set(attributes, names.REQUEST_MODEL, _request_model(record))
    if record.request is not None:
        _request_sampling(record.request, attributes)
    _set(attributes, names.RESPONSE_ID, record.response_id)
    _set(attributes, names.RESPONSE_MODEL, _response_model(record))
    reasons = finish_reasons(record)
    if reasons is not None:
        attributes[names.RESPONSE_FINISH_REASONS] = reasons
    _set(attributes, names.USAGE_INPUT_TOKENS, record.tokens_in)
    _set(attributes, names.USAGE_OUTPUT_TOKENS, record.tokens_out)
    _set(attributes, names.USAGE_CACHE_READ_INPUT_TOKENS, record.cached_tokens)
    _set(attributes, names.USAGE_CACHE_CREATION_INPUT_TOKENS, record.cache_creation_tokens)
    _set(attributes, names.USAGE_REASONING_OUTPUT_TOKENS, record.tokens_reasoning)
    _set(attributes, names.HTTP_RESPONSE_STATUS_CODE, record.status_code)
    _set(attributes, names.TTFT_MS, record.latency_ttft_ms)
    if record.error_category is not None:
        attributes[names.ERROR_TYPE] = record.error_category
        attributes[names.ERROR_CATEGORY] = record.error_category
    if content:
        inputs, outputs = genai_messages(record)
        if inputs:
            attributes[names.INPUT_MESSAGES] = _json(inputs)
        if outputs:
            attributes[names.OUTPUT_MESSAGES] = _json(outputs)
    return attributes


def _request_model(record: ModelCallRecord) -> str | None:
    # Every dialect names the requested model in the request's top-level `model`.
    model = record.request.get("model") if record.request is not None else None
    return model if isinstance(model, str) and model else None


def _response_model(record: ModelCallRecord) -> str | None:
    model = record.response.get("model") if record.response is not None else None
    return model if isinstance(model, str) and model else None


def _request_sampling(request: Mapping[str, Any], attributes: dict[str, Any]) -> None:
    """The request's sampling attributes, read by the GenAI projection in export/genai.py (one reader of them)."""
    found = sampling_attributes(request)
    for name in names.SAMPLING_ATTRIBUTES:
        if name in found:
            attributes[name] = found[name]


def _set(attributes: dict[str, Any], name: str, value: Any) -> None:
    if value is not None:
        attributes[name] = value


def _json(value: Any) -> str:
    return orjson.dumps(value, default=str).decode("utf-8")


def _nanoseconds(seconds: float) -> int:
    return round(seconds * 1_000_000_000)
