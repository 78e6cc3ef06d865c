"""A deadline and a size bound on reading a request's head, which uvicorn does not have.

uvicorn's keep-alive timer guards only an idle connection between requests, and it is cancelled
by every byte that arrives: a client that sends its headers one byte a second (slowloris) holds
a connection, and its memory, for ever; httptools puts no bound on the head's size either. These
protocol classes wrap uvicorn's own: from the moment a connection opens, or the first byte of
each later request, the whole head must arrive within `HeaderGuard.timeout_s` and within
`HeaderGuard.max_head_bytes`, or the client gets a 408 (or 431) and the connection is closed.
Once the head is in, nothing here changes how the request is served.

The settings are class attributes because uvicorn builds a protocol by class (named by import
path, so `--workers` processes find it too); `configure_header_guard` sets them in each process.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["GuardedH11Protocol", "HeaderGuard", "configure_header_guard", "guarded_protocol_path"]

DEFAULT_HEADER_TIMEOUT_S = 30.0
DEFAULT_MAX_HEAD_BYTES = 64 * 1024


class HeaderGuard:
    """The guard's settings and its one hook: `on_refused(reason)` is called for each refused head."""

    timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    max_head_bytes: int = DEFAULT_MAX_HEAD_BYTES
    on_refused: Callable[[str], None] | None = None


def configure_header_guard(
    timeout_s: float, max_head_bytes: int, on_refused: Callable[[str], None] | None = None
) -> None:
    """Set the head deadline and size bound of every guarded connection this process accepts from now on."""
    HeaderGuard.timeout_s = timeout_s
    HeaderGuard.max_head_bytes = max_head_bytes
    HeaderGuard.on_refused = on_refused


_TIMEOUT_ANSWER = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_TOO_LARGE_ANSWER = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
)


class _GuardMixin:
    """Arms the head deadline while a connection waits for a request head; disarms it once the head is in."""

    # Provided by uvicorn's protocol classes.
    transport: asyncio.Transport
    cycle: Any
    loop: asyncio.AbstractEventLoop

    _head_timer: asyncio.TimerHandle | None = None
    _head_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm()

    def data_received(self, data: bytes) -> None:
        if not (self.cycle is None or self.cycle.response_complete):
            super().data_received(data)  # type: ignore[misc]
            return  # a request is being served: its body is not the guard's business
        if self._head_timer is None:
            self._arm()
        # Sized before it is parsed: what follows the blank line that ends the head is body.
        end = data.find(b"\r\n\r\n")
        self._head_bytes += len(data) if end < 0 else end + 4
        if self._head_bytes > HeaderGuard.max_head_bytes:
            self._refuse(_TOO_LARGE_ANSWER, "request_head_too_large")
            return
        before = self.cycle
        super().data_received(data)  # type: ignore[misc]
        if self.cycle is not before:  # the head is complete: the request is being served
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm(self) -> None:
        self._disarm()
        self._head_bytes = 0
        self._head_timer = self.loop.call_later(HeaderGuard.timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._head_bytes = 0

    def _timed_out(self) -> None:
        self._head_timer = None
        if self.cycle is None or self.cycle.response_complete:
            self._refuse(_TIMEOUT_ANSWER, "request_head_timeout")

    def _refuse(self, answer: bytes, reason: str) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(answer)
            self.transport.close()
        if HeaderGuard.on_refused is not None:
            HeaderGuard.on_refused(reason)


class GuardedH11Protocol(_GuardMixin, H11Protocol):  # type: ignore[misc]
    """uvicorn's h11 protocol with the head deadline and size bound."""


_HAS_HTTPTOOLS = importlib.util.find_spec("httptools") is not None

if _HAS_HTTPTOOLS:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedHttpToolsProtocol(_GuardMixin, HttpToolsProtocol):  # type: ignore[misc]
        """uvicorn's httptools protocol with the head deadline and size bound."""


def guarded_protocol_path() -> str:
    """The import path of the guarded protocol to serve with: httptools' when it is installed, else h11's."""
    name = "GuardedHttpToolsProtocol" if _HAS_HTTPTOOLS else "GuardedH11Protocol"
    return f"{__name__}:{name}"
