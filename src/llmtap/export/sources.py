"""Where an export reads its calls: a capture directory or a run capsule, through the store's readers."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import LlmtapError
from ..store import CaptureStore
from ..store.readers import RolloutCalls, read_rollout_calls

__all__ = ["CaptureSource", "ExportError", "open_source"]


class ExportError(LlmtapError):
    """Raised when an export or query cannot start or go on: a bad path, an unreachable collector, a bad state file."""


@dataclass(frozen=True)
class CaptureSource:
    """A capture store opened for reading, and the path the user named."""

    path: Path
    store: CaptureStore

    def rollouts(self) -> list[str]:
        """The rollout ids in the store, sorted."""
        return self.store.rollouts()

    def read(self, rollout_id: str) -> RolloutCalls:
        """A rollout's calls, read tolerantly: damaged lines are skipped and listed, never fatal."""
        return read_rollout_calls(self.store, rollout_id)

    def each_rollout(self) -> Iterator[RolloutCalls]:
        """Every rollout's calls, one rollout in memory at a time."""
        for rollout_id in self.rollouts():
            yield self.read(rollout_id)


def open_source(path: str | os.PathLike[str]) -> CaptureSource:
    """Open a capture directory, or a capsule (a directory with `capsule.json` and `calls/`), for reading.

    Raises ExportError when the path is not a directory (a link to one is refused too: an export
    reads only what the user named).
    """
    root = Path(path)
    try:
        mode = os.lstat(root).st_mode
    except OSError as exc:
        raise ExportError(f"Could not open '{root}' ({exc.strerror}); name a capture directory or a run capsule.") from exc
    if not stat.S_ISDIR(mode):
        raise ExportError(f"'{root}' is not a directory; name a capture directory or a run capsule.")
    calls = root / "calls"
    if (root / "capsule.json").is_file() and calls.is_dir() and not calls.is_symlink():
        return CaptureSource(root, CaptureStore(calls, create=False))
    return CaptureSource(root, CaptureStore(root, create=False))
