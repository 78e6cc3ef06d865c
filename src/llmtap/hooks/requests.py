"""Hook for requests.

Choke point: `Session.send`. The module-level helpers (`requests.post`, ...) build a Session and
call `Session.request`, which prepares the request and calls `send`; an SDK that keeps its own
Session also calls `send`. Redirects re-enter `send` from inside it, and the adapter below goes
through urllib3's `urlopen`: the claim `send` holds makes both inner layers pass through, so one
call gives one record.

`HTTPAdapter.build_response` (also patched) is where the body tee goes in: it is the moment the
urllib3 response becomes the requests Response, before `send` reads the content itself (when not
streaming). Intermediate redirect responses are not teed; the final response is.
"""

from __future__ import annotations

import functools
from contextvars import ContextVar
from types import ModuleType
from typing import Any, Callable
from urllib.parse import urlsplit

from .base import Hook, Patch, claim_call, inside_hooked_call, recorded_answer, release_call
from .network import NetworkTimer, network_timer, timed
from .session import CapturedCall, active_session, open_call
from .urllib3 import tee_urllib3_response

__all__ = ["RequestsHook"]

_DEFAULT_PORTS = {"http": 80, "https": 443}
_CURRENT_CALL: ContextVar[CapturedCall | None] = ContextVar("llmtap_requests_call", default=None)


def _body(request: Any) -> bytes | None:
    body = request.body
    if body is None:
        return b""
    if isinstance(body, (bytes, bytearray)):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    return None  # a streaming upload (file, generator): not read twice


def _open(request: Any) -> CapturedCall | None:
    try:
        parts = urlsplit(request.url)
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except (TypeError, ValueError):  # a malformed URL or port: requests will report it, not us
        return None
    return open_call("requests", request.method or "GET", parts.hostname, port, parts.path or "/", request.headers, _body(request))


def _tee(call: CapturedCall, response: Any) -> None:
    raw = response.raw
    call.restart_response()
    call.set_response(response.status_code, getattr(raw, "headers", response.headers))
    token = object()
    call.hook_state = token
    if hasattr(raw, "read") and hasattr(raw, "read_chunked"):
        tee_urllib3_response(raw, call, token)


def _build_response(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def build_response(self: Any, req: Any, resp: Any) -> Any:
        response = original(self, req, resp)
        call = _CURRENT_CALL.get()
        if call is not None and not call.done:
            try:
                if not response.is_redirect:
                    _tee(call, response)
            except Exception as exc:
                call.session.failure("hook_failed", call.hook, exc)
                call.finish_unattended("hook_failed")
        return response

    return build_response


def _finish_untouched(call: CapturedCall, response: Any) -> None:
    """A response the tee never saw (a redirect not followed, or a non-urllib3 adapter)."""
    if call.hook_state is None:
        _tee(call, response)
    content = response.__dict__.get("_content")
    if not call.done and isinstance(content, bytes) and not call.exchange.response_chunks:
        call.mark_body_decoded()  # requests hands out decompressed content
        call.add_chunk(content)
        call.finish("eof")


def _timer(request: Any) -> NetworkTimer | None:
    """Time a request that is not a model call, for its network event."""
    try:
        parts = urlsplit(request.url)
        length = request.headers.get("Content-Length")
        size = int(length) if isinstance(length, str) and length.isdigit() else None
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
        return network_timer("requests", request.method or "GET", parts.scheme, parts.hostname, port, parts.path, size)
    except Exception:
        return None


def _send(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def send(self: Any, request: Any, **kwargs: Any) -> Any:
        if inside_hooked_call() or active_session() is None:
            return original(self, request, **kwargs)
        token = claim_call()
        try:
            call = _open(request)
            if call is None:
                return timed(_timer(request), original, self, request, **kwargs)
            current = _CURRENT_CALL.set(call)
            try:
                answer = recorded_answer(call)
                if answer is None:
                    response = original(self, request, **kwargs)
                else:  # a replay answers from the recording, through the adapter's own build_response
                    from ..replay.responses import requests_response

                    response = requests_response(self, request, answer, kwargs)
            except BaseException as exc:
                call.finish("error", exc)
                raise
            finally:
                _CURRENT_CALL.reset(current)
            try:
                if not call.done:
                    _finish_untouched(call, response)
            except Exception as exc:
                call.session.failure("hook_failed", call.hook, exc)
                call.finish_unattended("hook_failed")
            return response
        finally:
            release_call(token)

    return send


class RequestsHook(Hook):
    """Captures model calls made with requests."""

    name = "requests"
    module_name = "requests"

    def _make_patches(self, module: ModuleType) -> list[Patch]:
        return [
            Patch(module.sessions.Session, "send", _send),
            Patch(module.adapters.HTTPAdapter, "build_response", _build_response),
        ]
