"""Capture health across processes: each process writes its counts, finalisation sums them.

Every Python process of a captured workload keeps its own counters (records written, records
dropped and why). It writes them to `health/<pid>-<random>.json` in the capsule each time a failure
is counted and when its capture closes, by atomic replace, so a process killed later still leaves
its last counts. Finalisation sums every file into `capture-health.json`. The numbers come from
the workload's own processes, so the summary says so (`source: workload-processes`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping

from .writer import read_regular_file

__all__ = ["HEALTH_DIR", "sum_process_health", "write_process_health"]

HEALTH_DIR = "health"


def write_process_health(path: Path, counts: Mapping[str, Any]) -> None:
    """Replace `path` with this process's counts (write to a temp name, then rename)."""
    payload = {
        "pid": os.getpid(),
        "argv0": sys.argv[0] if sys.argv else None,
        "updated_at": time.time(),
        "counts": dict(counts),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
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
