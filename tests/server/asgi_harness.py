"""Drive an ASGI app directly, recording every message it sends (for middleware unit tests)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from llmtap.server.asgi import ASGIApp, Message, Receive, Scope, Send
from tests.fixtures import RecordedExchange


@dataclass
class Sent:
    """What the app sent, and a snapshot taken at each send (for durability-order checks)."""

    messages: list[Message] = field(default_factory=list)
    snapshots: list[Any] = field(default_factory=list)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")


def http_scope(path: str, *, headers: list[tuple[bytes, bytes]] | None = None, method: str = "POST") -> Scope:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers or [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }


async def call_app(
    app: ASGIApp,
    scope: Scope,
    body: bytes,
    *,
    snapshot: Callable[[], Any] | None = None,
    disconnect_after_sends: int | None = None,
) -> Sent:
    sent = Sent()
    request_done = False

    async def receive() -> Message:
        nonlocal request_done
        if not request_done:
            request_done = True
            return {"type": "http.request", "body": body, "more_body": False}
        import asyncio

        while disconnect_after_sends is None or len(sent.messages) < disconnect_after_sends:
            await asyncio.sleep(0.001)
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if disconnect_after_sends is not None and len(sent.messages) >= disconnect_after_sends:
            raise OSError("client disconnected")
        sent.messages.append(message)
        if snapshot is not None:
            sent.snapshots.append(snapshot())

    await app(scope, receive, send)
    return sent


def replaying_app(recorded: RecordedExchange, *, pieces: int = 4, seen: list[Scope] | None = None,
                  bodies: list[bytes] | None = None, declare_length: bool = False) -> ASGIApp:
    """A model server app that answers every request with one recorded exchange, in pieces
    (with a content-length header when `declare_length`)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        if seen is not None:
            seen.append(scope)
        if bodies is not None:
            bodies.append(b"".join(chunks))
        payload = recorded.body_bytes
        headers = [(b"content-type", recorded.content_type.encode())]
        if declare_length:
            headers.append((b"content-length", str(len(payload)).encode()))
        await send({"type": "http.response.start", "status": recorded.status, "headers": headers})
        step = max(1, len(payload) // pieces)
        for start in range(0, len(payload), step):
            await send({"type": "http.response.body", "body": payload[start:start + step], "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


def request_body(recorded: RecordedExchange) -> bytes:
    return json.dumps(recorded.request_json).encode()
