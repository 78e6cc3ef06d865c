"""Each HTTP library's own response object, built from a `RecordedAnswer`, for the hooks to hand back in a replay.

The hooks call these at their choke point instead of sending (see `hooks.base.recorded_answer`);
the response then goes through the same tee as a live one, so the replayed run is captured too.
Chunks come out one by one with their delays (`answers`), so a streaming caller reads the
recorded events at the recorded pace.

What is not replayed: the library's own work around the wire (httpx event hooks, auth and
redirect handling, requests' `response` hooks and cookie extraction), since the recorded answer
is the final response already.
"""

from __future__ import annotations

import asyncio
import datetime
import io
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from .answers import RecordedAnswer

__all__ = ["TimedReader", "httpx_response", "requests_response", "urllib3_response"]

_STREAM_CLASSES: dict[tuple[str, bool], type] = {}


class _Cursor:
    """Where a replayed body is: like a connection, what was read is gone, so a second iteration goes on, never restarts."""

    __slots__ = ("chunks", "position")

    def __init__(self, answer: RecordedAnswer) -> None:
        self.chunks = answer.chunks
        self.position = 0

    def next_chunk(self) -> tuple[float, bytes] | None:
        if self.position >= len(self.chunks):
            return None
        found = self.chunks[self.position]
        self.position += 1
        return found


def _sync_chunks(cursor: _Cursor) -> Iterator[bytes]:
    while (found := cursor.next_chunk()) is not None:
        delay, chunk = found
        if delay > 0:
            time.sleep(delay)
        if chunk:
            yield chunk


async def _async_chunks(cursor: _Cursor) -> AsyncIterator[bytes]:
    while (found := cursor.next_chunk()) is not None:
        delay, chunk = found
        if delay > 0:
            await asyncio.sleep(delay)
        if chunk:
            yield chunk


def _stream_class(module: Any, asynchronous: bool) -> type:
    """A byte-stream class of this httpx module (httpx or httpx2) that yields a recorded answer's chunks."""
    key = (module.__name__, asynchronous)
    found = _STREAM_CLASSES.get(key)
    if found is not None:
        return found
    if asynchronous:

        class RecordedAsyncStream(module.AsyncByteStream):  # type: ignore[misc]
            def __init__(self, answer: RecordedAnswer) -> None:
                self._cursor = _Cursor(answer)

            async def __aiter__(self) -> AsyncIterator[bytes]:
                async for chunk in _async_chunks(self._cursor):
                    yield chunk

        found = RecordedAsyncStream
    else:

        class RecordedSyncStream(module.SyncByteStream):  # type: ignore[misc]
            def __init__(self, answer: RecordedAnswer) -> None:
                self._cursor = _Cursor(answer)

            def __iter__(self) -> Iterator[bytes]:
                yield from _sync_chunks(self._cursor)

        found = RecordedSyncStream
    _STREAM_CLASSES[key] = found
    return found


def httpx_response(module_name: str, request: Any, answer: RecordedAnswer, *, asynchronous: bool) -> Any:
    """An unread httpx (or httpx2) `Response` for `request` with the recorded status, headers and chunks."""
    module = sys.modules[module_name]
    stream = _stream_class(module, asynchronous)(answer)
    response = module.Response(answer.status, headers=list(answer.headers), stream=stream, request=request)
    if isinstance(getattr(type(response), "elapsed", None), property) and type(response).elapsed.fset is not None:
        response.elapsed = datetime.timedelta(0)  # the library sets it when the body is closed; nothing was waited for
    return response


class TimedReader(io.RawIOBase):
    """A file-like body that hands out a recorded answer's chunks, waiting each chunk's delay before its first byte."""

    def __init__(self, answer: RecordedAnswer) -> None:
        self._chunks = list(answer.chunks)
        self._index = 0
        self._offset = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        while self._index < len(self._chunks):
            delay, chunk = self._chunks[self._index]
            if self._offset >= len(chunk):
                self._index += 1
                self._offset = 0
                continue
            if self._offset == 0 and delay > 0:
                time.sleep(delay)
            size = min(len(view), len(chunk) - self._offset)
            view[:size] = chunk[self._offset : self._offset + size]
            self._offset += size
            return size
        return 0


