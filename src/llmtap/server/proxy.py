"""`llmtap serve`: a capturing proxy in front of OpenAI-compatible and Anthropic upstreams.

The proxy itself only forwards: request bytes go upstream unchanged (but for credentials it is
configured to add), and the upstream's status, headers and raw body bytes come back chunk by chunk
as they arrive, compressed or not, errors included. Capture is the `CaptureMiddleware` around it.

The upstream call is one narrow seam, `UpstreamTransport.send`: `build_app(config, transport=...)`
(one transport for every upstream) or `transport_factory=` (one per upstream) swaps it without
patching; `mock_transport.MockTransport` answers from a function.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import orjson

from ..dialects import dialect_for_path
from ..errors import ConfigError, LlmtapError
from ..exchange import Exchange
from ..export.prometheus import ServeMetrics
from ..health import HEALTH, CaptureHealth
from ..store import CaptureStore
from .asgi import ASGIApp, Receive, Scope, Send, serve_lifespan
from .capture_dir import check_capture_dir
from .config import ServeConfig, UpstreamConfig
from .health_endpoint import HEALTH_PATH
from .limits import BodyTooLarge, body_too_large_payload, read_body_within, send_body_too_large
from .metrics_endpoint import METRICS_PATH
from .middleware import EXCHANGE_SCOPE_KEY, CaptureMiddleware
from .scope import raw_target
from .upstream import Http1Transport, UpstreamResponse, UpstreamTransport, UpstreamUnreachable

if TYPE_CHECKING:
    from ..export.live import LiveExporter

__all__ = ["ProxyApp", "TransportFactory", "UnsafeRequestTarget", "build_app", "default_transport", "upstream_url"]

# Makes the transport of one upstream, from its name and settings.
TransportFactory = Callable[[str, UpstreamConfig], UpstreamTransport]


def default_transport(name: str, config: UpstreamConfig) -> UpstreamTransport:
    """The keep-alive HTTP/1.1 pool `llmtap serve` uses for an upstream, sized and timed by its settings."""
    return Http1Transport(
        max_connections=config.max_connections,
        connect_timeout_s=config.connect_timeout_s,
        read_timeout_s=config.timeout_s,
    )

# Hop-by-hop headers (RFC 9110 §7.6.1) are for one connection and never forwarded; nor are the
# ones the proxy itself settles with the client.
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
        # The client's `Expect: 100-continue` was answered here (the body is already read); passed
        # on, the upstream client would hold the body back for a 100 some servers never send.
        b"expect",
    }
)
_CREDENTIALS = frozenset({b"authorization", b"x-api-key", b"api-key"})


class UnsafeRequestTarget(LlmtapError, ValueError):
    """Raised when a request's path could make the upstream URL leave its configured origin or base path."""


def upstream_url(base_url: str, path: str, query: bytes) -> str:
    """Join an upstream base URL and a request path, without doubling a `/v1` the base already has.

    `path` is the client's raw path. It must start with `/` and hold no `\\` and no `.` or `..`
    segment (encoded or not), so the joined URL can only ever name the base URL's host and port,
    under its path: the proxy adds the upstream's credential to what it sends there. Raises
    UnsafeRequestTarget otherwise.
    """
    problem = _target_problem(path)
    if problem is not None:
        raise UnsafeRequestTarget(f"The request path {path[:200]!r} was refused: {problem}.")
    base = base_url.rstrip("/")
    if base.endswith("/v1") and (path == "/v1" or path.startswith("/v1/")):
        base = base[: -len("/v1")]
    url = base + path
    if query:
        url += "?" + query.decode("latin-1")
    return url


def _target_problem(path: str) -> str | None:
    """Why a raw request path is unsafe to join to a base URL, or None when it is safe."""
    if not path.startswith("/"):
        return "it does not start with /"
    if "\\" in path:
        return "it holds a backslash"
    decoded = unquote(path) if "%" in path else path
    if "\\" in decoded:
        return "it holds an encoded backslash"
    if any(segment in (".", "..") for segment in decoded.split("/")):
        return "it holds a . or .. segment"
    return None


class _Upstream:
    """One configured upstream: its settings, its pooled transport and its credential header."""

    def __init__(self, name: str, config: UpstreamConfig, transport: UpstreamTransport) -> None:
        self.name = name
        self.config = config
        # `scheme://authority/`: every URL sent upstream starts with it, so none can name another host.
        parts = urlsplit(config.base_url)
        self.origin_prefix = f"{parts.scheme}://{parts.netloc}/"
        key = config.api_key()
        self.credential: tuple[bytes, bytes] | None = None
        if key is not None:
            if config.auth == "x-api-key":
                self.credential = (b"x-api-key", key.encode("latin-1"))
            else:
                self.credential = (b"authorization", b"Bearer " + key.encode("latin-1"))
        self.transport = transport

    def selects(self, dialect: str | None, model: str | None) -> bool:
        if self.config.dialects is not None and dialect not in self.config.dialects:
            return False
        if self.config.models is not None and model not in self.config.models:
            return False
        return True


