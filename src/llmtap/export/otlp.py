"""`llmtap export otlp`: send every call of a capture directory or capsule to an OTLP/HTTP collector.

One span per call (see `spans`), sent in bounded batches through the official OTLP/HTTP protobuf
exporter, which reads the standard `OTEL_EXPORTER_OTLP_*` variables (endpoint, headers, timeout,
compression, certificates). The export stops at the first batch the collector refuses or cannot
take, and says how far it got: ids are derived from the store, so running it again is safe and
spans already sent are replaced, not doubled.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from .sources import ExportError, open_source
from .spans import content_capture_enabled, default_resource, span_for_record, span_weight

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = ["DEFAULT_BATCH_SIZE", "OtlpReport", "export_otlp", "span_exporter", "traces_endpoint"]

DEFAULT_BATCH_SIZE = 512  # the SDK's BatchSpanProcessor default: what collectors are sized for
MAX_BATCH_SIZE = 10_000
# Message content can make spans large; a request stays well under the collector's usual 20 MiB limit.
MAX_BATCH_BYTES = 8 << 20
_TRACES_PATH = "/v1/traces"


@dataclass
class OtlpReport:
    """What one export run did."""

    rollouts: int = 0
    calls: int = 0
    exported: int = 0
    failed: int = 0
    not_sent: int = 0
    skipped_no_time: int = 0
    unreadable_lines: int = 0
    batches: int = 0
    endpoint: str = ""
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every span was accepted."""
        return self.failed == 0 and self.not_sent == 0


def traces_endpoint(endpoint: str | None) -> str | None:
    """Return the traces URL for `--endpoint`: a base URL gets `/v1/traces`, a full one is kept.

    None leaves the choice to the standard variables (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, or
    `OTEL_EXPORTER_OTLP_ENDPOINT` plus `/v1/traces`, else http://localhost:4318/v1/traces).
    """
    if endpoint is None:
        return None
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ExportError(f"The OTLP endpoint {endpoint!r} is not an http(s) URL; give one like http://collector:4318.")
    if parts.path in ("", "/"):
        return endpoint.rstrip("/") + _TRACES_PATH
    return endpoint


def span_exporter(endpoint: str | None = None, *, timeout: float | None = None) -> SpanExporter:
    """The official OTLP/HTTP protobuf span exporter for `endpoint` (see `traces_endpoint`)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=traces_endpoint(endpoint), timeout=timeout)


def export_otlp(
    path: str | os.PathLike[str],
    *,
    endpoint: str | None = None,
    content: bool | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    timeout: float | None = None,
    exporter: SpanExporter | None = None,
    progress: Callable[[OtlpReport], None] | None = None,
) -> OtlpReport:
    """Send one span per call under `path` to an OTLP/HTTP collector and report the counts.

    Batches hold at most `batch_size` spans and about `MAX_BATCH_BYTES` of message content.
    `content=None` follows `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`. Stops at the first
    batch that fails (`report.failed` spans in it, `report.not_sent` after it). Raises ExportError
    for a path that is not a capture directory or capsule, or a bad endpoint.

    Usage::

        report = export_otlp("/abs/model-calls", endpoint="http://127.0.0.1:4318")
        assert report.ok, report.errors
    """
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ExportError(f"The batch size {batch_size} is out of range; use 1 to {MAX_BATCH_SIZE}.")
    source = open_source(path)
    with_content = content_capture_enabled() if content is None else content
    own_exporter = exporter is None
    exporter = exporter or span_exporter(endpoint, timeout=timeout)
    report = OtlpReport(endpoint=getattr(exporter, "_endpoint", endpoint or ""))
    resource = default_resource()
    batch: list[ReadableSpan] = []
    weight = 0
    try:
        for calls in source.each_rollout():
            report.rollouts += 1
            report.unreadable_lines += len(calls.unreadable_lines)
            for record in calls.records:
                report.calls += 1
                if report.failed:
                    report.not_sent += 1
                    continue
                span = span_for_record(record, calls.rollout_id, resource=resource, content=with_content)
                if span is None:
                    report.skipped_no_time += 1
                    continue
                batch.append(span)
                weight += span_weight(span)
                if len(batch) >= batch_size or weight >= MAX_BATCH_BYTES:
                    _send(exporter, batch, report)
                    batch, weight = [], 0
                    if progress is not None:
                        progress(report)
        if batch and not report.failed:
            _send(exporter, batch, report)
    finally:
        if own_exporter:
            exporter.shutdown()
    return report


def _send(exporter: SpanExporter, batch: Sequence[ReadableSpan], report: OtlpReport) -> None:
    from opentelemetry.sdk.trace.export import SpanExportResult

    report.batches += 1
    try:
        result = exporter.export(batch)
    except Exception as exc:  # the exporter catches its own; anything else is a failed batch too
        result = SpanExportResult.FAILURE
        report.errors.append(f"the exporter raised {type(exc).__name__}")
    if result is SpanExportResult.SUCCESS:
        report.exported += len(batch)
    else:
        report.failed += len(batch)
        report.errors.append(f"batch {report.batches} of {len(batch)} spans was not accepted by the collector")