def urllib3_response(method: str, url: str, answer: RecordedAnswer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A urllib3 `HTTPResponse` as `urlopen` would return it (preloaded or not, as the caller asked)."""
    import urllib3

    preload = kwargs.get("preload_content", args[8] if len(args) > 8 else True)
    decode = kwargs.get("decode_content", args[9] if len(args) > 9 else True)
    return urllib3.HTTPResponse(
        body=TimedReader(answer),
        headers=urllib3.HTTPHeaderDict(list(answer.headers)),
        status=answer.status,
        preload_content=bool(preload),
        decode_content=bool(decode),
        request_method=method,
        request_url=url,
    )


def requests_response(session: Any, request: Any, answer: RecordedAnswer, kwargs: dict[str, Any]) -> Any:
    """A requests `Response` built by the session's adapter from the recorded answer, read unless streaming."""
    import urllib3

    raw = urllib3.HTTPResponse(
        body=TimedReader(answer),
        headers=urllib3.HTTPHeaderDict(list(answer.headers)),
        status=answer.status,
        preload_content=False,
        decode_content=False,
        request_method=request.method,
        request_url=request.url,
    )
    adapter = session.get_adapter(url=request.url)
    response = adapter.build_response(request, raw)
    response.elapsed = datetime.timedelta(0)
    if not kwargs.get("stream"):
        _ = response.content
    return response


class _SentRequest:
    """Stands for aiohttp's request writer of a request already sent (the replay sent nothing)."""

    output_size = 0


async def aiohttp_response(session: Any, method: str, str_or_url: Any, answer: RecordedAnswer, kwargs: dict[str, Any]) -> Any:
    """An aiohttp `ClientResponse` with the recorded status and headers, its body fed to its reader chunk by chunk.

    Built the way aiohttp's own `start()` fills a response from a parsed message; there is no
    connection behind it, so `release()` and `close()` have nothing to return to a pool.
    """
    import http

    import aiohttp
    from aiohttp.base_protocol import BaseProtocol
    from aiohttp.client_reqrep import ClientResponse, RequestInfo
    from aiohttp.streams import StreamReader
    from multidict import CIMultiDict, CIMultiDictProxy
    from yarl import URL

    loop = asyncio.get_running_loop()
    build = getattr(session, "_build_url", None)
    url = build(str_or_url) if build is not None else URL(str_or_url)
    sent = CIMultiDictProxy(CIMultiDict(kwargs.get("headers") or {}))
    response = ClientResponse(
        method.upper(),
        url,
        writer=None,
        continue100=None,
        timer=None,  # type: ignore[arg-type]
        request_info=RequestInfo(url, method.upper(), sent, url),
        traces=[],
        loop=loop,
        session=session,
        stream_writer=_SentRequest(),  # type: ignore[arg-type]
    )
    response.version = aiohttp.HttpVersion11
    response.status = answer.status
    try:
        response.reason = http.HTTPStatus(answer.status).phrase
    except ValueError:
        response.reason = ""
    response._headers = CIMultiDictProxy(CIMultiDict(answer.headers))
    response._raw_headers = tuple((name.encode("latin-1"), value.encode("latin-1")) for name, value in answer.headers)
    reader = StreamReader(BaseProtocol(loop), 2**16, loop=loop)
    response.content = reader
    if all(delay <= 0 for delay, _ in answer.chunks):
        for _, chunk in answer.chunks:
            if chunk:
                reader.feed_data(chunk)
        reader.feed_eof()
    else:

        async def feed() -> None:
            for delay, chunk in answer.chunks:
                await asyncio.sleep(delay)
                if chunk:
                    reader.feed_data(chunk)
            reader.feed_eof()

        response._llmtap_feeder = loop.create_task(feed())  # type: ignore[attr-defined]  # kept alive with the response
    return response
