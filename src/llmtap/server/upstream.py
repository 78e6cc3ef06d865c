"""The proxy's one seam to an upstream: send a request, get status, headers and raw body chunks.

`UpstreamTransport` is the narrow protocol (like an httpx transport): tests and benchmarks can
pass another implementation to `ProxyApp` without patching. The default, `Http1Transport`,
keeps a keep-alive pool per upstream of `http1.Http1Connection`s. It is neither httpx nor
aiohttp: httpcore's pool walks every pooled connection on each request and release (quadratic in
the pool size), and aiohttp's request building cost more than capture (docs/benchmarks.md). The
proxy has its request as bytes already and wants the answer undecoded.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections import deque
from dataclasses import dataclass
from typing import AsyncIterator, Protocol
from urllib.parse import unquote, urlsplit

from ..errors import UpstreamError
from .http1 import Http1Connection, Http1Response, UpstreamClosed, UpstreamProtocolError, UpstreamReadTimeout

__all__ = ["Http1Transport", "UpstreamResponse", "UpstreamTransport", "UpstreamUnreachable"]


class UpstreamUnreachable(UpstreamError):
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


# How soon after sending a dropped connection means a stale pooled one, not an upstream failing
# while it worked on the request (see `Http1Transport.send`).
STALE_RETRY_SECONDS = 1.0

# Methods whose requests carry no body unless one is given: no `content-length: 0` is added.
_BODYLESS_METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS", "TRACE"})


@dataclass(frozen=True, slots=True)
class _Origin:
    """Where a URL's requests go: the connection's address and the request line's parts."""

    host: str
    port: int
    ssl: ssl.SSLContext | None
    host_header: bytes
    prefix_length: int  # characters of `scheme://authority` before the request target
    basic_auth: bytes | None  # `user:password@` in the URL, sent as Basic credentials

    @classmethod
    def of(cls, url: str) -> _Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream URL {url!r} must be http:// or https:// with a host")
        secure = parts.scheme == "https"
        port = parts.port or (443 if secure else 80)
        authority = parts.netloc.rpartition("@")[2]  # the config encoded it: an IDNA host is ASCII already
        if parts.port is not None and parts.port == (443 if secure else 80):
            authority = authority.rsplit(":", 1)[0]
        host_header = authority.encode("ascii")
        context = ssl.create_default_context() if secure else None
        basic_auth = None
        if parts.username is not None:
            user_pass = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            basic_auth = b"Basic " + base64.b64encode(user_pass)
        return cls(parts.hostname, port, context, host_header, len(parts.scheme) + 3 + len(parts.netloc), basic_auth)


