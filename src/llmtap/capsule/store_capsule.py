"""A capsule this process records into through a CaptureStore, from creation to finalisation.

`llmtap serve --capsule` and the forensic and exact replays write capsules without running a
workload under `llmtap run`: they create the capsule, start its manifest, append their calls to
a store on its `calls/`, and finalise it when they end, however they end. `store_capsule` is that
life in one `with` block, so the two cannot drift apart (a capsule left `running`, a store not
closed before finalisation reads it).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .finalise import CaptureOutcome, finalise_capsule
from .manifest import start_manifest
from .writer import CapsulePaths, create_capsule

__all__ = ["StoreCapsule", "store_capsule"]


@dataclass
class StoreCapsule:
    """The capsule being recorded: its paths, its manifest, the store on its `calls/`, and how it ended.

    `outcome` says success until the block replaces it (a replay that did not reproduce) or
    raises (then failure, naming the exception's type).
    """

    paths: CapsulePaths
    manifest: dict[str, Any]
    store: Any  # a CaptureStore, imported only when a capsule is made
    outcome: CaptureOutcome = field(default_factory=lambda: CaptureOutcome("success", exit_code=0))


@contextmanager
def store_capsule(
    capture_mode: str, *, runs_dir: str | os.PathLike[str] | None = None, manifest_fields: dict[str, Any] | None = None
) -> Iterator[StoreCapsule]:
    """Create a capsule (no `outputs/`), start its manifest with `capture_mode` and `manifest_fields`,
    yield it with an open store, then close the store and finalise the capsule with its outcome."""
    from ..store import CaptureStore

    started, started_mono = time.time(), time.perf_counter()
    paths = create_capsule(runs_dir, with_outputs=False)
    manifest = start_manifest(
        paths, capture_mode=capture_mode, command=list(sys.argv), cwd=os.getcwd(), started_at=started, registry_source=None
    )
    manifest.update(manifest_fields or {})
    capsule = StoreCapsule(paths, manifest, CaptureStore(paths.calls, refuse_links=True))
    try:
        yield capsule
    except BaseException as exc:
        capsule.outcome = CaptureOutcome("failure", exit_code=1, error={"type": type(exc).__name__})
        raise
    finally:
        capsule.store.close()
        capsule.outcome.duration_ms = round((time.perf_counter() - started_mono) * 1000.0, 3)
        finalise_capsule(paths, manifest, capsule.outcome)
