"""`llmtap mcp-proxy --upstream URL`: a streamable-HTTP MCP proxy on 127.0.0.1 that records tool calls.

The proxy serves one path, the configured endpoint's (optionally behind `/ng-rollout/<id>`, which
sets the records' rollout id), and sends every request to exactly the configured URL: a client's
path is compared with the endpoint path, never joined onto it. POST, GET and DELETE go through
with their headers both ways (`Authorization`, `Mcp-Session-Id`, `MCP-Protocol-Version`,
`Mcp-Method`, `Last-Event-ID`, ...), minus hop-by-hop ones; nothing is added. A request body is
read whole up to `max_body_bytes` (a larger one is answered 413 and not sent); the answer is
streamed chunk by chunk as it arrives, an SSE stream event by event, never gathered first.

Records: a POST's requests pair with the answers in its own response (JSON or SSE); requests
the server sends (on a POST's stream or the GET stream) pair with the client's later POSTed
answers, per session (`Mcp-Session-Id`, kept in memory only). A record holds no header value,
only the HTTP status, the response mode and a keyed digest of the session id. Like the stdio
proxy, an answer that finishes a record is released only after the record is durable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..correlation import split_rollout_prefix
from ..errors import ConfigError, InvalidRolloutIdError

# The capturing proxy's upstream seam: a keep-alive HTTP/1.1 pool that sends a request as given
# (adding only host and content-length) and yields the body as it arrives, undecoded.
from ..server.asgi import Receive, Scope, Send, serve_lifespan
from ..server.http1 import UpstreamClosed, UpstreamProtocolError, UpstreamReadTimeout
from ..server.upstream import Http1Transport, UpstreamResponse, UpstreamTransport, UpstreamUnreachable
from .framing import DEFAULT_MAX_MESSAGE_BYTES, PREFIX_BYTES, OversizedMessage, SSEFramer
from .pairing import CLIENT_TO_SERVER, SERVER_TO_CLIENT, Pairing, SessionIdentity
from .recorder import Recorder
from .records import ToolCallRecord, digest

__all__ = ["DEFAULT_MAX_BODY_BYTES", "McpHttpProxy", "UpstreamEndpoint", "forwarded_headers", "run_http_proxy"]

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_SESSIONS = 1024
MAX_UPSTREAM_CONNECTIONS = 256
IDLE_STREAM_S = 24 * 3600.0
_METHODS = frozenset({"POST", "GET", "DELETE"})
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
# The upstream client writes host and content-length itself; the body is sent whole, so no `expect`.
_NOT_FORWARDED = _HOP_BY_HOP | {b"host", b"content-length", b"expect"}


@dataclass(frozen=True, slots=True)
class UpstreamEndpoint:
    """The one URL requests go to, and the one path the proxy answers on."""

    url: str
    path: str

    @classmethod
    def parse(cls, url: str) -> UpstreamEndpoint:
        """Check an upstream URL once: http(s), a host, no fragment; its path (default "/") is the endpoint."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.fragment:
            raise ConfigError(
                f"The MCP upstream {url!r} is not an http:// or https:// URL with a host: "
                "give the server's endpoint, e.g. http://127.0.0.1:8000/mcp."
            )
        return cls(url, parts.path or "/")


def _connection_tokens(headers: list[tuple[bytes, bytes]]) -> set[bytes]:
    tokens: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            tokens.update(token.strip().lower() for token in value.split(b","))
    return tokens


def forwarded_headers(headers: list[tuple[bytes, bytes]], drop: frozenset[bytes]) -> list[tuple[bytes, bytes]]:
    """Headers to pass on: all but `drop` and those the Connection header names, order and repeats kept."""
    named = _connection_tokens(headers)
    return [(name, value) for name, value in headers if name.lower() not in drop and name.lower() not in named]


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


@dataclass(slots=True)
class _Session:
    identity: SessionIdentity
    pairing: Pairing


