"""ASGI type aliases shared by llmtap's server pieces."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, MutableMapping

__all__ = ["ASGIApp", "Message", "Receive", "Scope", "Send", "serve_lifespan"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def serve_lifespan(receive: Receive, send: Send, on_shutdown: Callable[[], Awaitable[None]]) -> None:
    """Answer an ASGI lifespan: start-up at once; at shutdown, `on_shutdown()` before saying it is complete."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await on_shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return
