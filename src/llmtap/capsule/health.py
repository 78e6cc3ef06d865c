"""Capture health across processes: each process writes its counts, finalisation sums them.

Every Python process of a captured workload keeps its own counters (records written, records
dropped and why). Under `llmtap.capture()` it writes them to `health/<pid>-<random>.json` in the
capsule each time a failure is counted and when its capture closes, by atomic replace, so a
process killed later still leaves its last counts. Under `llmtap run` a process reports its counts
in its spool file instead, and the recorder writes one file per spool file
(`health/spool-<pid>-<random>.json`) once it has turned the frames into records. Finalisation sums
every file into `capture-health.json`.
"""

from __future__ import annotations

import json
import os
import sys
import time

from .writer import is_real_directory, read_regular_file

TYPE_CHECKING = False  # `typing` and `pathlib` are not needed at run time: `llmtap run` finalises with this
if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path
    from typing import Any

__all__ = ["HEALTH_DIR", "sum_process_health", "write_process_health"]

HEALTH_DIR = "health"


def write_process_health(path: Path, counts: Mapping[str, Any], *, pid: int | None = None, argv0: str | None = None) -> None:
    """Replace `path` with a process's counts (write to a temp name, then rename).

    The process is this one unless `pid` says otherwise (the `llmtap run` recorder writes the
    counts it read from each workload process's spool file).
    """
    payload = {
        "pid": os.getpid() if pid is None else pid,
        "argv0": (sys.argv[0] if sys.argv else None) if pid is None else argv0,
        "updated_at": time.time(),
        "counts": dict(counts),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    if not is_real_directory(path.parent):  # the workload swapped it for a link: never write through one
        raise OSError(f"'{path.parent}' is not a directory of the capsule")
    temporary = path.with_name(f".{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, json.dumps(payload, sort_keys=True).encode("utf-8"))
    finally:
        os.close(fd)
    os.replace(temporary, path)


def sum_process_health(directory: Path) -> dict[str, Any]:
    """Sum every process file under `directory`; unreadable files are counted, not fatal."""
    totals: dict[str, int] = {}
    processes: list[dict[str, Any]] = []
    unreadable = 0
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        names = []
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            data = json.loads(read_regular_file(directory / name))
            counts = data["counts"]
            if not isinstance(counts, dict):
                raise ValueError("counts is not an object")
        except (OSError, ValueError, KeyError, TypeError):
            unreadable += 1
            continue
        for key, value in counts.items():
            if isinstance(value, int) and not isinstance(value, bool):
                totals[key] = totals.get(key, 0) + value
        processes.append({"pid": data.get("pid"), "argv0": data.get("argv0"), "counts": counts})
    return {"totals": dict(sorted(totals.items())), "processes": processes, "unreadable_files": unreadable}
