"""Hooks for httpx and httpx2 (openai 3.x and anthropic 2.x build httpx2 clients by default).

Choke point: `Client.send` and `AsyncClient.send`. Every public request method (`get`, `post`,
`stream`, `request`, the module-level `httpx.post`) and every SDK built on httpx ends in `send`,
whatever transport the client uses (the default pool, a proxy, a custom or mock transport), and
`send` is called once per call however many redirects or auth round-trips happen inside it. The
transports' `handle_request` would see each redirect hop as a call and miss custom transports.

The wrapper asks the original `send` for a streamed response, puts a tee around the response
byte stream (raw wire bytes, with their arrival times), and then, if the caller did not ask for
a stream, reads the body exactly as httpx's own `send` would (closing the response if that
fails). The record is finished when the body is fully read, the response closed, or the stream
garbage-collected. httpcore below is never hooked, so a call is recorded once. An error response
closed before its body was read (the openai SDK closes a streamed 500 unread and retries) first
has up to `DRAIN_LIMIT` bytes of its body read into the record. A request that is not a model
call leaves a network event (`hooks.network`).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Iterator
from types import ModuleType
from typing import Any

from .base import Hook, Patch, claim_call, inside_hooked_call, recorded_answer, release_call
from .network import NetworkTimer, network_timer, timed, timed_async
from .session import CapturedCall, active_session, open_call

__all__ = ["Httpx2Hook", "HttpxHook"]

_DEFAULT_PORTS = {"http": 80, "https": 443}
DRAIN_LIMIT = 64 * 1024  # bytes of an unread error body read at close, so its record keeps it


def _open(hook: str, request: Any) -> CapturedCall | None:
    try:
        url = request.url
        try:
            body: bytes | None = request.content
        except Exception:  # a streaming upload not read yet: recorded without its body
            body = None
        port = url.port or _DEFAULT_PORTS.get(url.scheme)
        return open_call(hook, request.method, url.host, port, url.path, request.headers.raw, body)
    except Exception:  # an unusual request object: not captured, and httpx decides what happens
        return None


def _timer(hook: str, request: Any) -> NetworkTimer | None:
    """Time a request that is not a model call, for its network event."""
    try:
        url = request.url
        length = request.headers.get("content-length")
        size = int(length) if length is not None and length.isdigit() else None
        return network_timer(hook, request.method, url.scheme, url.host, url.port or _DEFAULT_PORTS.get(url.scheme), url.path, size)
    except Exception:
        return None


def _sync_tee_class(base: type) -> type:
    class TeeSyncStream(base):  # type: ignore[misc]
        """Passes the response bytes through unchanged and shows each chunk to the call.

        The tee lets go of its call as soon as the call ends, so a response the caller keeps
        does not keep the call's Exchange (a copy of both bodies) alive with it. Slots, not an
        instance dict: see `_finish_collected`.
        """

        __slots__ = ("_call", "_inner")

        def __init__(self, inner: Any, call: CapturedCall) -> None:
            self._inner = inner
            self._call: CapturedCall | None = call

        def __iter__(self) -> Iterator[bytes]:
            call = self._call
            if call is None:  # the call has already ended: nothing left to record
                yield from self._inner
                return
            try:
                for chunk in self._inner:
                    call.add_chunk(chunk)
                    yield chunk
            except GeneratorExit:
                self._call = None
                call.finish_unattended("abandoned")
                raise
            except BaseException as exc:
                self._call = None
                call.finish("error", exc)
                raise
            self._call = None
            call.finish("eof")

        def close(self) -> None:
            call, self._call = self._call, None
            try:
                if call is not None and _unread_error(call):
                    _drain_sync(self._inner, call)
                self._inner.close()
            finally:
                if call is not None:
                    call.finish("closed")

        def __del__(self) -> None:
            _finish_collected(self)

    return TeeSyncStream


def _async_tee_class(base: type) -> type:
    class TeeAsyncStream(base):  # type: ignore[misc]
        """Async twin of the sync tee."""

        __slots__ = ("_call", "_inner")

        def __init__(self, inner: Any, call: CapturedCall) -> None:
            self._inner = inner
            self._call: CapturedCall | None = call

        async def __aiter__(self) -> AsyncIterator[bytes]:
            call = self._call
            if call is None:
                async for chunk in self._inner:
                    yield chunk
                return
            try:
                async for chunk in self._inner:
                    call.add_chunk(chunk)
                    yield chunk
            except GeneratorExit:
                self._call = None
                call.finish_unattended("abandoned")
                raise
            except BaseException as exc:
                self._call = None
                await call.afinish("error", exc)
                raise
            self._call = None
            await call.afinish("eof")

        async def aclose(self) -> None:
            call, self._call = self._call, None
            try:
                if call is not None and _unread_error(call):
                    await _drain_async(self._inner, call)
                await self._inner.aclose()
            finally:
                if call is not None:
                    await call.afinish("closed")

        def __del__(self) -> None:
            _finish_collected(self)

    return TeeAsyncStream


def _unread_error(call: CapturedCall) -> bool:
    """An error response closed before its body was read (an SDK about to retry a 500)."""
    status = call.exchange.status_code
    return isinstance(status, int) and status >= 400


def _drain_sync(inner: Any, call: CapturedCall) -> None:
    """Read up to DRAIN_LIMIT more bytes of an error body into the record before it is closed; never raises."""
    left = DRAIN_LIMIT
    try:
        for chunk in inner:
            call.add_chunk(chunk)
            left -= len(chunk)
            if left <= 0:
                break
    except Exception:  # the body could not be read: the record keeps what it has
        return


async def _drain_async(inner: Any, call: CapturedCall) -> None:
    """The async twin of `_drain_sync`."""
    left = DRAIN_LIMIT
    iterator = inner.__aiter__()
    try:
        while left > 0:
            chunk = await iterator.__anext__()
            call.add_chunk(chunk)
            left -= len(chunk)
    except Exception:  # StopAsyncIteration at the end, or a body that could not be read
        pass
    finally:
        close = getattr(iterator, "aclose", None)
        if close is not None:
            try:
                await close()
            except Exception:
                pass


def _finish_collected(tee: Any) -> None:
    """Record a stream that was garbage-collected before it was read to its end.

    httpx's response and its stream refer to each other, so a tee usually dies in a garbage
    collection, as the finalizer of an object in that cycle. Such a finalizer must leave no new
    reference to the cycle behind: reading `tee.__dict__` here once did (Python 3.11 keeps
    attributes inline and builds the dict on demand, holding the cycle's members), so the
    collector took each response as resurrected and moved its objects to an older generation
    instead of freeing them, where many piled up until the next full collection (docs/benchmarks.md,
    "In-process capture"). The
    tee keeps its attributes in slots, and this only reads one and ends the call.
    """
    call = getattr(tee, "_call", None)  # absent if __init__ never ran
    if call is not None and not call.done:
        call.finish_unattended("collected")


def _attach(call: CapturedCall, response: Any, tee: type) -> None:
    """Put the tee around the response stream; on any failure the call is dropped, never the response."""
    try:
        call.set_response(response.status_code, response.headers.raw)
        try:
            content = response.content  # a transport that answers whole (mock, ASGI) has read it already
        except Exception:
            response.stream = tee(response.stream, call)
            return
        call.mark_body_decoded()  # `content` is after content decoding
        call.add_chunk(content)
        call.finish("eof")
    except Exception as exc:
        call.session.failure("hook_failed", call.hook, exc)
        call.finish_unattended("hook_failed")


def _replayed_response(hook: str, request: Any, answer: Any, *, asynchronous: bool) -> Any:
    from ..replay.responses import httpx_response

    return httpx_response(hook, request, answer, asynchronous=asynchronous)


def _sync_send(hook: str, tee: type, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        if inside_hooked_call() or active_session() is None:
            return original(self, request, *args, **kwargs)
        token = claim_call()
        try:
            call = _open(hook, request)
            if call is None:
                return timed(_timer(hook, request), original, self, request, *args, **kwargs)
            wants_stream = kwargs.get("stream", False)
            kwargs["stream"] = True
            try:
                answer = recorded_answer(call)
                if answer is None:
                    response = original(self, request, *args, **kwargs)
                else:  # a replay answers from the recording; the tee below captures it like any response
                    response = _replayed_response(hook, request, answer, asynchronous=False)
            except BaseException as exc:
                call.finish("error", exc)
                raise
            _attach(call, response, tee)
            if not wants_stream:
                try:
                    response.read()
                except BaseException:
                    response.close()
                    raise
            return response
        finally:
            release_call(token)

    return send


def _async_send(hook: str, tee: type, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        if inside_hooked_call() or active_session() is None:
            return await original(self, request, *args, **kwargs)
        token = claim_call()
        try:
            call = _open(hook, request)
            if call is None:
                return await timed_async(_timer(hook, request), original, self, request, *args, **kwargs)
            wants_stream = kwargs.get("stream", False)
            kwargs["stream"] = True
            try:
                answer = recorded_answer(call)
                if answer is None:
                    response = await original(self, request, *args, **kwargs)
                else:
                    response = _replayed_response(hook, request, answer, asynchronous=True)
            except BaseException as exc:
                await call.afinish("error", exc)
                raise
            _attach(call, response, tee)
            if not wants_stream:
                try:
                    await response.aread()
                except BaseException:
                    await response.aclose()
                    raise
            return response
        finally:
            release_call(token)

    return send


class HttpxHook(Hook):
    """Captures model calls made with httpx clients."""

    name = "httpx"
    module_name = "httpx"

    def _make_patches(self, module: ModuleType) -> list[Patch]:
        sync_tee = _sync_tee_class(module.SyncByteStream)
        async_tee = _async_tee_class(module.AsyncByteStream)
        return [
            Patch(module.Client, "send", functools.partial(_sync_send, self.name, sync_tee)),
            Patch(module.AsyncClient, "send", functools.partial(_async_send, self.name, async_tee)),
        ]


class Httpx2Hook(HttpxHook):
    """Captures model calls made with httpx2 clients (same API as httpx, separate classes)."""

    name = "httpx2"
    module_name = "httpx2"