class _Pool:
    """The open connections to one origin: idle ones reused last-in first-out, at most `limit` in all."""

    def __init__(self, origin: _Origin, limit: int) -> None:
        self.origin = origin
        self.limit = limit
        self.idle: list[Http1Connection] = []
        self.open = 0
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.closed = False  # the transport was closed: connections coming back are closed too

    def take_idle(self, keepalive_s: float, now: float) -> Http1Connection | None:
        while self.idle:
            connection = self.idle.pop()
            if connection.usable and now - connection.idle_since < keepalive_s:
                return connection
            self.discard(connection)
        return None

    def give_back(self, connection: Http1Connection, reusable: bool) -> None:
        if reusable and not self.closed:
            self.idle.append(connection)
            self.wake_one()
        else:
            self.discard(connection)

    def discard(self, connection: Http1Connection) -> None:
        connection.close()
        self.open -= 1
        self.wake_one()

    def wake_one(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


class _PooledResponse:
    """An upstream response whose connection goes back to its pool when closed."""

    __slots__ = ("status", "headers", "_response", "_connection", "_pool", "_closed")

    def __init__(self, response: Http1Response, connection: Http1Connection, pool: _Pool) -> None:
        self.status = response.status
        self.headers = response.headers
        self._response = response
        self._connection = connection
        self._pool = pool
        self._closed = False

    def chunks(self) -> AsyncIterator[bytes]:
        return self._response.chunks()

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool.give_back(self._connection, self._connection.release())


class Http1Transport:
    """A keep-alive HTTP/1.1 pool to one upstream (`http1.Http1Connection`s), opened lazily in the loop.

    Requests go as written: the target exactly as given (no normalizing, `%7E` stays `%7E`), the
    caller's headers plus `host` and `content-length`, nothing else added; bodies come back as
    sent on the wire, compressed or not. Timeouts: `connect_timeout_s` to open a connection,
    `read_timeout_s` for each wait for bytes, so a stalled stream fails while a long healthy one
    does not. Idle connections are closed after `keepalive_s`.
    """

    def __init__(
        self, *, max_connections: int, connect_timeout_s: float, read_timeout_s: float, keepalive_s: float = 60.0
    ) -> None:
        self._max_connections = max_connections
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._keepalive_s = keepalive_s
        self._pools: dict[str, _Pool] = {}

    async def send(self, method: str, url: str, headers: list[tuple[bytes, bytes]], body: bytes) -> UpstreamResponse:
        """Send the request; raise `UpstreamUnreachable` when no response head came back.

        A request whose pooled connection drops within `STALE_RETRY_SECONDS` of sending, before
        any byte of an answer, is sent once more on a new connection. That is how a pooled
        connection ends when the upstream closed it as idle just as it was reused (uvicorn, behind
        vLLM and llama.cpp's server, closes idle connections after 5 s): the request never ran.
        A connection that could not be opened is not retried.
        """
        pool = self._pool_for(url)
        target = url[pool.origin.prefix_length :]
        if not target.startswith("/"):
            target = "/" + target  # `http://host` or `http://host?query`
        request = self._request_bytes(method, target, pool.origin, headers, body)
        loop = asyncio.get_running_loop()
        fresh_only = False
        while True:
            connection, reused = await self._connection(pool, fresh_only)
            sent_at = loop.time()
            response = connection.send(request, method == "HEAD")
            try:
                await response.head()
            except (UpstreamReadTimeout, UpstreamProtocolError) as exc:  # (a TimeoutError is an OSError)
                pool.give_back(connection, connection.release())
                raise UpstreamUnreachable(exc, timed_out=isinstance(exc, TimeoutError)) from exc
            except (UpstreamClosed, OSError) as exc:
                pool.give_back(connection, connection.release())
                stale = reused and not response.bytes_seen and loop.time() - sent_at < STALE_RETRY_SECONDS
                if stale and not fresh_only:
                    fresh_only = True
                    continue
                raise UpstreamUnreachable(exc, timed_out=False) from exc
            except BaseException:
                pool.give_back(connection, connection.release())  # cancelled: the connection is mid-request
                raise
            return _PooledResponse(response, connection, pool)

    async def aclose(self) -> None:
        """Close every pooled connection; a later `send` opens new ones."""
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.closed = True
            for connection in pool.idle:
                connection.close()
            pool.idle.clear()

    def _pool_for(self, url: str) -> _Pool:
        start = url.find("://") + 3
        ends = [end for end in (url.find("/", start), url.find("?", start)) if end >= 0]
        key = url[: min(ends)] if ends else url
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool(_Origin.of(key), self._max_connections)
        return pool

    async def _connection(self, pool: _Pool, fresh_only: bool) -> tuple[Http1Connection, bool]:
        loop = asyncio.get_running_loop()
        while True:
            if not fresh_only:
                idle = pool.take_idle(self._keepalive_s, loop.time())
                if idle is not None:
                    return idle, True
            if pool.open < pool.limit:
                pool.open += 1
                try:
                    return await self._open(pool), False
                except BaseException:
                    pool.open -= 1
                    pool.wake_one()
                    raise
            waiter = loop.create_future()
            pool.waiters.append(waiter)
            await waiter

    async def _open(self, pool: _Pool) -> Http1Connection:
        origin = pool.origin
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, connection = await loop.create_connection(
                    lambda: Http1Connection(self._read_timeout_s), origin.host, origin.port,
                    ssl=origin.ssl, server_hostname=origin.host if origin.ssl else None,
                )
        except TimeoutError as exc:
            raise UpstreamUnreachable(exc, timed_out=True) from exc
        except OSError as exc:
            raise UpstreamUnreachable(exc, timed_out=False) from exc
        return connection

    @staticmethod
    def _request_bytes(
        method: str, target: str, origin: _Origin, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> tuple[bytes, bytes]:
        """The request's head and its body, apart: joined, a large body would be copied once more."""
        parts = [method.encode("ascii"), b" ", target.encode("latin-1"), b" HTTP/1.1\r\nhost: ", origin.host_header, b"\r\n"]
        for name, value in headers:
            if b"\r" in value or b"\n" in value or b"\r" in name or b"\n" in name:
                raise UpstreamUnreachable(ValueError(f"header {name!r} holds a line break"), timed_out=False)
            parts += (name, b": ", value, b"\r\n")
        if origin.basic_auth is not None and not any(name.lower() == b"authorization" for name, _ in headers):
            parts += (b"authorization: ", origin.basic_auth, b"\r\n")
        if body or method not in _BODYLESS_METHODS:
            parts += (b"content-length: ", str(len(body)).encode("ascii"), b"\r\n")
        parts.append(b"\r\n")
        return b"".join(parts), body