class ProxyApp:
    """The forwarding ASGI app: chooses an upstream, streams the exchange through, never buffers a response.

    Each upstream's transport comes from `transport_factory` (`default_transport` unless given).
    """

    def __init__(self, config: ServeConfig, *, transport_factory: TransportFactory = default_transport) -> None:
        self.config = config
        self.upstreams = {
            name: _Upstream(name, upstream, transport_factory(name, upstream))
            for name, upstream in config.upstreams.items()
        }
        self._selective = [u for u in self.upstreams.values() if u.config.dialects or u.config.models]
        # Reading the request's model costs a JSON parse: only when some upstream selects by model.
        self._selects_by_model = any(u.config.models for u in self._selective)
        self.default = self.upstreams[config.default_upstream_name]
        # Run at lifespan shutdown after the pools close, each on a thread (they may block): the live exporter's close.
        self.on_shutdown: list[Callable[[], object]] = []

    async def aclose(self) -> None:
        """Close the pooled upstream connections (a shared transport once), then run `on_shutdown`."""
        transports = {id(upstream.transport): upstream.transport for upstream in self.upstreams.values()}
        for transport in transports.values():
            await transport.aclose()
        callbacks, self.on_shutdown = self.on_shutdown, []
        for callback in callbacks:
            await asyncio.to_thread(callback)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send, self.aclose)
            return
        if scope["type"] != "http":
            return
        body = await read_body_within(receive, scope, self.config.max_request_body_bytes)
        if isinstance(body, BodyTooLarge):
            await send_body_too_large(send, body_too_large_payload(body))
            return
        if not isinstance(body, bytes):
            return  # the client left before sending its request
        upstream = self._choose(scope["path"], body)
        exchange: Exchange | None = scope.get(EXCHANGE_SCOPE_KEY)
        if exchange is not None:
            exchange.model_ref = upstream.config.model_ref or exchange.model_ref
            exchange.provider = upstream.config.provider or exchange.provider
        await _Forwarding(upstream, scope, receive, send, exchange).run(body)

    def _choose(self, path: str, body: bytes) -> _Upstream:
        if not self._selective:
            return self.default
        dialect = dialect_for_path(path)
        model = None
        if self._selects_by_model:
            try:
                parsed = orjson.loads(body)
            except orjson.JSONDecodeError:
                parsed = None
            if isinstance(parsed, dict) and isinstance(parsed.get("model"), str):
                model = parsed["model"]
        for upstream in self._selective:
            if upstream.selects(dialect.name if dialect else None, model):
                return upstream
        return self.default

class _Forwarding:
    """One request's trip upstream and back, stopped early if the client disconnects."""

    def __init__(
        self, upstream: _Upstream, scope: Scope, receive: Receive, send: Send, exchange: Exchange | None
    ) -> None:
        self.upstream = upstream
        self.scope = scope
        self.receive = receive
        self.send = send
        self.exchange = exchange
        self.client_gone = False

    async def run(self, body: bytes) -> None:
        task = asyncio.current_task()
        assert task is not None
        watcher = asyncio.create_task(self._watch_disconnect(task))
        try:
            await self._forward(body)
        except asyncio.CancelledError:
            if not self.client_gone:
                raise
            task.uncancel()  # our own cancellation: the client left, so the call simply ends
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _watch_disconnect(self, task: asyncio.Task[Any]) -> None:
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.client_gone = True
                task.cancel()
                return

    async def _forward(self, body: bytes) -> None:
        try:
            target = raw_target(self.scope)
            url = upstream_url(self.upstream.config.base_url, target, self.scope.get("query_string", b""))
        except UnsafeRequestTarget as exc:
            await self._answer_refused(exc)
            return
        if not url.startswith(self.upstream.origin_prefix):  # a second guard: the credential stays home
            await self._answer_refused(UnsafeRequestTarget("The request path would leave the upstream's origin."))
            return
        try:
            response = await self.upstream.transport.send(self.scope["method"], url, self._request_headers(), body)
        except UpstreamUnreachable as exc:
            await self._answer_unreachable(exc)
            return
        try:
            await self.send({"type": "http.response.start", "status": response.status, "headers": _response_headers(response)})
            async for chunk in response.chunks():
                await self.send({"type": "http.response.body", "body": chunk, "more_body": True})
            await self.send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()

    def _request_headers(self) -> list[tuple[bytes, bytes]]:
        headers = [(k, v) for k, v in self.scope.get("headers", []) if k.lower() not in _HOP_BY_HOP]
        if self.upstream.credential is not None:
            headers = [(k, v) for k, v in headers if k.lower() not in _CREDENTIALS]
            headers.append(self.upstream.credential)
        return headers

    async def _answer_refused(self, exc: UnsafeRequestTarget) -> None:
        if self.exchange is not None:
            self.exchange.status_synthesized = True
        payload = orjson.dumps({"error": {"message": str(exc), "type": "invalid_request_error", "code": "invalid_path"}})
        await self.send(
            {
                "type": "http.response.start",
                "status": 400,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
            }
        )
        await self.send({"type": "http.response.body", "body": payload, "more_body": False})

    async def _answer_unreachable(self, exc: UpstreamUnreachable) -> None:
        status = 504 if exc.timed_out else 502
        if self.exchange is not None:
            self.exchange.exception = exc.cause
            self.exchange.status_synthesized = True
        payload = orjson.dumps(
            {
                "error": {
                    "message": f"llmtap could not get a response from upstream {self.upstream.name!r}: "
                    f"{type(exc.cause).__name__}.",
                    "type": "upstream_timeout" if exc.timed_out else "upstream_unreachable",
                }
            }
        )
        await self.send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
            }
        )
        await self.send({"type": "http.response.body", "body": payload, "more_body": False})


