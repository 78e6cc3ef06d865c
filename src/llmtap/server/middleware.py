"""Capture middleware: a pure ASGI tee around any model server app.

Requests under `/ng-rollout/<rollout_id>[/training-token-capture][/ng-sampling/<segment>]` have
that prefix stripped from `path` and `raw_path` (always, capture on or off); those for a dialect
path are captured, a training token-capture call with `"training_token_capture": true` in its record. Bytes go
to the client as they arrive, except what must wait for durability: the final message, and for a
stream the chunk at which the client holds the complete answer (a chat choice's `finish_reason`,
a Messages stop reason, a Responses terminal event: its dialect's `answered`) and everything after
it, usage included (an SDK may return as soon as it has the answer). Those are released once the
call's record is fsynced, so when an agent's call returns, its record is on disk (principle 2).

Bounds (all optional here, all set by `llmtap serve`): `max_request_body_bytes` refuses a larger
body with a 413 that is still recorded, `max_decoded_body_bytes` caps how far a compressed
response is decoded for its record, and `health_path` answers the health document there
(`health_endpoint`), `metrics_path` the Prometheus metrics (`metrics_endpoint`). Records are
built, redacted when asked, stored and then observed by `record_commit.RecordCommitter`.

Usage::

    from llmtap import CaptureStore
    from llmtap.server.middleware import CaptureMiddleware

    app = CaptureMiddleware(model_server_app, store=CaptureStore("/abs/model-calls"),
                            model_ref={"type": "responses_api_models", "name": "policy_model"})
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, Mapping
from urllib.parse import unquote

import orjson

from ..correlation import ROLLOUT_PREFIX, split_rollout_prefix, split_token_capture_segment
from ..correlation.ids import TRAINING_TOKEN_CAPTURE_FIELD, TRAINING_TOKEN_CAPTURE_SEGMENT
from ..correlation.sampling import (
    MODEL_SAMPLING_HEADER,
    MODEL_SAMPLING_PREFIX,
    ModelCallSampling,
    apply_model_sampling,
    decode_model_sampling,
    resolve_sampling_segment,
    split_sampling_segment,
)
from ..dialects import Dialect, dialect_for_path, get_dialect
from ..errors import InvalidRolloutIdError, LlmtapError
from ..exchange import Exchange, new_model_call_id, safe_headers
from ..health import HEALTH, CaptureHealth
from ..records import StreamTracker
from ..records.content_coding import DEFAULT_MAX_DECODED_BYTES
from ..store import CaptureStore
from .asgi import ASGIApp, Message, Receive, Scope, Send
from .health_endpoint import health_report, send_health
from .limits import BodyTooLarge, ClientGone, body_too_large_payload, read_body_within, send_body_too_large
from .metrics_endpoint import send_metrics
from .record_commit import RecordCommitter
from .scope import header as _header
from .scope import raw_target as _raw_target
from .scope import read_body as _read_body
from .scope import replay_receive as _replay_receive
from .scope import with_content_length as _with_content_length

if TYPE_CHECKING:
    from ..export.live import LiveExporter
    from ..export.prometheus import ServeMetrics

__all__ = ["EXCHANGE_SCOPE_KEY", "CaptureMiddleware"]

# The scope key under which the wrapped app finds the Exchange of a captured call, so a proxy can
# say why it answered for an upstream it could not reach, or which upstream served the call.
EXCHANGE_SCOPE_KEY = "llmtap.exchange"

class CaptureMiddleware:
    """Captures every prefixed dialect call of the wrapped ASGI app into a `CaptureStore`.

    Options are settled here, once; each call gets its own `_CapturedCall`. With `store=None`
    capture is off, but prefixes are still stripped and sampling still applied.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: CaptureStore | None,
        model_ref: Mapping[str, Any] | None = None,
        sampling_overrides: Mapping[str, Any] | None = None,
        provider: str | None = None,
        health: CaptureHealth | None = None,
        require_sampling: bool = False,
        max_request_body_bytes: int | None = None,
        max_decoded_body_bytes: int = DEFAULT_MAX_DECODED_BYTES,
        health_path: str | None = None,
        metrics: ServeMetrics | None = None,
        metrics_path: str | None = None,
        live_export: LiveExporter | None = None,
        redact: bool = False,
    ) -> None:
        self.app = app
        self.max_request_body_bytes = max_request_body_bytes
        self.max_decoded_body_bytes = max_decoded_body_bytes
        self.health_path = health_path
        # A server a training framework lists in `required_model_servers`: every prefixed
        # generation call must say its sampling (values or `null`), or it is refused.
        self.require_sampling = require_sampling
        self.store = store
        self.model_ref = dict(model_ref) if model_ref is not None else None
        self.sampling_overrides = dict(sampling_overrides) if sampling_overrides else None
        self.provider = provider
        self.health = health or HEALTH
        self.metrics = metrics
        if metrics is not None:
            metrics.track_in_flight(lambda: self.in_flight)  # read at scrape time: nothing per call
        self.metrics_path = metrics_path if metrics is not None else None
        self.live_export = live_export
        self.committer = None if store is None else RecordCommitter(
            store, self.health, max_decoded_body_bytes=max_decoded_body_bytes, metrics=metrics,
            live_export=live_export, redact=redact,
        )
        # HTTP requests in progress through this middleware, captured or not: with one alone, the
        # store may sync its record on the loop itself (`CaptureStore.append_async(alone=...)`).
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] == self.health_path and scope.get("method") in ("GET", "HEAD"):
            await self._answer_health(send, head_only=scope.get("method") == "HEAD")
            return
        if scope["path"] == self.metrics_path and scope.get("method") in ("GET", "HEAD"):
            assert self.metrics is not None
            await send_metrics(send, self.metrics, head_only=scope.get("method") == "HEAD")
            return
        self.in_flight += 1
        try:
            await self._handle(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not scope["path"].startswith(_CORRELATION_PREFIXES):
            await self.app(scope, receive, send)
            return
        # The prefix is read from the path as the client sent it, never from its decoded form: an
        # encoded `/` (`x%2F@evil:9666`) decodes into a valid-looking prefix while the raw text after
        # it would make the upstream URL name another host. Ids and segments cannot hold `%`, so an
        # encoded character anywhere in the prefix fails validation here.
        target = _raw_target(scope)
        if not target.startswith(_CORRELATION_PREFIXES):
            await self._refuse_path(send, "its /ng-rollout/ or /ng-sampling/ prefix is percent-encoded", target)
            return
        try:
            rollout_id, rest = split_rollout_prefix(target)
        except InvalidRolloutIdError as exc:
            self.health.count("rejected_rollout_ids")
            await _send_json_error(send, 400, str(exc), "invalid_rollout_id", dialect_for_path(target, exact=False))
            return
        # The reference system's token-id capture path: stripped like the prefix, and the call captured.
        token_capture = False
        if rollout_id is not None and rest.startswith(TRAINING_TOKEN_CAPTURE_SEGMENT):
            token_capture, rest = split_token_capture_segment(rest)
        try:
            segment, rest = split_sampling_segment(rest)
            segment_error = None
        except ValueError as exc:
            segment, segment_error = None, str(exc)
            rest = "/" + rest[len(MODEL_SAMPLING_PREFIX) :].partition("/")[2]
        decoded_rest = unquote(rest)
        if decoded_rest.startswith(_CORRELATION_PREFIXES) != rest.startswith(_CORRELATION_PREFIXES):
            await self._refuse_path(send, "a /ng-sampling/ prefix in it is percent-encoded", target)
            return
        inner_scope = {**scope, "path": decoded_rest, "raw_path": rest.encode("latin-1")}
        dialect = dialect_for_path(decoded_rest)
        if dialect is None:
            await self.app(inner_scope, receive, send)
            return
        header_segment = _header(scope, MODEL_SAMPLING_HEADER)
        call = _CapturedCall(self, inner_scope, rollout_id, dialect)
        call.scope[EXCHANGE_SCOPE_KEY] = call.exchange
        if token_capture:
            call.exchange.extra[TRAINING_TOKEN_CAPTURE_FIELD] = True
        await call.run(receive, send, segment, header_segment, segment_error)

    async def _refuse_path(self, send: Send, why: str, target: str) -> None:
        self.health.count("rejected_paths")
        await _send_json_error(
            send, 400, f"The request path was refused: {why}. Send the prefix unencoded.", "invalid_path",
            dialect_for_path(target, exact=False),
        )


    async def _answer_health(self, send: Send, *, head_only: bool) -> None:
        capture_dir = self.store.root if self.store is not None else None
        export = self.live_export.counts() if self.live_export is not None else None
        report = health_report(self.health, capture_dir, self.in_flight, otlp_export=export)
        await send_health(send, report, head_only=head_only)


# A call is correlated by a rollout prefix, and may carry a sampling segment after it, or alone
# (a run whose rows carry sampling values but no rollout id): both are stripped before routing.
_CORRELATION_PREFIXES = (ROLLOUT_PREFIX, MODEL_SAMPLING_PREFIX)


class _CapturedCall:
    """The state of one captured call: its Exchange, stream tracker and held-back messages."""

    def __init__(self, owner: CaptureMiddleware, scope: Scope, rollout_id: str | None, dialect: Dialect) -> None:
        self.owner = owner
        self.scope = scope
        self.dialect = dialect
        self.capturing = owner.store is not None and rollout_id is not None
        self.exchange = Exchange(
            method=scope.get("method", "POST"),
            path=scope["path"],
            request_headers=safe_headers(scope.get("headers")),
            rollout_id=rollout_id,
            model_ref=owner.model_ref,
            provider=owner.provider,
            model_call_id=new_model_call_id(),
        )
        self.tracker: StreamTracker | None = None
        self.held: list[Message] = []
        self.holding_body = False  # once a body chunk is held, every later one is too
        self.response_started = False
        self.finished = False
        self.client_gone = False
        self.content_length: int | None = None
        self.body_length = 0

    async def run(
        self,
        receive: Receive,
        send: Send,
        segment: str | None,
        header_segment: str | None,
        segment_error: str | None,
    ) -> None:
        try:
            if self.owner.max_request_body_bytes is not None:
                receive = await self._read_bounded_body(receive)
            if segment_error is not None:
                await _read_body(receive, self)
                raise _RejectedRequest(segment_error)
            body_receive = await self._prepare_request(receive, segment, header_segment)
        except _BodyRefused as refused:
            await self._refuse_body(send, refused.refused)
            return
        except _ClientLeft:
            self.exchange.cancelled = self.finished = True
            await self._commit()  # the call still leaves its record, as cancelled
            return
        except _RejectedRequest as rejected:
            await self._reject(send, rejected)
            return
        try:
            await self.owner.app(self.scope, body_receive, self._wrap_send(send))
        except BaseException as exc:
            await self._fail(send, exc)
            raise
        if not self.finished:
            # The app returned without a final message (client gone, or a broken app).
            self.exchange.cancelled = self.client_gone
            await self._commit()
            await self._release(send)

    async def _read_bounded_body(self, receive: Receive) -> Receive:
        """Read the body whole within the limit, then hand it on as one message (one copy kept)."""
        limit = self.owner.max_request_body_bytes
        assert limit is not None
        body = await read_body_within(receive, self.scope, limit)
        if isinstance(body, BodyTooLarge):
            raise _BodyRefused(body)
        if isinstance(body, ClientGone):
            self.client_gone = True
            raise _ClientLeft
        self.exchange.request_body = body
        return _replay_receive(body, receive, self)

    async def _prepare_request(
        self, receive: Receive, segment: str | None, header_segment: str | None
    ) -> Receive:
        """Tee the request body; when sampling applies, read it whole and rewrite it first."""
        overrides = self.owner.sampling_overrides
        if segment is None and header_segment is None and self.owner.require_sampling:
            await _read_body(receive, self)
            raise _RejectedRequest(
                "This model server requires each generation call to carry its sampling: add "
                f"/ng-sampling/<segment> after the rollout prefix, or the {MODEL_SAMPLING_HEADER} header "
                "(the value `null` keeps the caller's own sampling)."
            )
        if segment is None and header_segment is None and not overrides:
            return receive if self.owner.max_request_body_bytes is not None else self._wrap_receive(receive)
        body = await _read_body(receive, self)
        sampling = _decode_sampling(segment, header_segment)
        if sampling is not _NO_SAMPLING or overrides:
            body = self._rewrite_body(body, sampling if isinstance(sampling, ModelCallSampling) else None, overrides)
        return _replay_receive(body, receive, self)

    def _rewrite_body(
        self, body: bytes, sampling: ModelCallSampling | None, overrides: Mapping[str, Any] | None
    ) -> bytes:
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body  # not JSON: the model server answers it as it would have
        if not isinstance(request, dict):
            return body
        rewritten = apply_model_sampling(request, self.dialect.name, sampling, overrides)
        if sampling is not None:
            self.exchange.sampling = sampling.model_dump(exclude_none=True)
        new_body = orjson.dumps(rewritten)
        self.scope = _with_content_length(self.scope, len(new_body))
        self.exchange.request_body = new_body
        return new_body

    def _wrap_receive(self, receive: Receive) -> Receive:
        async def tee_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                self.exchange.add_request_bytes(message.get("body", b""))
            elif message["type"] == "http.disconnect":
                self.client_gone = True
            return message

        return tee_receive

    def _wrap_send(self, send: Send) -> Send:
        exchange = self.exchange

        async def tee_send(message: Message) -> None:
            if message["type"] != "http.response.body" or self.finished:
                if message["type"] == "http.response.start":
                    self._on_start(message)
                    if self.capturing and self.content_length is not None and self.owner.in_flight > 1:
                        # A response of declared length is no use to its client before its last
                        # byte, which is held until durable anyway. Under load its head waits with
                        # it: one write for the client to read, not a head now and the body after
                        # the sync. A call alone sends its head at once, so that its client reads
                        # it while the sync runs (the latency of a lone call, not CPU, is short).
                        self.held.append(message)
                        return
                await self._send(send, message)
                return
            body = message.get("body", b"")
            exchange.add_response_chunk(body)
            self.body_length += len(body)
            if not message.get("more_body", False):
                self.finished = True
                self.held.append(message)
                await self._commit()
                await self._release(send)
                return
            # The tracker sees every chunk, held ones too: usage and the end marker follow the answer.
            answered = self._is_terminal(body)
            if self.capturing and (self.holding_body or answered or self._completes_body()):
                self.holding_body = True
                self.held.append(message)
                return
            if self.held:
                await self._release(send)  # the held start goes with the first chunk that is not held
            await self._send(send, message)

        return tee_send

    def _on_start(self, message: Message) -> None:
        self.response_started = True
        self.exchange.status_code = message["status"]
        self.exchange.response_headers = safe_headers(message.get("headers"))
        declared = self.exchange.response_headers.get("content-length", "")
        self.content_length = int(declared) if declared.isdigit() else None
        if self.capturing and self.exchange.is_stream and not self.exchange.response_headers.get("content-encoding"):
            self.tracker = StreamTracker(self.dialect)  # only a captured call waits for its answer

    def _is_terminal(self, body: bytes) -> bool:
        """True from the chunk at which the client holds the complete answer (see `StreamTracker`)."""
        return self.tracker is not None and self.tracker.feed(body)

    def _completes_body(self) -> bool:
        """True when the bytes so far reach the declared content-length: the client is done then."""
        return self.content_length is not None and self.body_length >= self.content_length

    async def _send(self, send: Send, message: Message) -> None:
        try:
            await send(message)
        except OSError:
            # The client went away (uvicorn's ClientDisconnected is an OSError).
            self.client_gone = True
            raise

    async def _release(self, send: Send) -> None:
        held, self.held = self.held, []
        for message in held:
            await self._send(send, message)

    async def _fail(self, send: Send, exc: BaseException) -> None:
        """Record a call that ended in an exception, then let the held bytes go."""
        if self.finished:
            return
        self.finished = True
        if isinstance(exc, asyncio.CancelledError) or self.client_gone:
            self.exchange.cancelled = True
        else:
            self.exchange.exception = exc
        # Shielded: a cancelled call must still leave its record (nothing lost silently).
        await asyncio.shield(self._commit())
        if self.response_started and not self.exchange.cancelled:
            # The bytes held for durability still belong to the client. If they cannot be sent
            # either, the original exception is what the caller re-raises, so this one goes.
            with contextlib.suppress(BaseException):
                await self._release(send)

    async def _commit(self) -> None:
        """Build and durably store the record (`RecordCommitter`); a failure is counted and never raised."""
        committer = self.owner.committer
        if not self.capturing or committer is None:
            return
        await committer.commit(
            self.exchange, self.dialect, self.tracker, self.body_length, alone=self.owner.in_flight == 1
        )

    async def _reject(self, send: Send, rejected: _RejectedRequest) -> None:
        self.exchange.status_code = 400
        payload = _error_body(str(rejected), "invalid_model_sampling", 400, self.dialect)
        self.exchange.response_headers = {"content-type": "application/json"}
        self.exchange.add_response_chunk(payload)
        self.finished = True
        await self._commit()
        await _send_body(send, 400, payload)


    async def _refuse_body(self, send: Send, refused: BodyTooLarge) -> None:
        """Answer 413 for a body over the limit, and record the call as rejected (without the body)."""
        self.owner.health.count("rejected_request_bodies")
        payload = body_too_large_payload(refused)
        self.exchange.status_code = 413
        self.exchange.response_headers = {"content-type": "application/json"}
        self.exchange.add_response_chunk(payload)
        self.exchange.extra["rejected"] = {
            "reason": "request_body_too_large",
            "limit_bytes": refused.limit,
            "received_bytes": refused.received,
        }
        self.finished = True
        await self._commit()
        await send_body_too_large(send, payload)


class _RejectedRequest(LlmtapError):
    """A request llmtap itself must refuse (a malformed sampling segment)."""


class _ClientLeft(LlmtapError):
    """The client disconnected before its request body ended: nothing is forwarded."""


class _BodyRefused(LlmtapError):
    """A request body over the limit."""

    def __init__(self, refused: BodyTooLarge) -> None:
        super().__init__("request body over the limit")
        self.refused = refused


_NO_SAMPLING = object()


def _decode_sampling(segment: str | None, header_segment: str | None) -> object:
    """Return the call's sampling (None for `null`), `_NO_SAMPLING`, or raise `_RejectedRequest`."""
    try:
        encoded = resolve_sampling_segment(segment, header_segment)
        if encoded is None:
            return _NO_SAMPLING
        return decode_model_sampling(encoded)
    except ValueError as exc:
        raise _RejectedRequest(str(exc)) from exc


def _error_body(message: str, code: str, status: int, dialect: Dialect | None) -> bytes:
    # The call's own provider shape, so its SDK reads the error; OpenAI's before a path names one.
    return (dialect or get_dialect("chat")).error_body(message, code, status)


async def _send_body(send: Send, status: int, payload: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": payload, "more_body": False})


async def _send_json_error(send: Send, status: int, message: str, code: str, dialect: Dialect | None = None) -> None:
    await _send_body(send, status, _error_body(message, code, status, dialect))
