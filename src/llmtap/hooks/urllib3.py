"""Hook for urllib3 (direct users, and boto3/botocore, so Bedrock runtime calls are seen).

Choke point: `HTTPConnectionPool.urlopen`, which every urllib3 request passes through (a
`PoolManager` picks a pool and calls it; `HTTPSConnectionPool` inherits it). requests also ends
here, but its own hook claims the call first, so urllib3 passes it through: one record per call.

The body is teed by wrapping, on the one response object, the two methods every body read ends
in (`read` and `read_chunked`; `stream()`, `data`, `readinto` and io wrappers all go through
them). A response urllib3 already preloaded (`preload_content=True`, the default) is recorded at
once from its cached body. The record ends at end of body, on close/release, or when the
response is garbage-collected.
"""

from __future__ import annotations

import functools
import weakref
from types import ModuleType
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit

from .base import Hook, Patch, claim_call, inside_hooked_call, recorded_answer, release_call
from .network import NetworkTimer, network_timer, timed
from .session import CapturedCall, active_session, open_call

__all__ = ["Urllib3Hook", "tee_urllib3_response"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _request_body(body: Any) -> bytes | None:
    if body is None:
        return b""
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    return None  # a file or generator upload: not read twice


def _exhausted(raw: Any) -> bool:
    try:
        return bool(raw.closed) and not len(getattr(raw, "_decoded_buffer", b"") or b"")
    except Exception:
        return False


def tee_urllib3_response(raw: Any, call: CapturedCall, token: object) -> None:
    """Show every body byte read from urllib3 response `raw` to `call`, while `call.hook_state is token`.

    The caller sets `call.hook_state = token`; a redirect hop that replaces it switches the tee off.
    The wrappers live on `raw` and reach its own methods weakly: a cycle through them would leave
    `raw` to the garbage collector, which may finalize the socket of a response released unread
    before its file object closes it (an unclosed-socket ResourceWarning, and the descriptor held
    until a collection).
    """
    raw_ref = weakref.ref(raw)
    read_original = _weakly(raw.read)
    read_chunked_original = _weakly(raw.read_chunked)
    default_decode = bool(getattr(raw, "decode_content", True))
    reading = [0]  # read() may release the connection itself at end of body: that is not an early end

    def live() -> bool:
        return call.hook_state is token and not call.done

    def note_decoding(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        decode = kwargs.get("decode_content", args[1] if len(args) > 1 else None)
        if decode if decode is not None else default_decode:
            call.mark_body_decoded()

    def read(*args: Any, **kwargs: Any) -> Any:
        if not live():
            return read_original()(*args, **kwargs)
        reading[0] += 1
        try:
            data = read_original()(*args, **kwargs)
        except BaseException as exc:
            if live():
                call.finish("error", exc)
            raise
        finally:
            reading[0] -= 1
        if live():
            note_decoding(args, kwargs)
            call.add_chunk(data)
            current = raw_ref()
            amount = kwargs.get("amt", args[0] if args else None)
            if (not data and amount != 0) or amount is None or (current is not None and _exhausted(current)):
                call.finish("eof")
        return data

    def read_chunked(*args: Any, **kwargs: Any) -> Iterator[bytes]:
        if not live():
            yield from read_chunked_original()(*args, **kwargs)
            return
        try:
            for chunk in _counted(read_chunked_original()(*args, **kwargs), reading):
                if live():
                    note_decoding(args, kwargs)
                    call.add_chunk(chunk)
                yield chunk
        except GeneratorExit:
            if live():
                call.finish_unattended("abandoned")
            raise
        except BaseException as exc:
            if live():
                call.finish("error", exc)
            raise
        if live():
            call.finish("eof")

    def ending(name: str) -> Callable[..., Any] | None:
        method = getattr(raw, name, None)
        if method is None:
            return None
        original = _weakly(method)

        def end_then(*args: Any, **kwargs: Any) -> Any:
            try:
                method = original()  # None only while a collector is freeing `raw`: nothing left to call
                return None if method is None else method(*args, **kwargs)
            finally:
                # May run from io's __del__ during garbage collection: never block here.
                if live() and not reading[0]:
                    call.finish_unattended(name)

        return end_then

    raw.read = read
    raw.read_chunked = read_chunked
    for name in ("close", "release_conn", "drain_conn"):
        wrapper = ending(name)
        if wrapper is not None:
            setattr(raw, name, wrapper)
    weakref.finalize(raw, _collected, call, token)


def _weakly(method: Any) -> Callable[[], Any]:
    """A way back to a bound method that does not keep its object alive; any other callable is kept as it is."""
    try:
        return weakref.WeakMethod(method)
    except TypeError:
        return lambda: method


def _counted(chunks: Iterator[bytes], reading: list[int]) -> Iterator[bytes]:
    """Iterate `chunks`, counting the time spent inside the library's own read as `reading`."""
    iterator = iter(chunks)
    while True:
        reading[0] += 1
        try:
            chunk = next(iterator)
        except StopIteration:
            return
        finally:
            reading[0] -= 1
        yield chunk


def _collected(call: CapturedCall, token: object) -> None:
    if call.hook_state is token and not call.done:
        call.finish_unattended("collected")


def _urlopen(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def urlopen(self: Any, method: str, url: str, body: Any = None, headers: Any = None, *args: Any, **kwargs: Any) -> Any:
        if inside_hooked_call() or active_session() is None:
            return original(self, method, url, body, headers, *args, **kwargs)
        token = claim_call()
        try:
            call = _open(self, method, url, body, headers)
            if call is None:
                timer = _timer(self, method, url, body)
                return timed(timer, original, self, method, url, body, headers, *args, **kwargs)
            try:
                answer = recorded_answer(call)
                if answer is None:
                    response = original(self, method, url, body, headers, *args, **kwargs)
                else:  # a replay answers from the recording
                    from ..replay.responses import urllib3_response

                    response = urllib3_response(method, url, answer, args, kwargs)
            except BaseException as exc:
                call.finish("error", exc)
                raise
            _record_response(call, response, args, kwargs)
            return response
        finally:
            release_call(token)

    return urlopen


def _timer(pool: Any, method: str, url: str, body: Any) -> NetworkTimer | None:
    """Time a request that is not a model call, for its network event."""
    try:
        scheme = getattr(pool, "scheme", "http")
        port = getattr(pool, "port", None) or _DEFAULT_PORTS.get(scheme)
        path = urlsplit(url).path if "://" in url else url.split("?", 1)[0]
        size = len(body) if isinstance(body, (bytes, bytearray, str)) else 0 if body is None else None
        return network_timer("urllib3", method, scheme, getattr(pool, "host", None), port, path or "/", size)
    except Exception:
        return None


def _open(pool: Any, method: str, url: str, body: Any, headers: Any) -> CapturedCall | None:
    try:
        scheme = getattr(pool, "scheme", "http")
        port = getattr(pool, "port", None) or _DEFAULT_PORTS.get(scheme)
        path = urlsplit(url).path if "://" in url else url.split("?", 1)[0]
    except (TypeError, ValueError, AttributeError):  # urllib3 itself will report a bad URL
        return None
    return open_call("urllib3", method, getattr(pool, "host", None), port, path or "/", headers or {}, _request_body(body))


def _record_response(call: CapturedCall, response: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Tee a streamed response, or record a preloaded one now; never disturbs the response."""
    try:
        # preload_content is the 9th parameter after (method, url, body, headers); callers pass it
        # by keyword in practice, and urllib3's default is True.
        preload = kwargs.get("preload_content", args[8] if len(args) > 8 else True)
        decode = kwargs.get("decode_content", args[9] if len(args) > 9 else True)
        call.set_response(response.status, response.headers, decoded=False)
        if preload:
            if decode:
                call.mark_body_decoded()
            call.add_chunk(response.data or b"")
            call.finish("eof")
            return
        token = object()
        call.hook_state = token
        tee_urllib3_response(response, call, token)
    except Exception as exc:
        call.session.failure("hook_failed", call.hook, exc)
        call.finish_unattended("hook_failed")


class Urllib3Hook(Hook):
    """Captures model calls made with urllib3 (and libraries over it that requests does not cover)."""

    name = "urllib3"
    module_name = "urllib3"

    def _make_patches(self, module: ModuleType) -> list[Patch]:
        pool = module.connectionpool.HTTPConnectionPool
        return [Patch(pool, "urlopen", _urlopen)]
