"""No silent zero: notice connections to model APIs that no llmtap hook is recording.

A client that speaks HTTP over `socket` itself (or through a library llmtap does not hook) makes
model calls that no hook sees, and a capsule would say `0 model call(s)` with health `ok`. This
watches the two places every TCP client passes through, cheaply:

- `socket.getaddrinfo`: when the host asked for is one the URL registry knows
  (`UrlRegistry.provider_for_host`), the addresses it resolved to are remembered (bounded);
- `socket.socket.connect` / `connect_ex` (`socket.create_connection` and asyncio both end there):
  a connection to a remembered address, or to a known host given as an address, made while no
  hooked library is handling a call (`hooks.base.inside_hooked_call`), is counted as
  `unhooked_connections:<host>:<port>:<module>`, the module being the first caller outside the
  standard library's networking and llmtap.

Finalisation turns those counts into `unhooked_model_traffic` in capture-health.json (health is
then never `ok`), and `llmtap run` says `N connection(s) to host:port by an unhooked client in
module M` on stderr. Every other connection pays one dictionary lookup. Never raises.
"""

from __future__ import annotations

import sys
from typing import Any

from .base import Hook, Patch, inside_hooked_call
from .session import active_session

__all__ = ["UNHOOKED_PREFIX", "SocketWatchHook"]

UNHOOKED_PREFIX = "unhooked_connections:"
_KNOWN: dict[str, str] = {}  # resolved address -> the registry host it was resolved for
_KNOWN_LIMIT = 4096
_PLUMBING = ("socket", "ssl", "asyncio", "selectors", "llmtap", "threading", "concurrent", "contextlib", "functools", "_")
_FRAMES = 40


def _module_of_caller() -> str:
    """The first module on the stack that is not networking plumbing (the client that connected)."""
    try:
        frame: Any = sys._getframe(2)
    except ValueError:
        return "?"
    for _ in range(_FRAMES):
        if frame is None:
            break
        name = frame.f_globals.get("__name__") or "?"
        if not (isinstance(name, str) and name.split(".", 1)[0] in _PLUMBING):
            return str(name)[:200]
        frame = frame.f_back
    return "?"


def _remember(host: Any, port: Any, results: Any) -> None:
    session = active_session()
    if session is None or not isinstance(host, str):
        return
    number = port if isinstance(port, int) else int(port) if isinstance(port, str) and port.isdigit() else None
    if session.registry.provider_for_host(host, number) is None:
        return
    if len(_KNOWN) >= _KNOWN_LIMIT:
        _KNOWN.clear()
    for entry in results:
        address = entry[4][0] if len(entry) > 4 and entry[4] else None
        if isinstance(address, str):
            _KNOWN[address] = host.lower().rstrip(".")


def _report(host: str, port: int) -> None:
    session = active_session()
    if session is None:
        return
    session.sink.mark_incomplete({f"{UNHOOKED_PREFIX}{host}:{port}:{_module_of_caller()}": 1})


def _check(address: Any) -> None:
    try:
        if not isinstance(address, tuple) or len(address) < 2 or inside_hooked_call():
            return
        target, port = address[0], address[1]
        host = _KNOWN.get(target) if isinstance(target, str) else None
        if host is None and isinstance(target, str) and target[:1].isalpha():  # a host name resolved in C
            session = active_session()
            if session is None or session.registry.provider_for_host(target, port) is None:
                return
            host = target.lower()
        if host is not None and isinstance(port, int):
            _report(host, port)
    except Exception:  # watching is best effort: the connection itself is never touched
        pass


def _make_getaddrinfo(original: Any) -> Any:
    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        results = original(host, port, *args, **kwargs)
        try:
            _remember(host, port, results)
        except Exception:
            pass
        return results

    return getaddrinfo


def _make_connect(original: Any) -> Any:
    def connect(self: Any, address: Any) -> Any:
        if _KNOWN or (isinstance(address, tuple) and address and isinstance(address[0], str) and address[0][:1].isalpha()):
            _check(address)
        return original(self, address)

    return connect


class SocketWatchHook(Hook):
    """Patches `socket.getaddrinfo` and `socket.socket.connect`/`connect_ex` to notice unhooked model traffic."""

    name = "socket"
    module_name = "socket"

    def _make_patches(self, module: Any) -> list[Patch]:
        # connect and connect_ex are inherited from _socket.socket: uninstall removes our attribute
        # again rather than leave a copy of the original on socket.socket.
        self._inherited = [name for name in ("connect", "connect_ex") if name not in module.socket.__dict__]
        self._owner = module.socket
        return [
            Patch(module, "getaddrinfo", _make_getaddrinfo),
            Patch(module.socket, "connect", _make_connect),
            Patch(module.socket, "connect_ex", _make_connect),
        ]

    def uninstall(self) -> None:
        originals = {patch.name: patch.original for patch in self._patches if patch.owner is getattr(self, "_owner", None)}
        super().uninstall()
        for name in getattr(self, "_inherited", []):
            if name in originals and self._owner.__dict__.get(name) is originals[name]:
                delattr(self._owner, name)
        _KNOWN.clear()
