"""The viewer's front door: only GET and HEAD, only its own Host and Origin, strict headers on every answer.

A page on another site can make a browser send requests to 127.0.0.1, and DNS rebinding can
even make them same-origin under a foreign name; checking that the Host header names the
viewer's own address (and that an Origin, when sent, is the viewer's own) refuses both. The
Content-Security-Policy allows scripts, styles and fetches from the viewer only and images
from itself or inline `data:` URLs, so even markup that slipped past escaping could not run.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["CONTENT_SECURITY_POLICY", "ViewerGuard", "allowed_hosts"]

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]
_SAFE_METHODS = frozenset({"GET", "HEAD"})


def allowed_hosts(host: str, port: int) -> frozenset[str]:
    """The Host values that name this viewer: its bound address, and `localhost` when that is loopback."""
    names = {host}
    if host in ("127.0.0.1", "::1", "localhost"):
        names |= {"127.0.0.1", "localhost", "[::1]"}
    if ":" in host and not host.startswith("["):
        names.add(f"[{host}]")
    return frozenset(f"{name}:{port}" for name in names) | (frozenset(names) if port == 80 else frozenset())


class ViewerGuard:
    """Refuses requests that are not GET/HEAD or whose Host or Origin is not the viewer's; adds the headers."""

    def __init__(self, app: ASGIApp, *, hosts: Iterable[str]) -> None:
        self.app = app
        self.hosts = frozenset(host.lower() for host in hosts)
        self.origins = frozenset(f"http://{host}" for host in self.hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await self.app(scope, receive, send)
            return  # no websockets: the viewer has none
        problem = self._problem(scope)
        if problem is not None:
            status, text = problem
            await _plain(send, status, text)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _problem(self, scope: Scope) -> tuple[int, str] | None:
        if scope["method"] not in _SAFE_METHODS:
            return 405, "The viewer is read-only: it answers GET and HEAD only."
        host = origin = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value.decode("latin-1").lower()
            elif name == b"origin":
                origin = value.decode("latin-1").lower()
            elif name == b"sec-fetch-site" and value == b"cross-site":
                return 403, "Cross-site requests are refused; open the viewer's address directly."
        if host not in self.hosts:
            return 421, "This Host header does not name the viewer; open it at the address `llmtap view` printed."
        if origin is not None and origin not in self.origins:
            return 403, "Requests from other origins are refused; open the viewer's address directly."
        return None


async def _plain(send: Send, status: int, text: str) -> None:
    body = (text + "\n").encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()), *_HEADERS]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
