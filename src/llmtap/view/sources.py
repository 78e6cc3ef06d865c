"""What the viewer was pointed at: capture directories, run capsules and rollouts files.

`discover(paths)` sorts each given path into sources once, at start: a directory holding
`capsule.json` is a run capsule (its `calls/` is a capture directory), a directory holding run
capsules is a runs directory (looked at again on every home page, so new runs appear), any
other directory is a capture directory, and a regular file is a rollouts file. A rollouts file
is read with the first capture directory given, so its rows link to their calls' payloads.
Nothing outside these paths is ever opened: a link inside them is refused, not followed.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..errors import LlmtapError
from ..store import ROLLOUT_ID_PATTERN
from .files import read_bounded
from .index import CaptureIndex
from .rows import RowsIndex

__all__ = ["Source", "SourceSet", "ViewPathError", "default_paths", "discover", "discover_pair", "is_comparison"]

MANIFEST = "capsule.json"
HEALTH = "capture-health.json"
MAX_JSON_BYTES = 8 << 20


class ViewPathError(LlmtapError):
    """Raised when a path given to `llmtap view` does not exist or cannot be shown."""


@dataclass
class Source:
    """One thing the home page lists: its id in URLs, what it is, and its indexes."""

    sid: str
    kind: str  # "capture", "capsule" or "rollouts"
    path: str
    captures: CaptureIndex | None = None
    rows: RowsIndex | None = None
    manifest: dict[str, Any] | None = None
    health: dict[str, Any] | None = None
    note: str = ""
    _manifest_read_at: float = 0.0

    @property
    def label(self) -> str:
        """A short name for headings."""
        if self.kind == "capsule" and self.manifest:
            command = " ".join(str(part) for part in self.manifest.get("command") or [])
            return f"run {self.sid}" + (f" · {command}" if command else "")
        return f"{self.kind} {self.path}"

    def refresh(self, *, max_age: float = 0.0, look_inside: bool = False) -> None:
        """Look at the files again (at most every `max_age` seconds; see `CaptureIndex.refresh`)."""
        if self.captures is not None:
            self.captures.refresh(max_age=max_age, look_inside=look_inside)
        if self.rows is not None:
            self.rows.refresh()
        now = time.monotonic()
        if self.kind == "capsule" and now - self._manifest_read_at >= max(max_age, 1.0):
            self._manifest_read_at = now  # a running capsule's status changes once, when it ends
            self.manifest = _read_json(os.path.join(self.path, MANIFEST))
            self.health = _read_json(os.path.join(self.path, HEALTH))


@dataclass
class SourceSet:
    """Every source, by id, in the order given; runs directories are listed again on `rescan`."""

    sources: dict[str, Source] = field(default_factory=dict)
    runs_dirs: list[str] = field(default_factory=list)

    def rescan(self) -> None:
        """Add the capsules that appeared in a runs directory since the last look."""
        for runs_dir in self.runs_dirs:
            for capsule in _capsules_in(runs_dir):
                name = os.path.basename(capsule)
                if name not in self.sources:
                    self.sources[name] = _capsule_source(capsule)

    def get(self, sid: str) -> Source | None:
        """The source with this id; None for any other text (ids are never turned into paths)."""
        return self.sources.get(sid)

    def capture_indexes(self) -> list[CaptureIndex]:
        """Every capture index, for the background summariser."""
        return [source.captures for source in self.sources.values() if source.captures is not None]


def discover(paths: list[str]) -> SourceSet:
    """Sort the given paths into sources; ViewPathError names the first one that is not there."""
    found = SourceSet()
    capture_dirs: list[CaptureIndex] = []
    rollouts_files: list[Source] = []
    for raw in paths:
        path = os.path.abspath(os.path.expanduser(raw))
        try:
            info = os.lstat(path)
        except OSError:
            raise ViewPathError(
                f"'{raw}' does not exist; give a capture directory, a run capsule or a rollouts file."
            ) from None
        if stat.S_ISLNK(info.st_mode):
            path = os.path.realpath(path)  # a link the user typed is theirs to follow; links inside are not
            info = os.stat(path)
        if stat.S_ISREG(info.st_mode):
            source = Source(f"f{len(rollouts_files) + 1}", "rollouts", path, rows=RowsIndex(path))
            rollouts_files.append(source)
            found.sources[source.sid] = source
        elif not stat.S_ISDIR(info.st_mode):
            raise ViewPathError(f"'{raw}' is neither a directory nor a regular file; the viewer cannot show it.")
        elif os.path.isfile(os.path.join(path, MANIFEST)):
            source = _capsule_source(path)
            found.sources[source.sid] = source
        elif _capsules_in(path):
            found.runs_dirs.append(path)
        else:
            index = CaptureIndex(path)
            capture_dirs.append(index)
            source = Source(f"d{len(capture_dirs)}", "capture", path, captures=index)
            found.sources[source.sid] = source
    for source in rollouts_files:
        if capture_dirs:
            source.captures = capture_dirs[0]
        else:
            source.note = (
                "No capture directory was given with this file: calls show without payloads. "
                "Give it too: llmtap view ROLLOUTS.jsonl CAPTURE_DIR"
            )
    found.rescan()
    return found


def _capsules_in(runs_dir: str) -> list[str]:
    try:
        names = sorted(os.listdir(runs_dir))
    except OSError:
        return []
    from ..capsule.ulid import is_ulid

    result = []
    for name in names:
        if len(name) != 26 or not is_ulid(name):  # checked first: a capture directory lists every rollout's files here
            continue
        capsule = os.path.join(runs_dir, name)
        if _is_real_dir(capsule) and os.path.isfile(os.path.join(capsule, MANIFEST)):
            result.append(capsule)
    return result


def _is_real_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _capsule_source(capsule: str) -> Source:
    calls = os.path.join(capsule, "calls")
    name = os.path.basename(capsule.rstrip("/"))
    if ROLLOUT_ID_PATTERN.fullmatch(name) is None or len(name) > 64:  # source ids go into URLs as they are
        name = "c" + hashlib.sha256(capsule.encode()).hexdigest()[:12]
    source = Source(name, "capsule", capsule, captures=CaptureIndex(calls) if _is_real_dir(calls) else None)
    source.manifest = _read_json(os.path.join(capsule, MANIFEST))
    source.health = _read_json(os.path.join(capsule, HEALTH))
    return source


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        data, _ = read_bounded(path, limit=MAX_JSON_BYTES)
        value = orjson.loads(data)
    except (OSError, orjson.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def default_paths() -> list[str]:
    """`.llmtap/runs` (or $LLMTAP_RUNS_DIR) when it exists, else nothing."""
    from ..capsule.writer import default_runs_dir

    runs = Path(default_runs_dir())
    return [str(runs)] if runs.is_dir() else []


def discover_pair(path_a: str, path_b: str) -> tuple[SourceSet, str, str]:
    """Two runs to compare, each discovered alone; return the set and the two source ids (A, B).

    Each path must be one run (a capsule, a capture directory or a rollouts file); a rollouts file
    is not joined to the other run's capture directory. ViewPathError says what was given instead.
    """
    found = SourceSet()
    sids: list[str] = []
    for raw in (path_a, path_b):
        alone = discover([raw])
        if alone.runs_dirs or len(alone.sources) != 1:
            raise ViewPathError(
                f"'{raw}' is a runs directory, not one run; give the two run capsules (or capture directories) to compare."
            )
        source = next(iter(alone.sources.values()))
        if source.sid in found.sources:  # the second of two capture directories is d2, of two rollouts files f2
            source.sid = f"{source.sid[0]}2" if source.sid in ("d1", "f1") else f"{source.sid}-b"
        found.sources[source.sid] = source
        sids.append(source.sid)
    return found, sids[0], sids[1]


def is_comparison(paths: list[str]) -> bool:
    """True when `llmtap view` was given two runs to compare rather than sources to list.

    Exactly two paths, neither a runs directory, and not a rollouts file with a capture
    directory (which the viewer reads together: the directory holds the rows' payloads).
    """
    if len(paths) != 2:
        return False
    kinds = []
    for raw in paths:
        alone = discover([raw])
        if alone.runs_dirs or len(alone.sources) != 1:
            return False
        kinds.append(next(iter(alone.sources.values())).kind)
    return sorted(kinds) != ["capture", "rollouts"]
