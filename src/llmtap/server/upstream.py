"""The proxy's one seam to an upstream: send a request, get status, headers and raw body chunks.

`UpstreamTransport` is the narrow protocol (like an httpx transport): tests and benchmarks can
pass another implementation to `ProxyApp` without patching. The default, `AiohttpTransport`,
keeps a keep-alive pool per upstream. It is aiohttp rather than httpx because httpcore's pool
walks every pooled connection on each request and release (quadratic in the pool size; see
docs/benchmarks.md): at 128 concurrent calls that bookkeeping, not the network, bounded the proxy.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator, Protocol

import aiohttp
import yarl

__all__ = ["AiohttpTransport", "UpstreamResponse", "UpstreamTransport", "UpstreamUnreachable"]


class UpstreamUnreachable(Exception):
    """Raised by a transport when no response came back: refused, unresolvable, or timed out."""

    def __init__(self, cause: BaseException, *, timed_out: bool) -> None:
        super().__init__(type(cause).__name__)
        self.cause = cause
        self.timed_out = timed_out


class UpstreamResponse(Protocol):
    """An upstream's answer: its status and raw headers at once, its body as it arrives."""

    status: int
    headers: list[tuple[bytes, bytes]]

    def chunks(self) -> AsyncIterator[bytes]:
        """The body exactly as sent on the wire (no decompression), chunk by chunk."""
        ...

    async def aclose(self) -> None:
        """Release the connection (back to the pool when the body was read whole)."""
        ...


class UpstreamTransport(Protocol):
    """Sends one request upstream. The caller must `aclose()` the response it gets."""

    async def send(
        self, method: str, url: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> UpstreamResponse: ...

    async def aclose(self) -> None: ...


@dataclass
class _AiohttpResponse:
    response: aiohttp.ClientResponse
    status: int
    headers: list[tuple[bytes, bytes]]

    async def chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self.response.content.iter_any():
            if chunk:
                yield chunk

    async def aclose(self) -> None:
        self.response.release()


# How soon after sending a dropped connection means a stale pooled one, not an upstream failing
# while it worked on the request (see `AiohttpTransport.send`).
STALE_RETRY_SECONDS = 1.0

# aiohttp would otherwise add these of its own accord; the proxy sends only what the client sent.
_NO_AUTO_HEADERS = ("User-Agent", "Accept-Encoding", "Accept", "Content-Type")


class AiohttpTransport:
    """A pooled keep-alive transport to one upstream, created lazily inside the serving loop."""

    def __init__(self, *, max_connections: int, connect_timeout_s: float, read_timeout_s: float) -> None:
        self._max_connections = max_connections
        # `sock_read` bounds each wait for bytes, so a stalled stream fails while a long healthy
        # one does not; there is no total limit on a call.
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=read_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=60),
                timeout=self._timeout,
                auto_decompress=False,
                skip_auto_headers=_NO_AUTO_HEADERS,
                trust_env=False,
                # One pool serves every client: a cookie one upstream answer sets must reach that
                # client only, never ride along on the next caller's request.
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def send(self, method: str, url: str, headers: list[tuple[bytes, bytes]], body: bytes) -> UpstreamResponse:
        """Send the request; raise `UpstreamUnreachable` when no response head came back.

        A request whose connection drops within `STALE_RETRY_SECONDS` of sending, before any byte
        of an answer, is sent once more on a new connection. That is how a pooled connection ends
        when the upstream closed it as idle just as it was reused (uvicorn, behind vLLM and
        llama.cpp's server, closes idle connections after 5 s): the request never ran. aiohttp
        itself retries only idempotent methods, and model calls are POSTs.
        """
        text_headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers]
        target = yarl.URL(url, encoded=True)  # sent as given, not normalized (`%7E` stays `%7E`)
        session = self._open()
        loop = asyncio.get_running_loop()
        for is_retry in (False, True):
            sent_at = loop.time()
            try:
                response = await session.request(
                    method, target, headers=text_headers, data=body, allow_redirects=False, compress=None
                )
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                connected = not isinstance(exc, aiohttp.ClientConnectorError)  # it never connected: no retry
                if connected and not is_retry and loop.time() - sent_at < STALE_RETRY_SECONDS:
                    continue
                raise UpstreamUnreachable(exc, timed_out=False) from exc
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                raise UpstreamUnreachable(exc, timed_out=isinstance(exc, asyncio.TimeoutError)) from exc
            break
        return _AiohttpResponse(response, response.status, list(response.raw_headers))

    async def aclose(self) -> None:
        """Close the pool; a later `send` opens a new one."""
        if self._session is not None:
            await self._session.close()
            self._session = None
