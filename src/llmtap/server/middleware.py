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
(`health_endpoint`). A record of a large call is built on a helper thread, off the event loop.

Usage::

    from llmtap import CaptureStore
    from llmtap.server.middleware import CaptureMiddleware

    app = CaptureMiddleware(model_server_app, store=CaptureStore("/abs/model-calls"),
                            model_ref={"type": "responses_api_models", "name": "policy_model"})
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping
from urllib.parse import quote, unquote

import orjson

from ..content_coding import DEFAULT_MAX_DECODED_BYTES
from ..correlation import ROLLOUT_PREFIX, split_rollout_prefix, split_token_capture_segment
from ..correlation.ids import TRAINING_TOKEN_CAPTURE_SEGMENT
from ..correlation.sampling import (
    MODEL_SAMPLING_HEADER,
    MODEL_SAMPLING_PREFIX,
    ModelCallSampling,
    apply_model_sampling,
    decode_model_sampling,
    resolve_sampling_segment,
    split_sampling_segment,
)
from ..dialects import Dialect, dialect_for_path
from ..errors import InvalidRolloutIdError
from ..exchange import Exchange, new_model_call_id, safe_headers
from ..health import HEALTH, CaptureHealth
from ..records import StreamTracker, raw_line_from_exchange
from ..store import CaptureStore
from .asgi import ASGIApp, Message, Receive, Scope, Send
from .health_endpoint import health_report, send_health
from .limits import BodyTooLarge, ClientGone, body_too_large_payload, read_body_within, send_body_too_large

__all__ = ["EXCHANGE_SCOPE_KEY", "CaptureMiddleware"]

# The scope key under which the wrapped app finds the Exchange of a captured call, so a proxy can
# say why it answered for an upstream it could not reach, or which upstream served the call.
EXCHANGE_SCOPE_KEY = "llmtap.exchange"

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
            await self._refuse_path(send, "its /ng-rollout/ or /ng-sampling/ prefix is percent-encoded")
            return
        try:
            rollout_id, rest = split_rollout_prefix(target)
        except InvalidRolloutIdError as exc:
            self.health.count("rejected_rollout_ids")
            await _send_json_error(send, 400, str(exc), "invalid_rollout_id")
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
            await self._refuse_path(send, "a /ng-sampling/ prefix in it is percent-encoded")
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

    async def _refuse_path(self, send: Send, why: str) -> None:
        self.health.count("rejected_paths")
        await _send_json_error(
            send, 400, f"The request path was refused: {why}. Send the prefix unencoded.", "invalid_path"
        )


    async def _answer_health(self, send: Send, *, head_only: bool) -> None:
        capture_dir = self.store.root if self.store is not None else None
        await send_health(send, health_report(self.health, capture_dir, self.in_flight), head_only=head_only)


# The record's mark of a call made under `/ng-rollout/<id>/training-token-capture`: a call whose
# token ids a training framework captures. Absent, not false, on every other call.
TRAINING_TOKEN_CAPTURE_FIELD = "training_token_capture"

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
        """Build and durably store the record; a failure is counted and never raised."""
        if not self.capturing:
            return
        store = self.owner.store
        assert store is not None and self.exchange.rollout_id is not None
        try:
            line = self._build_line_here()
            if line is None:
                line = await self._build_line_off_loop()
        except Exception as exc:
            self.owner.health.failure("record_build_failed", "asgi", exc)
            store.mark_incomplete(self.exchange.rollout_id, "record_build_failed")
            return
        handed_over = time.perf_counter()
        try:
            await store.append_async(self.exchange.rollout_id, line, alone=self.owner.in_flight == 1)
        except Exception as exc:
            self.owner.health.failure("record_write_failed", "asgi", exc)
            return
        self.owner.health.observe_sync(time.perf_counter() - handed_over)
        self.owner.health.count("records_written")

    def _build_line_here(self) -> dict[str, Any] | None:
        """Build the record on the loop when it is small; None when it must be built off the loop."""
        exchange = self.exchange
        exchange.finish()  # the call ended now, not when a helper thread gets to it
        if len(exchange.request_body) + self.body_length >= _OFFLOAD_BYTES:
            return None
        limit = self.owner.max_decoded_body_bytes
        inline_limit = limit if limit < _OFFLOAD_BYTES else _OFFLOAD_BYTES
        line = raw_line_from_exchange(exchange, dialect=self.dialect, tracker=self.tracker, max_decoded_bytes=inline_limit)
        gap = line.get("response_decoding")
        if gap is not None and inline_limit < limit and gap["reason"] == "decoded_size_limit":
            return None  # a small compressed body that decodes past a MiB: decoded again, in full, off the loop
        return line

    async def _build_line_off_loop(self) -> dict[str, Any]:
        """Build the record on a record-builder thread (large bodies, or a compressed one that grows)."""
        exchange, limit = self.exchange, self.owner.max_decoded_body_bytes
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            _record_builders(),
            lambda: raw_line_from_exchange(exchange, dialect=self.dialect, tracker=self.tracker, max_decoded_bytes=limit),
        )

    async def _reject(self, send: Send, rejected: _RejectedRequest) -> None:
        self.exchange.status_code = 400
        payload = _error_body(str(rejected), "invalid_model_sampling")
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


class _RejectedRequest(Exception):
    """A request llmtap itself must refuse (a malformed sampling segment)."""


class _ClientLeft(Exception):
    """The client disconnected before its request body ended: nothing is forwarded."""


class _BodyRefused(Exception):
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


async def _read_body(receive: Receive, call: _CapturedCall) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            call.client_gone = True
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    call.exchange.request_body = body
    return body


def _replay_receive(body: bytes, receive: Receive, call: _CapturedCall) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        message = await receive()
        if message["type"] == "http.disconnect":
            call.client_gone = True
        return message

    return replay


def _raw_target(scope: Scope) -> str:
    """The path as the client encoded it: `raw_path`, or the decoded path encoded afresh without it."""
    raw_path = scope.get("raw_path")
    if isinstance(raw_path, bytes) and raw_path:
        return raw_path.decode("latin-1")
    return quote(scope["path"])


def _header(scope: Scope, name: str) -> str | None:
    wanted = name.encode("latin-1")
    for key, value in scope.get("headers", []):
        if key.lower() == wanted:
            return str(value.decode("latin-1"))
    return None


def _with_content_length(scope: Scope, length: int) -> Scope:
    headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in (b"content-length", b"transfer-encoding")]
    headers.append((b"content-length", str(length).encode("ascii")))
    return {**scope, "headers": headers}


def _error_body(message: str, code: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "code": code}})


async def _send_body(send: Send, status: int, payload: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": payload, "more_body": False})


async def _send_json_error(send: Send, status: int, message: str, code: str) -> None:
    await _send_body(send, status, _error_body(message, code))
