"""Hook for the standard library's `http.client` (what `urllib.request` and hand-rolled clients use).

Choke points: `HTTPConnection.request` opens the call (method, host, port, path, headers, a bytes
body), `HTTPConnection.getresponse` attaches it to the response (status, headers), and the
response's reads (`read`, `read1`, `readinto`, `readline`) show it each piece of the body as the
caller reads it; the call ends at the end of the body or when the response is closed. An error
response closed unread (a client that retries a 500 without reading it) still leaves its body
in the record: `close` first reads up to `DRAIN_LIMIT` bytes of it.

A library built on top (urllib3, hence requests) claims its calls itself, so this layer passes
them through (`hooks.base`): one record per call. A request the registry does not know leaves a
network event (`hooks.network`). Never raises into the caller: a failure here drops the record.
"""

from __future__ import annotations

from typing import Any

from .base import Hook, Patch, claim_call, inside_hooked_call, release_call
from .call import CapturedCall
from .network import NetworkTimer, content_length, network_timer
from .session import active_session, open_call

__all__ = ["DRAIN_LIMIT", "HttpClientHook"]

DRAIN_LIMIT = 64 * 1024  # bytes of an unread error body read at close, for its record
_CALL = "_llmtap_call"
_TIMER = "_llmtap_timer"
_BUSY = "_llmtap_busy"


def _path(url: Any) -> str:
    text = url if isinstance(url, str) else str(url)
    if "://" in text:
        from urllib.parse import urlsplit

        return urlsplit(text).path or "/"
    return text.split("?", 1)[0].split("#", 1)[0] or "/"


def _body(body: Any) -> bytes | None:
    if body is None:
        return b""
    if isinstance(body, (bytes, bytearray)):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("latin-1", "replace")  # what http.client itself sends for a str body
    return None  # a file or an iterable: sent as it is, recorded without it


def _make_request(original: Any) -> Any:
    def request(self: Any, method: str, url: str, body: Any = None, headers: Any = None, **kwargs: Any) -> Any:
        if inside_hooked_call() or active_session() is None:
            return original(self, method, url, body, {} if headers is None else headers, **kwargs)
        token = claim_call()  # the connect inside is this layer's: the socket watch must not count it
        try:
            try:
                path = _path(url)
                call = open_call("http.client", method, self.host, self.port, path, headers or {}, _body(body))
                if call is None:
                    size = len(body) if isinstance(body, (bytes, bytearray, str)) else 0 if body is None else None
                    scheme = "https" if hasattr(self, "_context") else "http"
                    setattr(self, _TIMER, network_timer("http.client", method, scheme, self.host, self.port, path, size))
                else:
                    setattr(self, _CALL, call)
            except Exception:
                call = None
            try:
                return original(self, method, url, body, {} if headers is None else headers, **kwargs)
            except BaseException as exc:
                _end_connection_call(self, exc)
                raise
        finally:
            release_call(token)

    return request


def _end_connection_call(connection: Any, exc: BaseException) -> None:
    call: CapturedCall | None = connection.__dict__.pop(_CALL, None)
    timer: NetworkTimer | None = connection.__dict__.pop(_TIMER, None)
    if call is not None:
        call.finish("error", exc)
    if timer is not None:
        timer.done(error=exc)


def _make_getresponse(original: Any) -> Any:
    def getresponse(self: Any) -> Any:
        if _CALL not in self.__dict__ and _TIMER not in self.__dict__:
            return original(self)
        token = claim_call()
        try:
            response = original(self)
        except BaseException as exc:
            _end_connection_call(self, exc)
            raise
        finally:
            release_call(token)
        call: CapturedCall | None = self.__dict__.pop(_CALL, None)
        timer: NetworkTimer | None = self.__dict__.pop(_TIMER, None)
        try:
            if timer is not None:
                timer.done(response.status, content_length(response.headers))
            if call is not None:
                call.set_response(response.status, response.getheaders())
                response.__dict__[_CALL] = call
        except Exception as exc:
            if call is not None:
                call.session.failure("hook_failed", call.hook, exc)
                call.finish_unattended("hook_failed")
        return response

    return getresponse


