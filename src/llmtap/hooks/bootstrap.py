"""Capture inside a process started by `llmtap run`, from the moment it imports an HTTP library.

The injected `sitecustomize` calls `start(capsule)` when the workload first imports a hooked
library: this process gets a process-wide capture writing into the capsule's `calls/`, using
the registry the recorder compiled (`url_registry.json`), and the hooks are installed as each
library is imported. `spec_notifying` finds the library being imported right now and makes sure
its hook goes in as soon as it has executed.

Every process (the workload, its subprocesses, multiprocessing workers, forked children) hands
each finished call to the recorder as a frame in its own spool file under the capsule's
`internal/spool/`, written before the call returns; the `llmtap run` parent builds the records.
No record is built here, and a process that ends without running exit handlers (`os._exit`, a
SIGTERM from `Pool.terminate()`, SIGKILL) still leaves every call that had finished.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from ..spool.writer import SpoolWriter, spool_directory
from .install import acquire_hooks, hook_module
from .postimport import PostImportFinder
from .registry import load_registry, registry_from_data
from .session import CaptureSession, set_process_session

__all__ = ["CAPSULE_ENV", "LIBPATH_ENV", "RECORDER_PID_ENV", "spec_notifying", "start"]

CAPSULE_ENV = "LLMTAP_RUN_CAPSULE"
RECORDER_PID_ENV = "LLMTAP_RUN_RECORDER_PID"  # the pid of the `llmtap run` recorder
LIBPATH_ENV = "LLMTAP_RUN_LIBPATH"

_session: CaptureSession | None = None


def _registry(capsule: Path) -> Any:
    try:
        data = json.loads((capsule / "url_registry.json").read_text(encoding="utf-8"))
        return registry_from_data(data["registry"], source=str(data.get("source")))
    except (OSError, ValueError, KeyError):
        return load_registry()  # the recorder always writes the file; this is a fallback only


def start(capsule: str | os.PathLike[str]) -> CaptureSession:
    """Start this process's capture into `capsule` (idempotent) and install the hooks."""
    global _session
    if _session is not None:
        return _session
    root = Path(capsule)
    _session = CaptureSession(root / "calls", registry=_registry(root), spool=SpoolWriter(spool_directory(root)))
    set_process_session(_session)
    acquire_hooks()
    if os.environ.get("LLMTAP_REPLAY_SOURCE"):  # `llmtap replay`: the recording answers the model calls
        _start_replay(root, _session)
    return _session


def _start_replay(root: Path, session: CaptureSession) -> None:
    """Answer from the recording; if it cannot be loaded, refuse every model API instead of going live."""
    from ..replay import guard, live

    try:
        live.start_from_environment(root, session.registry)
    except Exception as exc:
        guard.install_guard(session.registry.named_hosts())
        sys.stderr.write(f"llmtap replay: could not load the recording ({type(exc).__name__}); model calls are refused.\n")


class _Notify:
    """Loader wrapper: after the real loader executed the module, install its hook."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        try:
            hook_module(module)
        except Exception as exc:  # never break the workload's import
            if _session is not None:
                _session.failure("hook_install_failed", module.__name__, exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def spec_notifying(name: str, path: Any, target: Any, *, skip: object) -> Any:
    """Find `name` with the other finders and wrap its loader so its hook is installed after it runs."""
    for finder in list(sys.meta_path):
        if finder is skip or isinstance(finder, PostImportFinder):
            continue
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        spec = find(name, path, target)
        if spec is not None:
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _Notify(spec.loader)
            return spec
    return None
