"""The capsule manifest (`capsule.json`): what ran, how it ended, and what was captured.

Written with status `running` when a capture starts and replaced atomically when it is
finalised (`success`, `failure` or `interrupted`), so a capsule whose recorder was killed still
says honestly that it never finished. Also: finding and listing capsules for `llmtap runs`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .. import __version__
from ..errors import LlmtapError
from ..export.semconv import SEMCONV_NAME, SEMCONV_VERSION
from .ulid import is_ulid
from .writer import CapsulePaths, read_regular_file, sync_files, write_file_atomic, write_json_atomic

TYPE_CHECKING = False  # `typing` is not imported at run time (`llmtap run` loads this while its command runs)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

__all__ = [
    "MANIFEST_SCHEMA_VERSION",
    "STATUSES",
    "CapsuleError",
    "find_capsule",
    "iso_time",
    "list_capsules",
    "manifest_bytes",
    "read_manifest",
    "start_manifest",
    "write_manifest_last",
]

MANIFEST_SCHEMA_VERSION = 1
MANIFEST_KIND = "llmtap.run-capsule"
STATUSES = ("running", "success", "failure", "interrupted")


class CapsuleError(LlmtapError):
    """Raised when a capsule cannot be found or its manifest cannot be read."""


def iso_time(seconds: float) -> str:
    """UTC ISO-8601 with a Z, the form every capsule time uses: microseconds only when there are any.

    The same text as `datetime.fromtimestamp(seconds, timezone.utc).isoformat()` with `Z` for
    `+00:00` (microseconds rounded half to even), without importing `datetime`.
    """
    whole = seconds // 1
    micros = round((seconds - whole) * 1e6)
    if micros >= 1_000_000:
        whole, micros = whole + 1, micros - 1_000_000
    t = time.gmtime(int(whole))
    text = f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}"
    return f"{text}.{micros:06d}Z" if micros else f"{text}Z"


def start_manifest(
    paths: CapsulePaths,
    *,
    capture_mode: str,
    command: Sequence[str],
    cwd: str,
    started_at: float,
    registry_source: str | None,
) -> dict[str, Any]:
    """Write the `running` manifest and return it (finalisation completes the same dict)."""
    manifest: dict[str, Any] = {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "kind": MANIFEST_KIND,
        "run_id": paths.run_id,
        "capture_mode": capture_mode,
        "status": "running",
        "command": list(command),
        "working_directory": cwd,
        "started_at": iso_time(started_at),
        "ended_at": None,
        "duration_ms": None,
        "exit_code": None,
        "error": None,
        "llmtap_version": __version__,
        "recorder_pid": os.getpid(),
        "semconv": {"name": SEMCONV_NAME, "version": SEMCONV_VERSION},
        "url_registry": {"source": registry_source, "file": paths.url_registry.name},
    }
    write_json_atomic(paths.manifest, manifest, sync=False)  # finalisation writes the durable one
    return manifest


def manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
    """The manifest as written: indented JSON and a newline (what redaction scans and the proof hashes)."""
    return (json.dumps(manifest, indent=2, default=str) + "\n").encode("utf-8")


def write_manifest_last(paths: CapsulePaths, content: bytes, *, after: Sequence[Path]) -> None:
    """Replace capsule.json with `content` once the files in `after` are durable: the capsule's commit point.

    Its status must never say the run is done before the files it names are on disk, so they are
    synced first, then the manifest is written to a temp file, synced, renamed into place, and the
    capsule folder synced so the rename survives a crash.
    """
    sync_files(list(after))
    write_file_atomic(paths.manifest, content, sync=True)
    sync_files([paths.manifest])


def read_manifest(capsule: Path) -> dict[str, Any]:
    """Read a capsule's manifest; CapsuleError with the path when it is missing or damaged."""
    path = capsule / "capsule.json"
    try:
        data = json.loads(read_regular_file(path))
    except FileNotFoundError:
        raise CapsuleError(f"'{capsule}' has no capsule.json; it is not an llmtap run capsule.") from None
    except (OSError, ValueError) as exc:
        raise CapsuleError(f"The manifest '{path}' cannot be read ({exc}); the capsule may be damaged.") from None
    if not isinstance(data, dict):
        raise CapsuleError(f"The manifest '{path}' does not hold a JSON object; the capsule is damaged.")
    return data


def list_capsules(runs_dir: Path) -> list[tuple[Path, dict[str, Any] | None]]:
    """Every capsule directory under `runs_dir`, oldest first, with its manifest (None if unreadable)."""
    try:
        names = sorted(os.listdir(runs_dir))
    except FileNotFoundError:
        return []
    result: list[tuple[Path, dict[str, Any] | None]] = []
    for name in names:
        directory = runs_dir / name
        if not is_ulid(name) or not directory.is_dir():
            continue
        try:
            result.append((directory, read_manifest(directory)))
        except CapsuleError:
            result.append((directory, None))
    return result


def find_capsule(runs_dir: Path, reference: str) -> Path:
    """Resolve a run reference: a capsule path, a run id, a unique id prefix, or `latest`."""
    as_path = Path(reference).expanduser()
    if (as_path / "capsule.json").exists():
        return as_path
    capsules = [directory for directory, _ in list_capsules(runs_dir)]
    if reference == "latest":
        if not capsules:
            raise CapsuleError(f"There are no runs under '{runs_dir}'; run 'llmtap run -- <command>' first.")
        return capsules[-1]
    wanted = reference.upper()
    matches = [directory for directory in capsules if directory.name.startswith(wanted)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise CapsuleError(f"No run {reference!r} under '{runs_dir}'; list them with 'llmtap runs list'.")
    raise CapsuleError(f"Run id prefix {reference!r} matches {len(matches)} runs; give more characters.")
