"""Hook for aiohttp's client.

Choke point: `ClientSession._request`, the coroutine behind `session.get/post/request` and the
`async with session.post(...)` context managers; redirects and retries are handled inside it, so
one call gives one record.

The body tee: aiohttp's `StreamReader` has `__slots__`, so a single response's reader cannot be
wrapped. Instead `StreamReader.feed_data` and `set_exception` are patched once, and look the reader
up in a small table that only holds readers of captured calls (an empty table costs one check).
Bytes that arrived together with the headers, before `_request` returned, are taken from the
reader's buffer. The record ends when the body has been fully received (the reader's public
`on_eof` callback), on an error, on `release()`/`close()`, or when the response is collected.
aiohttp decompresses before feeding the reader, so the teed bytes are the decoded body.
"""

from __future__ import annotations

import functools
import weakref
from types import ModuleType
from typing import Any, Callable

from .base import Hook, Patch, claim_call, inside_hooked_call, recorded_answer, release_call
from .network import NetworkTimer, network_timer, timed_async
from .session import CapturedCall, active_session, open_call

__all__ = ["AiohttpHook"]

# id(StreamReader) -> the call its bytes belong to; entries leave at end of body, release or GC.
_TEED: dict[int, CapturedCall] = {}


def _request_body(session: Any, kwargs: dict[str, Any]) -> bytes | None:
    data, json_value = kwargs.get("data"), kwargs.get("json")
    if json_value is not None:
        dumps_bytes = getattr(session, "_json_serialize_bytes", None)
        if dumps_bytes is not None:
            return bytes(dumps_bytes(json_value))
        text = session._json_serialize(json_value)  # the same serializer the session sends with
        return text.encode("utf-8") if isinstance(text, str) else bytes(text)
    if data is None:
        return b""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, str):
        return data.encode("utf-8")
    return None  # form data, a payload object or a stream: not serialized twice


def _timer(method: str, str_or_url: Any) -> NetworkTimer | None:
    """Time a request that is not a model call, for its network event (its body size is not known here)."""
    try:
        from yarl import URL

        url = URL(str_or_url)
        return network_timer("aiohttp", method, url.scheme, url.host, url.port, url.path, None)
    except Exception:
        return None


def _open(session: Any, method: str, str_or_url: Any, kwargs: dict[str, Any]) -> CapturedCall | None:
    build = getattr(session, "_build_url", None)
    if build is not None:
        url = build(str_or_url)
    else:
        from yarl import URL

        url = URL(str_or_url)
    headers = kwargs.get("headers") or {}
    return open_call("aiohttp", method, url.host, url.port, url.path, headers, _request_body(session, kwargs))


def _end(reader_id: int, call: CapturedCall, how: str, exc: BaseException | None = None) -> None:
    if _TEED.get(reader_id) is call:
        del _TEED[reader_id]
    if call.done:
        return
    if how == "collected":
        call.finish_unattended(how)
    else:
        call.finish(how, exc)


def _attach(call: CapturedCall, session: Any, response: Any, kwargs: dict[str, Any]) -> None:
    try:
        decoded = kwargs.get("auto_decompress")
        if decoded is None:
            decoded = getattr(session, "_auto_decompress", True)
        call.set_response(response.status, response.headers, decoded=bool(decoded))
        request_info = getattr(response, "request_info", None)
        if request_info is not None:  # the headers actually sent, session defaults included
            call.request_headers = list(request_info.headers.items())
        reader = response.content
        buffered = getattr(reader, "_buffer", None)
        if buffered is None or not hasattr(reader, "on_eof"):
            call.finish("eof")  # no body reader (an empty payload)
            return
        reader_id = id(reader)
        for chunk in list(buffered):
            call.add_chunk(chunk)
        _TEED[reader_id] = call
        reader.on_eof(functools.partial(_end, reader_id, call, "eof"))  # runs now if already at EOF
        for name in ("release", "close"):
            original = getattr(response, name)
            setattr(response, name, _ending(original, reader_id, call, name))
        weakref.finalize(response, _end, reader_id, call, "collected")
    except Exception as exc:
        call.session.failure("hook_failed", call.hook, exc)
        call.finish_unattended("hook_failed")


def _ending(original: Callable[..., Any], reader_id: int, call: CapturedCall, how: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def end_first(*args: Any, **kwargs: Any) -> Any:
        # End the record before aiohttp fails the unread body with its own "connection closed".
        if not call.done:
            _TEED.pop(reader_id, None)
            call.finish_unattended(how)
        return original(*args, **kwargs)

    return end_first


def _request(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def request(self: Any, method: str, str_or_url: Any, **kwargs: Any) -> Any:
        if inside_hooked_call() or active_session() is None:
            return await original(self, method, str_or_url, **kwargs)
        token = claim_call()
        try:
            try:
                call = _open(self, method, str_or_url, kwargs)
            except Exception:  # a URL aiohttp itself will reject: let it say so
                call = None
            if call is None:
                return await timed_async(_timer(method, str_or_url), original, self, method, str_or_url, **kwargs)
            try:
                answer = recorded_answer(call)
                if answer is None:
                    response = await original(self, method, str_or_url, **kwargs)
                else:  # a replay answers from the recording
                    from ..replay.responses import aiohttp_response

                    response = await aiohttp_response(self, method, str_or_url, answer, kwargs)
            except BaseException as exc:
                await call.afinish("error", exc)
                raise
            _attach(call, self, response, kwargs)
            return response
        finally:
            release_call(token)

    return request


def _feed_data(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def feed_data(self: Any, data: bytes, *args: Any, **kwargs: Any) -> Any:
        result = original(self, data, *args, **kwargs)
        if _TEED:
            call = _TEED.get(id(self))
            if call is not None:
                call.add_chunk(data)
        return result

    return feed_data


def _set_exception(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def set_exception(self: Any, exc: BaseException, *args: Any, **kwargs: Any) -> Any:
        result = original(self, exc, *args, **kwargs)
        if _TEED:
            call = _TEED.get(id(self))
            if call is not None:
                _end(id(self), call, "error", exc)
        return result

    return set_exception


class AiohttpHook(Hook):
    """Captures model calls made with aiohttp client sessions."""

    name = "aiohttp"
    module_name = "aiohttp"

    def _make_patches(self, module: ModuleType) -> list[Patch]:
        reader = module.streams.StreamReader
        return [
            Patch(module.client.ClientSession, "_request", _request),
            Patch(reader, "feed_data", _feed_data),
            Patch(reader, "set_exception", _set_exception),
        ]