class McpHttpProxy:
    """The ASGI app. `close()` releases the upstream client (also done at lifespan shutdown)."""

    def __init__(
        self,
        upstream: str,
        *,
        recorder: Recorder,
        rollout_id: str | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        transport: UpstreamTransport | None = None,
    ) -> None:
        self.endpoint = UpstreamEndpoint.parse(upstream)
        self.recorder = recorder
        self.rollout_id = rollout_id
        self.max_body_bytes = max_body_bytes
        self.max_message_bytes = max_message_bytes
        # No practical read timeout: a GET stream may idle for hours, and a slow tool is the client's to time out.
        self.transport = transport or Http1Transport(
            max_connections=MAX_UPSTREAM_CONNECTIONS, connect_timeout_s=30.0, read_timeout_s=IDLE_STREAM_S
        )
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._sessionless = self._new_session()
        self.evicted: list[ToolCallRecord] = []  # open calls of sessions dropped over the bound, not yet written

    def _new_session(self, seed: SessionIdentity | None = None) -> _Session:
        identity = SessionIdentity("streamable_http", rollout_id=self.rollout_id)
        if seed is not None:
            identity.era, identity.version, identity.client, identity.server = (
                seed.era,
                seed.version,
                seed.client,
                seed.server,
            )
        return _Session(identity, Pairing(identity))

    def _session(self, session_id: str | None) -> _Session:
        if session_id is None:
            return self._sessionless
        session = self._sessions.get(session_id)
        if session is None:
            self.make_room()
            session = self._sessions[session_id] = self._new_session(self._sessionless.identity)
        self._sessions.move_to_end(session_id)
        return session

    def make_room(self) -> None:
        """Drop the least recently used sessions over the bound; their open calls are written next."""
        while len(self._sessions) >= MAX_SESSIONS:
            _, old = self._sessions.popitem(last=False)
            self.evicted += old.pairing.close_all("session_evicted")

    async def close(self) -> None:
        """Close the upstream connections."""
        await self.transport.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send, self.close)
            return
        if scope["type"] != "http":
            return
        try:
            rollout_id = self._route(scope)
        except InvalidRolloutIdError as exc:
            await _plain(send, 400, str(exc))
            return
        except LookupError:
            await _plain(send, 404, f"This MCP proxy serves only {self.endpoint.path!r}.")
            return
        method = scope["method"]
        if method not in _METHODS:
            await _plain(send, 405, "An MCP endpoint takes POST, GET or DELETE.", [(b"allow", b"POST, GET, DELETE")])
            return
        headers: list[tuple[bytes, bytes]] = list(scope["headers"])
        try:
            body = await self._read_body(headers, receive)
        except _ClientGone:
            return  # nothing was sent upstream
        if body is None:
            await _plain(send, 413, f"The request body is over {self.max_body_bytes} bytes, this proxy's limit.")
            return
        await _Exchange(self, method, headers, body, rollout_id).run(receive, send)

    def _route(self, scope: Scope) -> str | None:
        """The rollout id the path carries; LookupError unless the rest is exactly the endpoint path."""
        raw = scope.get("raw_path")
        path = raw.decode("latin-1") if isinstance(raw, bytes) else scope["path"]
        if scope.get("query_string"):
            raise LookupError(path)
        rollout_id, rest = split_rollout_prefix(path)
        if rest != self.endpoint.path:
            raise LookupError(path)
        return rollout_id if rollout_id is not None else self.rollout_id

    async def _read_body(self, headers: list[tuple[bytes, bytes]], receive: Receive) -> bytes | None:
        declared = _header(headers, b"content-length")
        if declared is not None and (not declared.strip().isdigit() or int(declared) > self.max_body_bytes):
            return None
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise _ClientGone  # a part of a body is never forwarded
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)

