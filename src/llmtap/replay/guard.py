"""The network guard of a mocked replay: no socket to a model API is opened while the recording answers.

Guarded: every host the URL registry names (api.openai.com, api.anthropic.com, ...; the
registry's catch-all "any local server on any port" entry is not, or a workload's own loopback
services would be refused), and every host and port the recording's calls were sent to (a local
model server or test upstream). A name is refused when it is resolved (`socket.getaddrinfo`,
which asyncio uses too) and an address when it is connected to (`socket.socket.connect` and
`connect_ex`, which every blocking and asyncio connection ends in). A refusal raises
`ReplayNetworkBlocked` (a `ConnectionRefusedError`, so the library reports a failed connection)
and is counted in `attempts`, which tests and the replay report read.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import LlmtapError

__all__ = ["NetworkGuard", "ReplayNetworkBlocked", "guarded_addresses", "install_guard", "uninstall_guard"]

_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0"})


class ReplayNetworkBlocked(LlmtapError, ConnectionRefusedError):
    """Raised when a replaying workload tries to reach a model API the recording answers for."""


def guarded_addresses(
    registry_hosts: Iterable[tuple[str, int | None]], recorded_servers: Iterable[tuple[str, int | None]]
) -> set[tuple[str, int | None]]:
    """The (host, port) pairs to refuse; port None refuses every port of that host."""
    guarded = {
        (host.lower(), port) for host, port in registry_hosts if not (host.lower() in _LOOPBACK and port is None)
    }
    guarded.update((host.lower().strip("[]"), port) for host, port in recorded_servers if host)
    return guarded


class NetworkGuard:
    """Patches name resolution and socket connects to refuse the guarded addresses; `remove()` undoes it."""

    def __init__(self, guarded: set[tuple[str, int | None]], on_refuse: Callable[[str, Any], None] | None = None) -> None:
        self.guarded = guarded
        self.on_refuse = on_refuse
        self.attempts: list[tuple[str, int | None]] = []
        self._lock = threading.Lock()
        self._originals: dict[str, Any] = {}

    def refuses(self, host: Any, port: Any) -> bool:
        if not isinstance(host, str):
            return False
        name = host.lower().rstrip(".").strip("[]")
        number = port if isinstance(port, int) else int(port) if isinstance(port, str) and port.isdigit() else None
        return (name, None) in self.guarded or (name, number) in self.guarded

    def _refuse(self, host: str, port: Any) -> None:
        with self._lock:
            self.attempts.append((host, port if isinstance(port, int) else None))
        if self.on_refuse is not None:
            self.on_refuse(host, port)
        raise ReplayNetworkBlocked(
            f"llmtap replay refused a connection to {host}:{port}: the recording answers for this model API; "
            "a call the hooks did not answer tried to reach it (use --on-miss passthrough to allow live calls)."
        )

    def install(self) -> None:
        if self._originals:
            return
        getaddrinfo = socket.getaddrinfo
        connect = socket.socket.connect
        connect_ex = socket.socket.connect_ex
        self._originals = {"getaddrinfo": getaddrinfo, "connect": connect, "connect_ex": connect_ex}
        guard = self

        def guarded_getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
            if guard.refuses(host, port):
                guard._refuse(host, port)
            return getaddrinfo(host, port, *args, **kwargs)

        def guarded_connect(sock: socket.socket, address: Any) -> Any:
            if isinstance(address, tuple) and len(address) >= 2 and guard.refuses(address[0], address[1]):
                guard._refuse(address[0], address[1])
            return connect(sock, address)

        def guarded_connect_ex(sock: socket.socket, address: Any) -> Any:
            if isinstance(address, tuple) and len(address) >= 2 and guard.refuses(address[0], address[1]):
                guard._refuse(address[0], address[1])
            return connect_ex(sock, address)

        socket.getaddrinfo = guarded_getaddrinfo
        socket.socket.connect = guarded_connect  # type: ignore[method-assign, assignment]
        socket.socket.connect_ex = guarded_connect_ex  # type: ignore[method-assign, assignment]

    def remove(self) -> None:
        if not self._originals:
            return
        socket.getaddrinfo = self._originals["getaddrinfo"]
        socket.socket.connect = self._originals["connect"]  # type: ignore[method-assign]
        socket.socket.connect_ex = self._originals["connect_ex"]  # type: ignore[method-assign]
        self._originals = {}


_guard: NetworkGuard | None = None


def recorded_servers(lines: Iterable[Any]) -> list[tuple[str, int | None]]:
    """The (address, port) each recorded call was sent to, from its line's `server` field."""
    found: list[tuple[str, int | None]] = []
    for line in lines:
        server = line.get("server") if isinstance(line, dict) else None
        if isinstance(server, dict) and isinstance(server.get("address"), str):
            port = server.get("port")
            found.append((server["address"], port if isinstance(port, int) and not isinstance(port, bool) else None))
    return found


def install_guard(
    registry_hosts: Iterable[tuple[str, int | None]] | None = None,
    lines: Iterable[Any] = (),
    on_refuse: Callable[[str, Any], None] | None = None,
) -> NetworkGuard:
    """Install the process's guard (once) over the registry's hosts and the recording's servers."""
    global _guard
    if registry_hosts is None:
        from ..hooks.registry import load_registry

        registry_hosts = load_registry().named_hosts()
    guarded = guarded_addresses(registry_hosts, recorded_servers(lines))
    if _guard is None:
        _guard = NetworkGuard(guarded, on_refuse)
        _guard.install()
    else:
        _guard.guarded |= guarded
    return _guard


def uninstall_guard() -> None:
    """Remove the process's guard."""
    global _guard
    if _guard is not None:
        _guard.remove()
        _guard = None


def active_guard() -> NetworkGuard | None:
    return _guard
