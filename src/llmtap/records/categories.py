"""Error categories: what a failed call's status or exception means, in the spec's closed list."""

from __future__ import annotations

__all__ = ["ERROR_CATEGORIES", "category_for_exception", "category_for_status", "status_from_exception"]

ERROR_CATEGORIES = (
    "timeout",
    "rate_limit",
    "auth",
    "not_found",
    "client_error",
    "upstream_error",
    "incomplete",
    "stream_truncated",
    "capture_parse_error",
    "connection",
    "exception",
    "cancelled",
)

def category_for_status(status: int | None) -> str | None:
    """Return the error category an HTTP status implies, or None for success or unknown."""
    if status is None or status < 400:
        return None
    if status in (408, 504):
        return "timeout"
    if status == 429:
        return "rate_limit"
    if status in (401, 403):
        return "auth"
    if status == 404:
        return "not_found"
    if status < 500:
        return "client_error"
    return "upstream_error"


# Exception class-name fragments that mean the connection failed (httpx's ConnectError,
# RemoteProtocolError, ReadError; aiohttp's ClientConnectorError, ClientPayloadError, ServerDisconnectedError).
_CONNECTION_WORDS = ("connect", "protocol", "payload", "readerror", "writeerror", "reset", "broken", "closed")


def category_for_exception(exc: BaseException) -> str:
    """Return the error category of an exception raised during a call."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = type(current).__name__.lower()
        if isinstance(current, TimeoutError) or "timeout" in name:
            return "timeout"
        if isinstance(current, ConnectionError) or any(word in name for word in _CONNECTION_WORDS):
            return "connection"
        current = current.__cause__ or current.__context__
    return "exception"


def status_from_exception(exc: BaseException) -> int | None:
    """Return the HTTP status an exception carries (`status`, `status_code`, `response.status_code`)."""
    for holder_name, attribute in (("", "status"), ("", "status_code"), ("response", "status_code")):
        try:
            holder = getattr(exc, holder_name, None) if holder_name else exc
            value = getattr(holder, attribute, None)
        except Exception:  # a lazy attribute may itself fail; the status is then unknown
            continue
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
            return value
    return None
