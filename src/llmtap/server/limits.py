"""The request body bound of a capturing server: read a body whole, but never past its limit.

A client's body is hostile input like any other: without a bound, one request can hold the
server's memory (a model server's limit is no help, the proxy reads the body before it). Past
the limit the client gets a 413 JSON error shaped like the APIs' own, and the connection closes.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from .asgi import Message, Receive, Scope, Send

__all__ = [
    "DEFAULT_MAX_REQUEST_BODY_BYTES",
    "BodyTooLarge",
    "ClientGone",
    "body_too_large_payload",
    "declared_length",
    "read_body_within",
    "send_body_too_large",
]

DEFAULT_MAX_REQUEST_BODY_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class BodyTooLarge:
    """A body refused for its size: `received` bytes read (or declared) when the limit was passed."""

    limit: int
    received: int


@dataclass(frozen=True, slots=True)
class ClientGone:
    """The client disconnected before its body ended."""


def declared_length(scope: Scope) -> int | None:
    """The request's `content-length` as an int, or None when absent or not a plain number."""
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            return int(value) if value.isdigit() else None
    return None


async def read_body_within(receive: Receive, scope: Scope, limit: int) -> bytes | BodyTooLarge | ClientGone:
    """Read the whole request body, refusing it as soon as it (or its declared length) passes `limit`.

    The chunks are joined once: a body that arrived in one message is returned as is, uncopied.
    """
    declared = declared_length(scope)
    if declared is not None and declared > limit:
        return BodyTooLarge(limit, declared)
    chunks: list[bytes] = []
    received = 0
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return ClientGone()
        chunk = message.get("body", b"")
        received += len(chunk)
        if received > limit:
            return BodyTooLarge(limit, received)
        if chunk:
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def body_too_large_payload(refused: BodyTooLarge) -> bytes:
    """The 413 error body, in the OpenAI error shape every SDK reads."""
    return orjson.dumps(
        {
            "error": {
                "message": f"The request body is larger than this llmtap server's limit of {refused.limit} bytes; "
                "send a smaller body, or raise max_request_body_bytes in the server's configuration.",
                "type": "invalid_request_error",
                "code": "request_body_too_large",
            }
        }
    )


async def send_body_too_large(send: Send, payload: bytes) -> None:
    """Answer 413 with `payload` and close the connection (the rest of the body is never read)."""
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode("ascii")),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload, "more_body": False})