def _response_headers(response: UpstreamResponse) -> list[tuple[bytes, bytes]]:
    hop = {b"connection", b"keep-alive", b"transfer-encoding", b"proxy-authenticate", b"trailer", b"upgrade"}
    return [(k, v) for k, v in response.headers if k.lower() not in hop]


def build_app(
    config: ServeConfig,
    *,
    store: CaptureStore | None = None,
    health: CaptureHealth | None = None,
    transport: UpstreamTransport | None = None,
    transport_factory: TransportFactory | None = None,
) -> ASGIApp:
    """Build the `llmtap serve` ASGI app: the proxy wrapped in capture middleware.

    Capture is on when `observability_enabled` is true (the store is then opened at
    `model_call_capture_dir` unless one is given, after checking that it can be written: raises
    `ConfigError` otherwise). Each call is labelled with the `model_ref` and provider of the
    upstream it went to. `GET /llmtap/health` answers the health document, `GET /llmtap/metrics`
    the Prometheus metrics. With an OTLP endpoint (`otlp_endpoint`, or the standard OTEL_
    variables) each durable record is also exported as a span by a `LiveExporter`, closed at
    lifespan shutdown. `redact: true` redacts each record before it is written.

    `transport` sends every upstream's requests (a `MockTransport` in tests); `transport_factory`
    makes one per upstream; without either, each upstream gets `default_transport`.
    """
    if transport is not None and transport_factory is not None:
        raise ValueError("Pass transport or transport_factory to build_app, not both.")
    if transport is not None:
        shared = transport

        def transport_factory(name: str, upstream: UpstreamConfig) -> UpstreamTransport:
            return shared
    proxy = ProxyApp(config, transport_factory=transport_factory or default_transport)
    if store is None and config.observability_enabled:
        assert config.model_call_capture_dir is not None
        check_capture_dir(config.model_call_capture_dir)
        store = CaptureStore(config.model_call_capture_dir)
    default = proxy.default.config
    health = health or HEALTH
    metrics = ServeMetrics(health=health)
    live_export = _live_exporter(config, metrics) if store is not None else None
    if live_export is not None:
        proxy.on_shutdown.append(live_export.close)
    return CaptureMiddleware(
        proxy,
        store=store,
        model_ref=default.model_ref,
        provider=default.provider,
        sampling_overrides=config.sampling_overrides,
        health=health,
        require_sampling=config.require_model_sampling,
        max_request_body_bytes=config.max_request_body_bytes,
        max_decoded_body_bytes=config.max_decoded_body_bytes,
        health_path=HEALTH_PATH,
        metrics=metrics,
        metrics_path=METRICS_PATH,
        live_export=live_export,
        redact=config.redact,
    )


def _live_exporter(config: ServeConfig, metrics: ServeMetrics) -> LiveExporter | None:
    """The started live OTLP exporter `config` asks for, counting into `metrics`; None when export is off."""
    enabled, endpoint = config.live_export_endpoint()
    if not enabled:
        return None
    from ..export.live import LiveExporter
    from ..export.otlp import span_exporter

    try:
        exporter = span_exporter(endpoint)
    except LlmtapError as exc:
        raise ConfigError(f"Live OTLP export could not start: {exc}") from exc
    return LiveExporter(exporter, counter=metrics).start()
