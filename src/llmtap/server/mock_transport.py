"""An upstream transport that answers from a handler function, for tests and benchmarks.

`MockTransport` is one more `UpstreamTransport`, like httpx's: pass it to `build_app(config,
transport=...)` and every request the proxy would send upstream goes to the handler instead,
with the URL, headers and body exactly as the proxy built them. The handler returns a
`MockResponse`, whose body is bytes or chunks (a list, or an async iterator that can wait between
chunks), handed to the proxy one chunk at a time as a real upstream's would be; or it raises
`UpstreamUnreachable`, which the proxy answers as for a refused or timed-out upstream.

Usage::

    def answer(request: MockRequest) -> MockResponse:
        return MockResponse(200, [(b"content-type", b"text/event-stream")], [b"data: 1\\n\\n", b"data: [DONE]\\n\\n"])

    transport = MockTransport(answer)
    app = build_app(config, transport=transport)
    ...
    assert transport.requests[0].url == "http://127.0.0.1:8000/v1/chat/completions"
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from .upstream import UpstreamResponse

__all__ = ["MockHandler", "MockRequest", "MockResponse", "MockTransport"]


@dataclass(frozen=True, slots=True)
class MockRequest:
    """One request as the proxy sent it: method, full URL, headers in order (credential included), body."""

    method: str
    url: str
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def header(self, name: str) -> bytes | None:
        """The first value of header `name` (case-insensitive), None when absent."""
        wanted = name.lower().encode("latin-1")
        return next((value for key, value in self.headers if key.lower() == wanted), None)


@dataclass(slots=True)
class MockResponse:
    """An answer: status, raw headers, and a body that is bytes or chunks (sync or async, sent one by one).

    A bytes body gets a `content-length` header unless the headers already say one; chunks go
    as they are, without a declared length, as a stream would.
    """

    status: int = 200
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes | Iterable[bytes] | AsyncIterable[bytes] = b""


MockHandler = Callable[[MockRequest], "MockResponse | Awaitable[MockResponse]"]


class _Answer:
    """The `UpstreamResponse` the proxy reads: the handler's response, its body chunk by chunk."""

    def __init__(self, response: MockResponse) -> None:
        self.status = response.status
        self.headers = list(response.headers)
        self._body = response.body
        if isinstance(self._body, bytes) and not any(k.lower() == b"content-length" for k, _ in self.headers):
            self.headers.append((b"content-length", str(len(self._body)).encode("ascii")))
        self.closed = False

    async def chunks(self) -> AsyncIterator[bytes]:
        body = self._body
        if isinstance(body, bytes):
            if body:
                yield body
        elif isinstance(body, AsyncIterable):
            async for chunk in body:
                yield chunk
        else:
            for chunk in body:
                yield chunk

    async def aclose(self) -> None:
        self.closed = True


class MockTransport:
    """Answers each request from `handler` (sync or async); remembers every request in `requests`."""

    def __init__(self, handler: MockHandler) -> None:
        self.handler = handler
        self.requests: list[MockRequest] = []
        self.closed = False

    async def send(self, method: str, url: str, headers: list[tuple[bytes, bytes]], body: bytes) -> UpstreamResponse:
        """Call the handler; what it raises (`UpstreamUnreachable` for an unreachable upstream) goes to the proxy."""
        request = MockRequest(method, url, list(headers), body)
        self.requests.append(request)
        answer = self.handler(request)
        if inspect.isawaitable(answer):
            answer = await answer
        if not isinstance(answer, MockResponse):
            raise TypeError(f"A MockTransport handler returned {type(answer).__name__}; return a MockResponse.")
        return _Answer(answer)

    async def aclose(self) -> None:
        """Mark the transport closed (the proxy closes it on shutdown); a later `send` still answers."""
        self.closed = True
