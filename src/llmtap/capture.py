"""In-process capture for notebooks, tests and harnesses: `llmtap.capture()` and `llmtap.rollout()`.

`capture()` records every model call made inside a block (or a decorated function, sync or
async) into a run capsule of its own, exactly as `llmtap run` would, minus the program's output.
Calls made in the block's thread and in asyncio tasks started from it belong to the capture;
threads started inside the block are captured too while this is the outermost capture running.
On exit the capsule is finalised: `success`, `failure` (an exception left the block; only its
type is stored) or `interrupted` (KeyboardInterrupt).

Usage::

    import llmtap

    with llmtap.capture() as run:              # a capsule under .llmtap/runs/<ULID>/
        with llmtap.rollout("task-7"):
            client.chat.completions.create(...)
    print(run.capsule_dir, run.records("task-7"))

    @llmtap.capture(runs_dir="/data/runs")
    def evaluate(): ...

    with llmtap.capture(capture_dir="/abs/model-calls"):   # store files only, no capsule
        ...
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import time
import types
from contextlib import ContextDecorator, contextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeVar

if TYPE_CHECKING:
    from .hooks.session import CaptureSession, Durability
    from .records import ModelCallRecord

__all__ = ["Capture", "capture", "rollout"]

F = TypeVar("F", bound=Callable[..., Any])


class Capture(ContextDecorator):
    """One in-process capture; use as a context manager or a decorator (each call gets a capsule)."""

    def __init__(
        self,
        *,
        runs_dir: str | os.PathLike[str] | None = None,
        capture_dir: str | os.PathLike[str] | None = None,
        rollout_id: str = "default",
        registry: str | os.PathLike[str] | None = None,
        durability: Durability = "background",
    ) -> None:
        if runs_dir is not None and capture_dir is not None:
            raise ValueError("Pass runs_dir (a capsule per capture) or capture_dir (store files only), not both.")
        from .correlation.ids import validate_rollout_id

        self.runs_dir = Path(runs_dir) if runs_dir is not None else None
        self.capture_dir = Path(capture_dir) if capture_dir is not None else None
        self.rollout_id = validate_rollout_id(rollout_id)
        self.registry_path = registry
        self.durability = durability
        self.capsule_dir: Path | None = None
        self.run_id: str | None = None
        self.manifest: dict[str, Any] | None = None
        self.session: CaptureSession | None = None
        self._tokens: list[Any] = []
        self._became_process_capture = False
        self._started = 0.0
        self._started_mono = 0.0

    def _recreate_cm(self) -> Capture:
        # A decorated function gets a fresh capture (and capsule) per call.
        return Capture(
            runs_dir=self.runs_dir,
            capture_dir=self.capture_dir,
            rollout_id=self.rollout_id,
            registry=self.registry_path,
            durability=self.durability,
        )

    def __call__(self, func: F) -> F:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with self._recreate_cm():
                    return await func(*args, **kwargs)

            return run_async  # type: ignore[return-value]
        return super().__call__(func)

    def __enter__(self) -> Capture:
        if self.session is not None:
            raise RuntimeError("This capture is already running; start a new llmtap.capture() instead.")
        from .hooks import session as sessions
        from .hooks.install import acquire_hooks
        from .hooks.registry import load_registry

        registry = load_registry(self.registry_path)
        self._started, self._started_mono = time.time(), time.perf_counter()
        if self.capture_dir is not None:
            store_root, health_path = self.capture_dir, None
        else:
            store_root, health_path = self._open_capsule(registry)
        self.session = sessions.CaptureSession(
            store_root,
            registry=registry,
            default_rollout_id=self.rollout_id,
            durability=self.durability,
            health_path=health_path,
        )
        self._tokens.append(sessions.use_session(self.session))
        if sessions.active_process_session() is None:
            sessions.set_process_session(self.session)
            self._became_process_capture = True
        acquire_hooks()
        return self

    def _open_capsule(self, registry: Any) -> tuple[Path, Path]:
        from .capsule.manifest import start_manifest
        from .capsule.writer import create_capsule, write_json_atomic
        from .hooks.session import process_health_name

        paths = create_capsule(self.runs_dir, with_outputs=False)
        write_json_atomic(paths.url_registry, {"source": registry.source, "registry": registry.data})
        self.capsule_dir, self.run_id = paths.root, paths.run_id
        self.manifest = start_manifest(
            paths,
            capture_mode="in-process",
            command=list(sys.argv),
            cwd=os.getcwd(),
            started_at=self._started,
            registry_source=registry.source,
        )
        return paths.calls, paths.process_health / process_health_name()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        from .hooks import session as sessions
        from .hooks.install import release_hooks

        session = self.session
        if session is None:
            return
        sessions.reset_session(self._tokens.pop())
        if self._became_process_capture:
            sessions.set_process_session(None)
        release_hooks()
        session.close()
        if self.capsule_dir is not None and self.manifest is not None:
            self._finalise(exc_type)

    def _finalise(self, exc_type: type[BaseException] | None) -> None:
        from .capsule.envlock import current_interpreter
        from .capsule.finalise import CaptureOutcome, finalise_capsule
        from .capsule.writer import CapsulePaths

        if exc_type is None:
            outcome = CaptureOutcome("success")
        elif issubclass(exc_type, KeyboardInterrupt):
            outcome = CaptureOutcome("interrupted", error={"type": "KeyboardInterrupt"})
        else:
            # The type only: an exception's message can quote a prompt or a secret.
            outcome = CaptureOutcome("failure", error={"type": exc_type.__name__})
        outcome.duration_ms = round((time.perf_counter() - self._started_mono) * 1000.0, 3)
        assert self.capsule_dir is not None and self.manifest is not None
        self.manifest = finalise_capsule(
            CapsulePaths(self.capsule_dir), self.manifest, outcome, interpreter=current_interpreter()
        )

    def records(self, rollout_id: str | None = None) -> list[ModelCallRecord]:
        """The calls captured for `rollout_id` (default: the capture's default rollout)."""
        from .store import CaptureStore
        from .store.readers import read_rollout_calls

        if self.session is not None and not self.session.closed:
            self.session.flush()
        root = self.capture_dir if self.capture_dir is not None else (self.capsule_dir / "calls" if self.capsule_dir else None)
        if root is None:
            raise RuntimeError("This capture has not started; use it in a with block first.")
        store = CaptureStore(root, create=False)
        try:
            return read_rollout_calls(store, rollout_id or self.rollout_id).records
        finally:
            store.close()


def capture(
    *,
    runs_dir: str | os.PathLike[str] | None = None,
    capture_dir: str | os.PathLike[str] | None = None,
    rollout_id: str = "default",
    registry: str | os.PathLike[str] | None = None,
    durability: Durability = "background",
) -> Capture:
    """Capture the model calls made inside a block or a decorated function.

    `runs_dir` is where the run capsule goes (default `$LLMTAP_RUNS_DIR` or `.llmtap/runs`);
    `capture_dir` records into plain store files there instead of a capsule. `rollout_id` files
    calls made outside any `llmtap.rollout()` block. `registry` replaces the URL registry for
    this capture. `durability="call"` makes each record durable before its call returns.
    """
    return Capture(runs_dir=runs_dir, capture_dir=capture_dir, rollout_id=rollout_id, registry=registry, durability=durability)


@contextmanager
def _rollout_block(rollout_id: str) -> Iterator[None]:
    from .correlation import rollout_context

    with rollout_context(rollout_id):
        yield


class rollout(ContextDecorator):  # noqa: N801 - reads as a function at the call site
    """Set the rollout id of the calls made inside a block or decorated function.

    Calls captured inside go to `calls/<rollout_id>.capture.jsonl`. The same id is what
    `llmtap.current_rollout_id()` returns there. An invalid id raises InvalidRolloutIdError.

        with llmtap.rollout("3-1"):
            agent.run(task)
    """

    def __init__(self, rollout_id: str) -> None:
        from .correlation.ids import validate_rollout_id

        self.rollout_id = validate_rollout_id(rollout_id)
        self._blocks: list[Any] = []

    def __enter__(self) -> str:
        block = _rollout_block(self.rollout_id)
        block.__enter__()
        self._blocks.append(block)
        return self.rollout_id

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._blocks.pop().__exit__(exc_type, exc, traceback)

    def __call__(self, func: F) -> F:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with rollout(self.rollout_id):
                    return await func(*args, **kwargs)

            return run_async  # type: ignore[return-value]
        return super().__call__(func)


class _CallableModule(types.ModuleType):
    """`llmtap.capture` names both this module and the function: calling the module calls the function.

    Importing a submodule binds it as an attribute of its package, so after `import
    llmtap.capture` the name `llmtap.capture` is this module, not the function the lazy
    re-export would give; making the module callable keeps `llmtap.capture(...)` working either way.
    """

    def __call__(self, **options: Any) -> Capture:
        return capture(**options)


sys.modules[__name__].__class__ = _CallableModule
