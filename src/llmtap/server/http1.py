"""A lean HTTP/1.1 client connection for the proxy: one request at a time, kept alive, parsed by httptools.

The proxy needs only this of an HTTP client: write a request it already has as bytes, then hand
back the status, the raw header lines and the body as it arrives, undecoded. A general client
(aiohttp) spent more of the proxy's CPU building a request than the capture did; this one writes
the request with one `write` and parses the answer with the C parser uvicorn itself uses.

A connection reads with flow control: when the proxy has not taken `HIGH_WATER` bytes yet, the
socket is paused, so a slow client slows the upstream instead of filling memory.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import httptools

from ..errors import UpstreamError

__all__ = [
    "HIGH_WATER",
    "Http1Connection",
    "Http1Response",
    "UpstreamClosed",
    "UpstreamProtocolError",
    "UpstreamReadTimeout",
]

# Unread body bytes past which the connection stops reading from its socket.
HIGH_WATER = 256 * 1024


class UpstreamClosed(UpstreamError, ConnectionError):
    """The upstream closed the connection before its response was complete."""


class UpstreamReadTimeout(UpstreamError, TimeoutError):
    """No byte came from the upstream for the read timeout while a response was awaited."""


class UpstreamProtocolError(UpstreamError):
    """The upstream's bytes are not a valid HTTP/1.1 response."""


class Http1Response:
    """One response as it arrives: status and raw headers once the head is in, then body pieces.

    `chunks()` yields what has arrived since the last piece, joined, so a burst of small reads is
    one piece (as aiohttp's `iter_any`); it raises `UpstreamClosed`, `UpstreamReadTimeout` or
    `UpstreamProtocolError` when the body cannot be completed.
    """

    __slots__ = ("status", "headers", "head_only", "bytes_seen", "_connection", "_pieces", "_buffered",
                 "_waiter", "_complete", "_error", "_head")

    def __init__(self, connection: Http1Connection, head_only: bool) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_only = head_only  # a HEAD request: the answer has no body whatever it declares
        self.bytes_seen = False
        self._connection = connection
        self._pieces: list[bytes] = []
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._complete = False
        self._error: BaseException | None = None
        self._head: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def complete(self) -> bool:
        """True once the whole body arrived (the connection may then serve another request)."""
        return self._complete

    async def head(self) -> None:
        """Wait for the status line and headers; raise what ended the connection before them."""
        await self._head

    async def chunks(self) -> AsyncIterator[bytes]:
        while True:
            if self._pieces:
                pieces, self._pieces = self._pieces, []
                self._buffered = 0
                self._connection.drained()
                yield pieces[0] if len(pieces) == 1 else b"".join(pieces)
            elif self._error is not None:
                raise self._error
            elif self._complete:
                return
            else:
                self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None

    # Called by the connection ----------------------------------------------------------------

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def head_arrived(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status, self.headers = status, headers
        if not self._head.done():
            self._head.set_result(None)

    def body_arrived(self, data: bytes) -> int:
        self._pieces.append(data)
        self._buffered += len(data)
        self._wake()
        return self._buffered

    def completed(self) -> None:
        self._complete = True
        self._wake()

    def failed(self, error: BaseException) -> None:
        if self._complete or self._error is not None:
            return
        self._error = error
        if not self._head.done():
            self._head.set_exception(error)
            self._head.exception()  # retrieved: a failed head is reported by `head()`, if awaited
        self._wake()


class Http1Connection(asyncio.Protocol):
    """One keep-alive connection to an upstream, carrying one request at a time."""

    def __init__(self, read_timeout_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._read_timeout_s = read_timeout_s
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._response: Http1Response | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._last_read = 0.0
        self._paused = False
        self._keep_alive = False
        self.closed = False
        self.idle_since = self._loop.time()

    # asyncio.Protocol -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        response = self._response
        if response is None or response.complete:  # bytes nobody asked for: the connection is not to be trusted
            self._keep_alive = False
            self.close()
            return
        response.bytes_seen = True
        self._last_read = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamProtocolError(f"the upstream sent a malformed HTTP response ({exc})"))
            self.close()

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost then settles the response

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timer()
        response = self._response
        if response is None:
            return
        if exc is None and response.status and not self._declares_length() and not response.complete:
            response.completed()  # a body delimited by the end of the connection: it ended (not reset)
            return
        closed = UpstreamClosed("the upstream closed the connection before the response was complete")
        closed.__cause__ = exc  # the reset, when the socket reported one
        self._fail(closed)

    # httptools callbacks ----------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        response = self._response
        assert response is not None
        status = self._parser.get_status_code()
        headers, self._headers = self._headers, []
        if 100 <= status < 200:
            return  # an interim answer (103 Early Hints): the real one follows
        self._keep_alive = self._parser.should_keep_alive()
        response.head_arrived(status, headers)
        if response.head_only:
            # llhttp does not know the request was HEAD and would wait for the declared body.
            self._keep_alive = False
            self._finish(response)

    def on_body(self, body: bytes) -> None:
        response = self._response
        if response is None:
            return
        if response.body_arrived(body) >= HIGH_WATER and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def on_message_complete(self) -> None:
        response = self._response
        if response is not None and response.status:
            self._finish(response)

    # The transport's side ---------------------------------------------------------------------

    def send(self, request: tuple[bytes, bytes], head_only: bool) -> Http1Response:
        """Write a whole request (head, body) and return its response, to be read as it comes."""
        assert self._transport is not None and self._response is None
        response = Http1Response(self, head_only)
        self._response = response
        self._last_read = self._loop.time()
        self._timer = self._loop.call_at(self._last_read + self._read_timeout_s, self._check_timeout)
        head, body = request
        self._transport.write(head)
        if body:
            self._transport.write(body)
        return response

    def drained(self) -> None:
        """The proxy took the buffered body: read from the socket again."""
        if self._paused and self._transport is not None and not self.closed:
            self._paused = False
            self._last_read = self._loop.time()  # a paused socket is not a silent upstream
            self._transport.resume_reading()

    def release(self) -> bool:
        """End the current exchange; True when the connection can carry another request."""
        response, self._response = self._response, None
        self._stop_timer()
        reusable = response is not None and response.complete and self._keep_alive and not self.closed
        if not reusable:
            self.close()
        self.idle_since = self._loop.time()
        return reusable

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    @property
    def usable(self) -> bool:
        return not self.closed and self._transport is not None and not self._transport.is_closing()

    # Internals ----------------------------------------------------------------------------------

    def _declares_length(self) -> bool:
        for name, value in self._response.headers if self._response else ():
            lowered = name.lower()
            if lowered == b"content-length" or (lowered == b"transfer-encoding" and b"chunked" in value.lower()):
                return True
        return False

    def _finish(self, response: Http1Response) -> None:
        self._stop_timer()
        response.completed()

    def _fail(self, error: BaseException) -> None:
        self._stop_timer()
        if self._response is not None:
            self._response.failed(error)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check_timeout(self) -> None:
        """Fire the read timeout, unless bytes came (or reading was paused) since it was set."""
        self._timer = None
        if self._response is None or self._response.complete:
            return
        now = self._loop.time()
        if self._paused or now - self._last_read < self._read_timeout_s:
            since = self._last_read if not self._paused else now
            self._timer = self._loop.call_at(since + self._read_timeout_s, self._check_timeout)
            return
        self._fail(UpstreamReadTimeout(f"no data from the upstream for {self._read_timeout_s:g} s"))
        self.close()
