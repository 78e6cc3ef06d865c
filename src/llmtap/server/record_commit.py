"""Making a captured call's record durable, then telling its observers: serve's metrics and live OTLP export.

`RecordCommitter.commit` builds the persisted line (on the loop when small, on a record-builder
thread when large), optionally redacts it (`redact: true`), appends it to the store and awaits
its fsync. Only then is the call counted in the metrics and handed to the live exporter, so a
span or a counter never describes a record that is not on disk. A failure anywhere is counted
(health and metrics together) and never raised into the call.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import orjson

from ..exchange import Exchange
from ..health import CaptureHealth
from ..records import StreamTracker, raw_line_from_exchange
from ..records.line import encode_line
from ..store import CaptureStore

if TYPE_CHECKING:
    from ..dialects import Dialect
    from ..export.live import LiveExporter
    from ..export.prometheus import ServeMetrics

__all__ = ["RecordCommitter"]

# Past this many body bytes (request and response), or when a compressed response decodes to
# more than this, a record is built on a helper thread: parsing or decoding it there would hold
# every other call up. A few compressed bytes can decode to the whole limit, so a compressed body
# is first decoded on the loop only this far.
_OFFLOAD_BYTES = 1024 * 1024

# Two threads at most: a bound on how many large records are decoded in memory at once.
_RECORD_BUILDERS: ThreadPoolExecutor | None = None


def _record_builders() -> ThreadPoolExecutor:
    global _RECORD_BUILDERS
    if _RECORD_BUILDERS is None:
        _RECORD_BUILDERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="llmtap-record")
    return _RECORD_BUILDERS


class RecordCommitter:
    """Commits the records of one middleware's calls; settled once, shared by every call."""

    def __init__(
        self,
        store: CaptureStore,
        health: CaptureHealth,
        *,
        max_decoded_body_bytes: int,
        metrics: ServeMetrics | None = None,
        live_export: LiveExporter | None = None,
        redact: bool = False,
    ) -> None:
        self.store = store
        self.health = health
        self.max_decoded_body_bytes = max_decoded_body_bytes
        self.metrics = metrics
        self.live_export = live_export
        self.redact = redact

    async def commit(
        self,
        exchange: Exchange,
        dialect: Dialect,
        tracker: StreamTracker | None,
        body_length: int,
        *,
        alone: bool,
    ) -> None:
        """Build and durably store the record of a finished call; a failure is counted and never raised."""
        store, metrics = self.store, self.metrics
        assert exchange.rollout_id is not None
        record_bytes = None
        try:
            line = self._build_line_here(exchange, dialect, tracker, body_length)
            if line is None:
                line = await self._build_line_off_loop(exchange, dialect, tracker)
            encoded = encode_line(line)  # also the depth check the line was built without
            if encoded is None:  # a body nested too deep (or a line that is no JSON): built again, checked
                line = await self._build_line_off_loop(exchange, dialect, tracker, check_depth=True)
                encoded = encode_line(line)
            if self.redact:
                line, encoded = self._redacted(line, encoded)
                record_bytes = len(encoded) if encoded is not None else None
        except Exception as exc:
            self.health.failure("record_build_failed", "asgi", exc)
            if metrics is not None:
                metrics.observe_capture_failure("record_build_failed")
            store.mark_incomplete(exchange.rollout_id, "record_build_failed")
            return
        handed_over = time.perf_counter()
        try:
            await store.append_async(exchange.rollout_id, line, alone=alone, encoded=encoded)
        except Exception as exc:
            self.health.failure("record_write_failed", "asgi", exc)
            if metrics is not None:
                metrics.observe_capture_failure("record_write_failed")
            return
        synced = time.perf_counter() - handed_over
        self.health.observe_sync(synced)
        self.health.count("records_written")
        if metrics is not None:
            latency_ms = line["latency_ms"]
            latency = latency_ms / 1000 if latency_ms is not None else None
            if record_bytes is None:
                metrics.observe_commit(line["dialect"], line["status_code"], line["error_category"], latency, synced)
            else:
                metrics.observe_call(
                    line["dialect"], line["status_code"], line["error_category"],
                    latency_seconds=latency, record_bytes=record_bytes,
                )
                metrics.observe_sync_latency(synced)
        if self.live_export is not None:
            self.live_export.submit(line, exchange.rollout_id)

    def _redacted(self, line: dict[str, Any], encoded: bytes | None) -> tuple[dict[str, Any], bytes | None]:
        """The line with every secret the scanner finds replaced, and its encoding.

        The scanner reads the encoded line. With no secret (the common case) both go on as they
        were; a line that changed is parsed back, for the observers, and the store writes exactly
        the redacted bytes. A line that could not be encoded goes on to the store, which reports it.
        """
        from ..trust.redaction import redact_record_line

        if encoded is None:
            return line, None
        redacted = redact_record_line(encoded)  # each secret becomes a marker naming its rule
        if redacted is encoded:
            return line, encoded
        self.health.count("records_redacted")
        parsed: dict[str, Any] = orjson.loads(redacted)
        return parsed, redacted

    def _build_line_here(
        self, exchange: Exchange, dialect: Dialect, tracker: StreamTracker | None, body_length: int
    ) -> dict[str, Any] | None:
        """Build the record on the loop when it is small; None when it must be built off the loop."""
        exchange.finish()  # the call ended now, not when a helper thread gets to it
        if len(exchange.request_body) + body_length >= _OFFLOAD_BYTES:
            return None
        limit = self.max_decoded_body_bytes
        inline_limit = limit if limit < _OFFLOAD_BYTES else _OFFLOAD_BYTES
        line = raw_line_from_exchange(
            exchange, dialect=dialect, tracker=tracker, max_decoded_bytes=inline_limit, check_depth=False
        )
        gap = line.get("response_decoding")
        if gap is not None and inline_limit < limit and gap["reason"] == "decoded_size_limit":
            return None  # a small compressed body that decodes past a MiB: decoded again, in full, off the loop
        return line

    async def _build_line_off_loop(
        self, exchange: Exchange, dialect: Dialect, tracker: StreamTracker | None, *, check_depth: bool = False
    ) -> dict[str, Any]:
        """Build the record on a record-builder thread (large bodies, a compressed one that grows,
        or a line whose encode failed, built again with its bodies' depth checked)."""
        limit = self.max_decoded_body_bytes
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            _record_builders(),
            lambda: raw_line_from_exchange(
                exchange, dialect=dialect, tracker=tracker, max_decoded_bytes=limit, check_depth=check_depth
            ),
        )