class _Exchange:
    """One client request: forward it, stream the answer back, and record what it carried."""

    def __init__(
        self, proxy: McpHttpProxy, method: str, headers: list[tuple[bytes, bytes]], body: bytes, rollout_id: str | None
    ) -> None:
        self.proxy = proxy
        self.recorder = proxy.recorder
        self.method = method
        self.headers = headers
        self.body = body
        self.rollout_id = rollout_id
        self.session_id = _header(headers, b"mcp-session-id")
        if self.session_id:
            self.session = proxy._session(self.session_id)
        else:
            # No session (yet): this request's own identity, and the proxy's shared table for retry links.
            fresh = proxy._new_session(proxy._sessionless.identity)
            self.session = _Session(fresh.identity, proxy._sessionless.pairing)
        self.pairing = Pairing(self.session.identity, parent=self.session.pairing)
        self.status: int | None = None
        self.mode: str | None = None
        self._direction = CLIENT_TO_SERVER
        self._copied = 0  # bytes of a JSON answer kept for recording

    def _route(self, message: dict[str, object]) -> Pairing:
        """A POST's own requests and their answers pair here; the server's requests and their answers per session."""
        if "method" in message:
            return self.pairing if self._direction == CLIENT_TO_SERVER else self.session.pairing
        return self.session.pairing if self._direction == CLIENT_TO_SERVER else self.pairing

    async def run(self, receive: Receive, send: Send) -> None:
        recorder = self.recorder
        if self.method == "POST" and self.body:
            self._direction = CLIENT_TO_SERVER
            events: list[str | OversizedMessage] = [self.body.decode("utf-8", "replace")]
            await self._persist(recorder.observe_events(events, self.pairing, CLIENT_TO_SERVER, self._route))
        self._direction = SERVER_TO_CLIENT
        headers = forwarded_headers(self.headers, _NOT_FORWARDED)
        try:
            response = await self.proxy.transport.send(self.method, self.proxy.endpoint.url, headers, self.body)
        except UpstreamUnreachable as exc:
            recorder.notice("upstream", f"the MCP upstream could not be reached ({type(exc.cause).__name__})")
            await self._persist(self.pairing.close_all("upstream_unreachable", status="failed"))
            await _plain(send, 502, "The MCP upstream could not be reached: check that it is running.")
            return
        watcher = asyncio.create_task(_disconnected(receive))
        relay = asyncio.create_task(self._relay(response, send))
        try:
            done, _ = await asyncio.wait({watcher, relay}, return_when=asyncio.FIRST_COMPLETED)
            if relay not in done:
                relay.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await relay
                await self._persist(self.pairing.close_all("client_disconnected"))
            else:
                relay.result()
        finally:
            watcher.cancel()
            await response.aclose()
            if not self.session_id:
                _learn(self.proxy._sessionless.identity, self.session.identity)

    async def _relay(self, response: UpstreamResponse, send: Send) -> None:
        self.status = response.status
        content_type = (_header(response.headers, b"content-type") or "").split(";")[0].strip().lower()
        encoded = (_header(response.headers, b"content-encoding") or "identity").strip().lower() != "identity"
        self.mode = (
            "sse" if content_type == "text/event-stream" else "json" if content_type == "application/json" else None
        )
        if encoded and self.mode is not None:
            self.recorder.notice("encoded", "an MCP response was content-encoded; its calls are recorded as unknown")
            self.mode = "encoded"
        new_session = _header(response.headers, b"mcp-session-id")
        if new_session and not self.session_id:
            self._adopt_session(new_session)
        headers = forwarded_headers(response.headers, _HOP_BY_HOP)
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        framer = SSEFramer(self.proxy.max_message_bytes) if self.mode == "sse" else None
        copy: list[bytes] = []
        total = 0
        held: bytes | None = None
        try:
            async for chunk in response.chunks():
                held = await self._forward(chunk, framer, held, copy, send)
                total += len(chunk)
        except (UpstreamClosed, UpstreamReadTimeout, UpstreamProtocolError, OSError):
            # The upstream broke off mid-answer: record that, and let the client see a cut response too.
            self.recorder.notice("upstream_cut", "an MCP upstream closed a response before its end")
            await self._persist(
                self.pairing.close_all("upstream_closed", {"http_status": response.status}, status="failed")
            )
            raise _UpstreamCut from None
        await self._finish(response.status, framer, held, copy, total, send)

    async def _forward(
        self, chunk: bytes, framer: SSEFramer | None, held: bytes | None, copy: list[bytes], send: Send
    ) -> bytes | None:
        """Send a chunk on (an SSE chunk after the records it finishes); return the chunk to hold back."""
        if framer is not None:
            await self._persist(self.recorder.observe_sse(framer, chunk, self.pairing, SERVER_TO_CLIENT, self._route))
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            return None
        if self.mode == "json" and self._copied <= self.proxy.max_message_bytes:
            copy.append(chunk)
            self._copied += len(chunk)
        if held is not None:  # the last chunk waits for the record it may finish
            await send({"type": "http.response.body", "body": held, "more_body": True})
        return chunk

    async def _finish(
        self, status: int, framer: SSEFramer | None, held: bytes | None, copy: list[bytes], total: int, send: Send
    ) -> None:
        """The upstream's answer ended: close its records, make them durable, then release the last bytes."""
        finished: list[ToolCallRecord] = []
        if framer is not None:
            finished = self.recorder.observe_events(framer.close(), self.pairing, SERVER_TO_CLIENT, self._route)
        elif self.mode == "json":
            item: str | OversizedMessage = (
                b"".join(copy).decode("utf-8", "replace")
                if total <= self.proxy.max_message_bytes
                else OversizedMessage(b"".join(copy)[:PREFIX_BYTES], total)
            )
            finished = self.recorder.observe_events([item], self.pairing, SERVER_TO_CLIENT, self._route)
        category = "response_ended" if status < 400 else "http_error"
        if self.mode == "encoded":
            category = "response_encoded"
        finished += self.pairing.close_all(category, {"http_status": status})
        if self.method == "DELETE" and status < 300 and self.session_id:
            finished += self.session.pairing.close_all("session_deleted")
            self.proxy._sessions.pop(self.session_id, None)
        await self._persist(finished)
        await send({"type": "http.response.body", "body": held or b"", "more_body": False})

    def _adopt_session(self, session_id: str) -> None:
        """The server opened a session in answer to this request: later requests carry its id."""
        sessions = self.proxy._sessions
        self.proxy.make_room()
        if self.session.pairing is self.proxy._sessionless.pairing:
            self.session = _Session(self.session.identity, Pairing(self.session.identity))
        sessions[session_id] = self.session
        self.session_id = session_id

    async def _persist(self, records: list[ToolCallRecord]) -> None:
        if self.proxy.evicted:
            await self.recorder.persist(self.proxy.evicted)
            self.proxy.evicted = []
        if not records:
            return
        key = self.session.identity.digest_key
        http = {
            "status": self.status,
            "response_mode": self.mode,
            "session": digest(self.session_id, key) if self.session_id else None,
        }
        for record in records:
            record.http = http if record.http is None else record.http
            if self.rollout_id is not None:
                record.rollout_id = self.rollout_id
        await self.recorder.persist(records)


