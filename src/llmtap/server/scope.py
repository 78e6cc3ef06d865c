"""Reading an ASGI request: its raw target, its headers, its body read whole and handed on again."""

from __future__ import annotations

from typing import Protocol
from urllib.parse import quote

from ..exchange import Exchange
from .asgi import Message, Receive, Scope

__all__ = ["CallState", "header", "raw_target", "read_body", "replay_receive", "with_content_length"]


class CallState(Protocol):
    """What the body readers update on a call: its Exchange, and whether the client left."""

    exchange: Exchange
    client_gone: bool


async def read_body(receive: Receive, call: CallState) -> bytes:
    """Read the request body whole, keeping it on the call's Exchange; a disconnect ends it early."""
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


def replay_receive(body: bytes, receive: Receive, call: CallState) -> Receive:
    """A `receive` that gives the app `body` as one message, then passes the client's messages on."""
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


def raw_target(scope: Scope) -> str:
    """The path as the client encoded it: `raw_path`, or the decoded path encoded afresh without it.

    `path` is percent-decoded: an encoded `/` in a deployment name would split it, and `%7E`
    would reach the upstream as `~`.
    """
    raw_path = scope.get("raw_path")
    if isinstance(raw_path, bytes) and raw_path:
        return raw_path.decode("latin-1")
    return quote(scope["path"])


def header(scope: Scope, name: str) -> str | None:
    """The first value of header `name` (lower-case), None when absent."""
    wanted = name.encode("latin-1")
    for key, value in scope.get("headers", []):
        if key.lower() == wanted:
            return str(value.decode("latin-1"))
    return None


def with_content_length(scope: Scope, length: int) -> Scope:
    """A copy of `scope` whose headers declare `length` body bytes (a rewritten body's)."""
    headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in (b"content-length", b"transfer-encoding")]
    headers.append((b"content-length", str(length).encode("ascii")))
    return {**scope, "headers": headers}
