"""Which libraries are hooked, and installing their hooks while at least one capture needs them.

Each hook module is imported only when its library is: a workload that never imports aiohttp
never loads llmtap's aiohttp hook. `acquire_hooks()` / `release_hooks()` count the captures that
need the hooks; the first installs a post-import callback per library (patching at once what is
already imported), the last removes every patch and callback. Calling `acquire_hooks()` twice
installs nothing twice.
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType
from typing import Callable

from .base import Hook
from .postimport import when_imported

__all__ = ["HOOKED_LIBRARIES", "acquire_hooks", "hook_module", "installed_hooks", "release_hooks"]

# Library module -> (llmtap hook module, hook class name).
HOOKED_LIBRARIES: dict[str, tuple[str, str]] = {
    "httpx": ("llmtap.hooks.httpx", "HttpxHook"),
    "httpx2": ("llmtap.hooks.httpx", "Httpx2Hook"),
    "requests": ("llmtap.hooks.requests", "RequestsHook"),
    "urllib3": ("llmtap.hooks.urllib3", "Urllib3Hook"),
    "aiohttp": ("llmtap.hooks.aiohttp", "AiohttpHook"),
    "mcp.client.session": ("llmtap.hooks.mcp", "McpClientHook"),  # MCP tool calls, not HTTP (hooks.mcp)
    "http.client": ("llmtap.hooks.http_client", "HttpClientHook"),
    "socket": ("llmtap.hooks.socket_watch", "SocketWatchHook"),  # model traffic no hook records
}

_lock = threading.RLock()
_users = 0
_hooks: dict[str, Hook] = {}
_undo: list[Callable[[], None]] = []


def hook_module(module: ModuleType) -> None:
    """Install the hook for a just-imported library (called by the post-import machinery)."""
    entry = HOOKED_LIBRARIES.get(module.__name__)
    if entry is None:
        return
    with _lock:
        if _users == 0 or module.__name__ in _hooks:
            return
        hook_module_name, class_name = entry
        hook: Hook = getattr(importlib.import_module(hook_module_name), class_name)()
        if hook.install(module):
            _hooks[module.__name__] = hook


def acquire_hooks() -> None:
    """Count one more capture that needs the hooks; the first one installs them."""
    global _users
    with _lock:
        _users += 1
        if _users > 1:
            return
        for library in HOOKED_LIBRARIES:
            _undo.append(when_imported(library, hook_module))


def release_hooks() -> None:
    """Count one capture fewer; the last one removes every patch and post-import callback."""
    global _users
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users > 0:
            return
        for undo in _undo:
            undo()
        _undo.clear()
        for hook in _hooks.values():
            hook.uninstall()
        _hooks.clear()


def installed_hooks() -> list[str]:
    """Names of the libraries currently patched."""
    with _lock:
        return sorted(_hooks)
