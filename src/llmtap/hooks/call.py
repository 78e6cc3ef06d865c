"""One model call in flight: its Exchange, the capture it belongs to, and how it ended.

A hook opens a `CapturedCall` with `hooks.session.open_call`, tees the response into it, and
ends it once (`finish`, `afinish`, or `finish_unattended` from a garbage collector); the call
then goes to its capture's record sink. Nothing here raises into the workload: a failure inside
the hook drops this call's record and is counted.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ..exchange import safe_headers

if TYPE_CHECKING:
    from ..exchange import Exchange
    from .registry import EndpointMatch
    from .session import CaptureSession

__all__ = ["CapturedCall"]


class CapturedCall:
    """One model call in flight: its Exchange, the capture it belongs to, and how it ended."""

    # Headers are kept as the library gave them (a snapshot) and sanitized when the call is
    # handed over: by `prepare_record` on the writer's thread, or while building the spool frame
    # (which drops credential headers, cached per header name, before anything is written).
    __slots__ = (
        "session", "exchange", "match", "hook", "hook_state", "request_headers", "response_headers",
        "body_decoded", "_done", "__weakref__",
    )

    def __init__(
        self, session: CaptureSession, exchange: Exchange, match: EndpointMatch, hook: str, request_headers: Any
    ) -> None:
        self.session = session
        self.exchange = exchange
        self.match = match
        self.hook = hook
        self.hook_state: Any = None  # whatever the hook needs to know about its tee
        self.request_headers = request_headers
        self.response_headers: Any = None
        self.body_decoded = False
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def set_response(self, status: int, headers: Any, *, decoded: bool = False) -> None:
        """Note the status and a snapshot of the headers; `decoded`: the body is seen decompressed."""
        self.exchange.status_code = status
        self.response_headers = _snapshot(headers)
        self.body_decoded = self.body_decoded or decoded

    def mark_body_decoded(self) -> None:
        """The teed bytes are decompressed: `content-encoding` must not reach the record."""
        self.body_decoded = True

    def restart_response(self) -> None:
        """Forget a response seen so far (an intermediate redirect the library follows itself)."""
        exchange = self.exchange
        exchange.response_chunks.clear()
        exchange.first_byte_mono = None
        exchange.status_code = None
        self.response_headers = None
        self.body_decoded = False

    def prepare_record(self) -> None:
        """Put sanitized headers on the Exchange (on the writer's thread, before building the line)."""
        exchange = self.exchange
        exchange.request_headers = safe_headers(self.request_headers)
        exchange.response_headers = safe_headers(self.response_headers)
        if self.body_decoded:
            # The teed bytes were already decompressed: keep the header out so no reader tries
            # to decompress them again.
            encoding = exchange.response_headers.pop("content-encoding", None)
            if encoding is not None:
                exchange.extra["capture"]["content_encoding_removed"] = encoding

    def add_chunk(self, data: bytes) -> None:
        """Tee one chunk of the response body; never raises (a failure drops this call's record)."""
        if not data or self._done:
            return
        try:
            self.exchange.add_response_chunk(bytes(data))
        except Exception as exc:
            self._abandon(exc)

    def _abandon(self, exc: BaseException) -> None:
        """Stop recording this call after a failure inside the hook: counted, never raised."""
        lost = not self._done
        if lost:
            self._done = True
            self.session._call_ended()
        self.session.failure("hook_failed", self.hook, exc, call_lost=lost)

    def _end(self, how: str, exc: BaseException | None) -> bool:
        if self._done:
            return False
        self._done = True
        exchange = self.exchange
        exchange.finish()
        if exc is not None:
            if isinstance(exc, (KeyboardInterrupt, GeneratorExit)) or _is_cancellation(exc):
                exchange.cancelled = True
            else:
                exchange.exception = exc
        exchange.extra["capture"]["end"] = how
        self.session._call_ended()
        return True

    def finish(self, how: str, exc: BaseException | None = None) -> None:
        """End the call now (`eof`, `closed`, `error`, ...) and hand its record over; idempotent, never raises."""
        try:
            if self._end(how, exc):
                self.session.submit(self)
        except Exception as failure:
            self._abandon(failure)

    async def afinish(self, how: str, exc: BaseException | None = None) -> None:
        """Async twin of `finish`: in `call` durability it awaits the store without blocking the loop."""
        try:
            if self._end(how, exc):
                await self.session.submit_async(self)
        except Exception as failure:
            self._abandon(failure)

    def finish_unattended(self, how: str) -> None:
        """End the call from a garbage collector or an abandoned generator: queue it, never block."""
        try:
            if self._end(how, None):
                self.session.enqueue(self)
        except Exception as failure:
            self._abandon(failure)


def _snapshot(headers: Any) -> Any:
    """Copy headers cheaply (a list of pairs) so later changes by the library cannot leak in."""
    if headers is None:
        return None
    if isinstance(headers, list):
        return list(headers)
    items = getattr(headers, "items", None)
    return list(items()) if items is not None else list(headers)


def _is_cancellation(exc: BaseException) -> bool:
    asyncio = sys.modules.get("asyncio")  # not imported here: a sync workload never loads it
    return asyncio is not None and isinstance(exc, asyncio.CancelledError)
