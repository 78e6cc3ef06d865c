"""Network events: one line per HTTP request the workload makes through a hooked library, model API or not.

An event says what went over the network and never what it carried: `method`, `scheme`, `host`,
`port`, `path` (never the query string), `status`, `request_bytes` and `response_bytes` (the
declared or sent sizes; null when unknown), `duration_ms` (until the client had the response:
its headers for a streamed response, the whole body otherwise), `error` (the exception's type
name only), `hook`, `pid` and `started_at`. No body and no header value is ever read into one.

A request the URL registry does not know (an MCP server, a search API, a file download) is
timed here, around the library's own entry point; a model call leaves an event too, derived by
the run's recorder from the call's own spool frame (`spool.collector`), so the model-call path
pays nothing for it. Events exist under `llmtap run` (one spool frame each,
`spool.frame.KIND_NETWORK`, appended to the capsule's `network_events.jsonl`); elsewhere the
helpers here do nothing. Never raises.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

from .session import active_session

__all__ = ["NetworkTimer", "content_length", "network_timer", "timed", "timed_async"]

_PREFIX = os.urandom(4).hex()
_COUNTER = itertools.count()
_PATH_CHARS = 2048


def _event_id() -> str:
    return f"ne_{_PREFIX}_{os.getpid()}_{next(_COUNTER)}"


class NetworkTimer:
    """One request being timed; `done` spools its event (once)."""

    __slots__ = ("fields", "put", "started", "started_at")

    def __init__(self, put: Any, fields: dict[str, Any]) -> None:
        self.put = put
        self.fields = fields
        self.started = time.monotonic()
        self.started_at = time.time()

    def done(self, status: int | None = None, response_bytes: int | None = None, error: BaseException | None = None) -> None:
        """Spool the event; never raises."""
        put, self.put = self.put, None
        if put is None:
            return
        try:
            from ..spool.frame import KIND_NETWORK

            event = self.fields
            event["event_id"] = _event_id()
            event["started_at"] = self.started_at
            event["duration_ms"] = round((time.monotonic() - self.started) * 1000.0, 3)
            event["status"] = status if isinstance(status, int) and not isinstance(status, bool) else None
            event["response_bytes"] = response_bytes
            event["error"] = type(error).__name__ if error is not None else None
            put(KIND_NETWORK, event)
        except Exception:  # an event is best effort: the request itself is never touched
            pass


def network_timer(
    hook: str, method: Any, scheme: Any, host: Any, port: Any, path: Any, request_bytes: int | None
) -> NetworkTimer | None:
    """Start timing a request, or None when no spooling capture is active (then nothing is recorded)."""
    session = active_session()
    if session is None or session.spool is None:
        return None
    put = getattr(session.sink, "put_event", None)
    if put is None:
        return None
    try:
        text_path = str(path or "/").split("?", 1)[0].split("#", 1)[0][:_PATH_CHARS]
        fields = {
            "schema_version": 1,
            "record": "network_event",
            "hook": hook,
            "pid": os.getpid(),
            "method": str(method).upper()[:32],
            "scheme": str(scheme)[:16] if scheme else None,
            "host": str(host)[:255] if host else None,
            "port": port if isinstance(port, int) and not isinstance(port, bool) else None,
            "path": text_path,
            "request_bytes": request_bytes,
            "model_call": False,
        }
        return NetworkTimer(put, fields)
    except Exception:
        return None


def content_length(headers: Any) -> int | None:
    """A response's declared Content-Length, or None when it has none (or it is not a number)."""
    try:
        value = headers.get("content-length") if headers is not None else None
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        return int(value) if value is not None and str(value).strip().isdigit() else None
    except Exception:
        return None


def _status(response: Any) -> int | None:
    status = getattr(response, "status_code", None)
    if status is None:
        status = getattr(response, "status", None)
    return status if isinstance(status, int) else None


def timed(timer: NetworkTimer | None, original: Any, *args: Any, **kwargs: Any) -> Any:
    """Call `original(*args, **kwargs)` and spool its network event (when `timer` is not None)."""
    if timer is None:
        return original(*args, **kwargs)
    try:
        response = original(*args, **kwargs)
    except BaseException as exc:
        timer.done(error=exc)
        raise
    timer.done(_status(response), content_length(getattr(response, "headers", None)))
    return response


async def timed_async(timer: NetworkTimer | None, original: Any, *args: Any, **kwargs: Any) -> Any:
    """The awaitable twin of `timed`."""
    if timer is None:
        return await original(*args, **kwargs)
    try:
        response = await original(*args, **kwargs)
    except BaseException as exc:
        timer.done(error=exc)
        raise
    timer.done(_status(response), content_length(getattr(response, "headers", None)))
    return response
