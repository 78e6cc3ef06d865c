"""The files beside each rollout and the paths to them: what every part of the store agrees on.

    <id>.capture.jsonl       one JSON object per line, append-only (the spec's file)
    <id>.capture.incomplete  marker: at least one record could not be written
    <id>.capture.lock        what writers and clear() flock; never deleted, so no unlink race
    <id>.capture.cleared     tombstone with the time of the last clear(): the late-writer fence
    <id>.capture.late.jsonl  records of calls that started before the last clear()
"""

from __future__ import annotations

import os
from pathlib import Path

from llmtap.correlation.ids import rollout_file_stem, validate_rollout_id

__all__ = ["DATA_SUFFIX", "LATE_SUFFIX", "LOCK_SUFFIX", "MARKER_SUFFIX", "TOMBSTONE_SUFFIX", "StoreLayout"]

DATA_SUFFIX = ".capture.jsonl"
MARKER_SUFFIX = ".capture.incomplete"
LOCK_SUFFIX = ".capture.lock"
TOMBSTONE_SUFFIX = ".capture.cleared"
LATE_SUFFIX = ".capture.late.jsonl"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"


class StoreLayout:
    """The store's root, its open descriptor and the paths of a rollout's files under it.

    The base of CaptureStore's parts (markers and fence, reads, the append path): `CaptureStore`
    sets these attributes when it opens the root.
    """

    root: Path
    _directory: str  # the root as a plain string, for paths built on the append path
    _dir_fd: int  # the root's descriptor every file is opened relative to; -1 when it does not exist

    def path_for(self, rollout_id: str) -> Path:
        """Return `<root>/<rollout_id>.capture.jsonl`, after validating the id."""
        return self.root / f"{rollout_file_stem(validate_rollout_id(rollout_id))}{DATA_SUFFIX}"

    def marker_path_for(self, rollout_id: str) -> Path:
        """Return `<root>/<rollout_id>.capture.incomplete`, after validating the id."""
        return self.root / f"{rollout_file_stem(validate_rollout_id(rollout_id))}{MARKER_SUFFIX}"

    def _sibling(self, rollout_id: str, suffix: str) -> str:
        """A path as a plain string: pathlib's cost shows on the append path."""
        return f"{self._directory}{os.sep}{rollout_file_stem(rollout_id)}{suffix}"
