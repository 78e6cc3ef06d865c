"""Post-import hooks: run a callback right after a watched module finishes importing.

A finder placed first on `sys.meta_path` answers only for the watched names: it asks the other
finders for the real spec and wraps its loader, so the callback runs once the module has executed.
Every other import pays one set lookup. A module already imported when a callback is registered
gets its callback at once. Callbacks never raise into the import: a failure is logged.
"""

from __future__ import annotations

import logging
import sys
import threading
from types import ModuleType
from typing import Any, Callable, Sequence

__all__ = ["PostImportFinder", "when_imported"]

logger = logging.getLogger("llmtap.capture")

Callback = Callable[[ModuleType], None]


class _NotifyingLoader:
    """Delegates to the real loader, then runs the callbacks for the module it executed."""

    def __init__(self, loader: Any, finder: PostImportFinder) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: Any) -> Any:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._finder.notify(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, is_package ... for tools
        return getattr(self._loader, name)


class PostImportFinder:
    """The meta path finder behind `when_imported`; one per process, installed on demand."""

    def __init__(self) -> None:
        self._callbacks: dict[str, list[Callback]] = {}
        self._lock = threading.RLock()
        self._busy = threading.local()

    @property
    def watched(self) -> frozenset[str]:
        return frozenset(self._callbacks)

    def find_spec(self, fullname: str, path: Sequence[str] | None = None, target: Any = None) -> Any:
        if fullname not in self._callbacks or getattr(self._busy, "name", None) == fullname:
            return None
        previous = getattr(self._busy, "name", None)
        self._busy.name = fullname  # our own lookup below must not find us again
        try:
            spec = self._find_with_others(fullname, path, target)
        finally:
            self._busy.name = previous
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _NotifyingLoader(spec.loader, self)
        return spec

    def _find_with_others(self, fullname: str, path: Sequence[str] | None, target: Any) -> Any:
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def add(self, name: str, callback: Callback) -> None:
        with self._lock:
            self._callbacks.setdefault(name, []).append(callback)
        module = sys.modules.get(name)
        spec = getattr(module, "__spec__", None)
        # A module still executing (imported right now) is handled by its loader when it is done.
        if module is not None and spec is not None and not getattr(spec, "_initializing", False):
            _run(callback, module)

    def remove(self, name: str, callback: Callback) -> None:
        with self._lock:
            callbacks = self._callbacks.get(name, [])
            if callback in callbacks:
                callbacks.remove(callback)
            if not callbacks:
                self._callbacks.pop(name, None)

    def notify(self, module: ModuleType) -> None:
        with self._lock:
            callbacks = list(self._callbacks.get(module.__name__, ()))
        for callback in callbacks:
            _run(callback, module)

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        while self in sys.meta_path:
            sys.meta_path.remove(self)


def _run(callback: Callback, module: ModuleType) -> None:
    try:
        callback(module)
    except Exception as exc:
        logger.warning("llmtap post-import hook for %s failed (%s).", module.__name__, type(exc).__name__)


_FINDER = PostImportFinder()


def when_imported(name: str, callback: Callback) -> Callable[[], None]:
    """Run `callback(module)` once `name` is imported (now, if it already is); returns an undo."""
    _FINDER.install()
    _FINDER.add(name, callback)

    def undo() -> None:
        _FINDER.remove(name, callback)
        if not _FINDER.watched:
            _FINDER.uninstall()

    return undo