class _ClientGone(Exception):
    """The client disconnected before its request body was whole."""


class _UpstreamCut(Exception):
    """Raised out of the app to make the server drop the client's connection (said once already)."""


class _QuietCut(logging.Filter):
    """Keeps the server's error log free of the traceback of a cut the notice already reported."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], _UpstreamCut))


def _learn(shared: SessionIdentity, learned: SessionIdentity) -> None:
    """Keep what a session-less request taught (protocol, implementations) for the next one."""
    shared.era = learned.era or shared.era
    shared.version = learned.version or shared.version
    shared.client = learned.client or shared.client
    shared.server = learned.server or shared.server


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _plain(send: Send, status: int, text: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = text.encode() + b"\n"
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def run_http_proxy(
    upstream: str,
    *,
    port: int,
    recorder: Recorder,
    rollout_id: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    announce: Callable[[str], None] | None = None,
) -> int:
    """Serve the proxy on 127.0.0.1:`port` until interrupted; return 0 (or 1 if it could not listen).

    Prints `llmtap mcp-proxy: listening on http://127.0.0.1:<port><path>` on stderr once bound.
    """
    import uvicorn

    app = McpHttpProxy(
        upstream,
        recorder=recorder,
        rollout_id=rollout_id,
        max_body_bytes=max_body_bytes,
        max_message_bytes=max_message_bytes,
    )
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        access_log=False,
        timeout_graceful_shutdown=2,
        server_header=False,
        date_header=False,  # the upstream's own go through
    )
    server = uvicorn.Server(config)
    logging.getLogger("uvicorn.error").addFilter(_QuietCut())
    say = announce or (lambda text: recorder.notice("listening", text))

    async def serve() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            bound = server.servers[0].sockets[0].getsockname()[1]
            say(f"listening on http://127.0.0.1:{bound}{app.endpoint.path}")
        await task

    try:
        asyncio.run(serve())
    finally:
        recorder.close()
    return 0 if server.started else 1