def _after_read(response: Any, call: CapturedCall, data: bytes | None, asked: Any) -> None:
    if data:
        call.add_chunk(data)
    elif data is not None and asked != 0:
        _finish(response, call, "eof")
        return
    if response.fp is None:  # http.client closes the response once its body is complete
        _finish(response, call, "eof")


def _finish(response: Any, call: CapturedCall, how: str) -> None:
    response.__dict__.pop(_CALL, None)
    call.finish(how)


def _make_reader(original: Any) -> Any:
    def read(self: Any, *args: Any, **kwargs: Any) -> Any:
        call: CapturedCall | None = self.__dict__.get(_CALL)
        if call is None or self.__dict__.get(_BUSY):
            return original(self, *args, **kwargs)
        self.__dict__[_BUSY] = True
        try:
            result = original(self, *args, **kwargs)
        except BaseException as exc:
            self.__dict__.pop(_CALL, None)
            call.finish("error", exc)
            raise
        finally:
            self.__dict__[_BUSY] = False
        try:
            asked = args[0] if args else kwargs.get("amt", kwargs.get("n", -1))
            _after_read(self, call, result if isinstance(result, bytes) else None, asked)
        except Exception as exc:
            call.session.failure("hook_failed", call.hook, exc)
        return result

    return read


def _make_readinto(original: Any) -> Any:
    def readinto(self: Any, buffer: Any) -> Any:
        call: CapturedCall | None = self.__dict__.get(_CALL)
        if call is None or self.__dict__.get(_BUSY):
            return original(self, buffer)
        self.__dict__[_BUSY] = True
        try:
            count = original(self, buffer)
        except BaseException as exc:
            self.__dict__.pop(_CALL, None)
            call.finish("error", exc)
            raise
        finally:
            self.__dict__[_BUSY] = False
        try:
            _after_read(self, call, bytes(memoryview(buffer)[:count]) if count else b"", len(buffer))
        except Exception as exc:
            call.session.failure("hook_failed", call.hook, exc)
        return count

    return readinto


def _make_close(original: Any) -> Any:
    def close(self: Any) -> Any:
        call: CapturedCall | None = self.__dict__.pop(_CALL, None)
        if call is not None:
            _drain(self, call)
        try:
            return original(self)
        finally:
            if call is not None:
                call.finish("closed")

    return close


def _drain(response: Any, call: CapturedCall) -> None:
    """Read (a bounded amount of) an error body nobody read, so its record keeps it; never raises."""
    try:
        status = getattr(response, "status", None)
        if not isinstance(status, int) or status < 400 or response.fp is None:
            return
        left = DRAIN_LIMIT
        response.__dict__[_BUSY] = True  # our own read below passes through the read hook
        try:
            while left > 0 and response.fp is not None:
                data = response.read(min(left, 16384))
                if not data:
                    break
                call.add_chunk(data)
                left -= len(data)
        finally:
            response.__dict__[_BUSY] = False
    except Exception:
        pass


class HttpClientHook(Hook):
    """Captures model calls made with `http.client` directly (urllib.request, hand-rolled clients)."""

    name = "http.client"
    module_name = "http.client"

    def _make_patches(self, module: Any) -> list[Patch]:
        connection, response = module.HTTPConnection, module.HTTPResponse
        return [
            Patch(connection, "request", _make_request),
            Patch(connection, "getresponse", _make_getresponse),
            Patch(response, "read", _make_reader),
            Patch(response, "read1", _make_reader),
            Patch(response, "readline", _make_reader),
            Patch(response, "readinto", _make_readinto),
            Patch(response, "close", _make_close),
        ]
