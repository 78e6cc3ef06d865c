"""Finalising a capsule once its capture has ended, on success, failure or interruption alike.

Order matters: first every path finalisation manages is checked without being opened (a
symbolic link, FIFO or other special file the workload put there is removed, never followed,
and reported); then the calls are read through the store's tolerant reader and projected into
`model-calls.jsonl`; the processes' health counts are summed into `capture-health.json`;
`env.lock` is written; and the manifest is replaced last, so `status` flips from `running` only
once everything else is on disk.
"""

from __future__ import annotations

import json
import os
import stat
import time
from typing import Any, Iterable, Mapping

from ..errors import LlmtapError
from .envlock import env_lock, parse_interpreter_lines
from .health import sum_process_health
from .manifest import iso_time
from .writer import (
    CapsulePaths,
    directory_identity,
    read_regular_file,
    write_file_atomic,
    write_json_atomic,
    write_json_last,
)

__all__ = ["CaptureOutcome", "finalise_capsule"]

HEALTH_SCHEMA_VERSION = 1
_USAGE_KEYS = (
    ("tokens_in", "input_tokens"),
    ("tokens_out", "output_tokens"),
    ("tokens_reasoning", "reasoning_tokens"),
    ("cached_tokens", "cache_read_input_tokens"),
    ("cache_creation_tokens", "cache_creation_input_tokens"),
    ("tokens_total", "total_tokens"),
)
# Health counters that mean a record was lost or a call not fully captured.
_LOSS_EVENTS = (
    "record_build_failed",
    "record_write_failed",
    "stream_record_dropped",
    "hook_failed",
    "records_pending_at_close",
    "calls_open_at_close",
    "calls_in_flight_at_exit",  # calls a killed process never finished (`spool`'s in-flight counts)
)


class CaptureOutcome:
    """How the captured program ended, as finalisation needs it."""

    def __init__(
        self,
        status: str,
        *,
        exit_code: int | None = None,
        error: Mapping[str, Any] | None = None,
        ended_at: float | None = None,
        duration_ms: float | None = None,
    ) -> None:
        self.status = status
        self.exit_code = exit_code
        self.error = dict(error) if error is not None else None
        self.ended_at = time.time() if ended_at is None else ended_at
        self.duration_ms = duration_ms


def _entry_kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "special"


def _remove_special_entries(paths: CapsulePaths) -> list[dict[str, str]]:
    """Remove links and special files at managed paths (never following them); report each.

    Only the entry itself goes, and only inside the capsule: each managed directory is checked
    with lstat, and one that is a link (or anything but a directory) is removed as an entry and
    made again empty, never listed through; a real one is opened with O_NOFOLLOW and its
    entries are looked at and removed relative to that descriptor, so a directory swapped in
    meanwhile is never touched.
    """
    removed: list[dict[str, str]] = []
    root = str(paths.root)

    def report(path: str, mode: int) -> None:
        removed.append({"path": os.path.relpath(path, root), "kind": _entry_kind(mode)})

    for path in map(str, paths.managed_files()):
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue
        if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
            os.unlink(path)
            report(path, mode)
    for directory in map(str, paths.managed_directories()):
        try:
            mode = os.lstat(directory).st_mode
        except OSError:
            continue
        if not stat.S_ISDIR(mode):
            os.unlink(directory)  # the link itself, never what it points to
            report(directory, mode)
            if directory in (str(paths.calls), str(paths.process_health)):
                os.mkdir(directory)  # where the spool's records and counts still have to go
            continue
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            for name in os.listdir(fd):
                try:
                    mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
                except OSError:
                    continue
                if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
                    os.unlink(name, dir_fd=fd)
                    report(os.path.join(directory, name), mode)
        finally:
            os.close(fd)
    return removed


def _has_calls(paths: CapsulePaths) -> bool:
    try:
        return any(name.endswith((".capture.jsonl", ".capture.incomplete")) for name in os.listdir(paths.calls))
    except OSError:
        return False


def _project_calls(paths: CapsulePaths) -> tuple[list[bytes], dict[str, Any]]:
    """Read every rollout's calls; return the model-calls lines and the store's view of the calls."""
    from ..records import ModelCallRecord, aggregate_metrics
    from ..store import CaptureStore
    from ..export.genai import genai_record

    lines: list[bytes] = []
    summary: dict[str, Any] = {"rollouts": {}, "unreadable_lines": 0, "torn_tails": 0, "incomplete": [], "late_writes": 0}
    all_records: list[ModelCallRecord] = []
    with CaptureStore(paths.calls, create=False, refuse_links=True) as store:
        for rollout_id in store.rollouts():
            result = store.read(rollout_id)
            records = []
            for call_index, line in result.entries:
                try:
                    record = ModelCallRecord.from_raw_line(line, call_index)
                except ValueError:
                    summary["unreadable_lines"] += 1
                    continue
                records.append(record)
                lines.append(json.dumps(genai_record(line, record, rollout_id=rollout_id), default=str).encode() + b"\n")
            summary["unreadable_lines"] += result.invalid_count
            summary["torn_tails"] += int(result.torn_tail)
            summary["late_writes"] += result.late_writes
            if result.incomplete:
                summary["incomplete"].append(rollout_id)
            metrics = aggregate_metrics(records)
            summary["rollouts"][rollout_id] = {
                "calls": len(records),
                "file": f"calls/{rollout_id}.capture.jsonl",
                "errors": metrics["num_errors"],
            }
            all_records.extend(records)
    summary["metrics"] = aggregate_metrics(all_records)
    return lines, summary


def _usage(metrics: Mapping[str, Any] | None) -> dict[str, int | None]:
    metrics = metrics or {}
    return {name: metrics.get(key) for key, name in _USAGE_KEYS}


def _health_document(
    paths: CapsulePaths,
    calls: Mapping[str, Any],
    tampered: list[dict[str, str]],
    uncaptured: list[dict[str, Any]],
) -> dict[str, Any]:
    processes = sum_process_health(paths.process_health)
    totals = processes["totals"]
    dropped = {event: totals[event] for event in _LOSS_EVENTS if totals.get(event)}
    in_store = sum(rollout["calls"] for rollout in calls.get("rollouts", {}).values())
    problems = bool(dropped or calls.get("unreadable_lines") or calls.get("incomplete") or tampered or uncaptured)
    return {
        "schema_version": HEALTH_SCHEMA_VERSION,
        "run_id": paths.run_id,
        "generated_at": iso_time(time.time()),
        "ok": not problems,
        "records": {
            "captured_calls": totals.get("calls_captured", 0),
            "in_flight_at_exit": totals.get("calls_in_flight_at_exit", 0),
            "written": totals.get("records_written", 0),
            "in_store": in_store,
            "unreadable_lines": calls.get("unreadable_lines", 0),
            "torn_tails": calls.get("torn_tails", 0),
            "late_writes": calls.get("late_writes", 0),
            "incomplete_rollouts": calls.get("incomplete", []),
        },
        "dropped": dropped,
        "totals": totals,
        "processes": processes["processes"],
        "unreadable_process_files": processes["unreadable_files"],
        "tampered_entries": tampered,
        "uncaptured_processes": uncaptured,
        "source": "counts reported by the workload's own processes",
    }


def _read_interpreter(paths: CapsulePaths) -> dict[str, Any] | None:
    try:
        return parse_interpreter_lines(read_regular_file(paths.interpreter).decode("utf-8", "replace"))
    except OSError:
        return None


def finalise_capsule(
    paths: CapsulePaths,
    manifest: dict[str, Any],
    outcome: CaptureOutcome,
    *,
    interpreter: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    injected_paths: Iterable[str] = (),
    uncaptured: Iterable[Mapping[str, Any]] = (),
    root_identity: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Complete the capsule and its manifest; returns the final manifest.

    `interpreter` describes the workload's Python (default: what its first process wrote to
    `internal/interpreter`, or none); `environ` is the environment it ran with; `uncaptured`
    lists processes known to run without the capture hooks (`python -I`, `-E`, `-S`).

    Raises CapsuleError, touching nothing, when the capsule's root is no longer a real directory
    (or, given `root_identity`, no longer the directory that was created): finalising through a
    link would write and delete in some other directory.
    """
    from .manifest import CapsuleError

    identity = directory_identity(paths.root)
    if identity is None or (root_identity is not None and identity != root_identity):
        raise CapsuleError(
            f"The capsule directory '{paths.root}' was replaced (by a link or another directory) while the run went on; "
            "it was not finalised, so nothing outside it is touched: look for the original capsule directory."
        )
    tampered = _remove_special_entries(paths)
    from .spool import drain_spool

    drain_spool(paths)  # the records of the calls the workload's processes spooled (llmtap run)
    if _has_calls(paths):
        try:
            model_lines, calls = _project_calls(paths)
        except LlmtapError as exc:  # calls/ replaced again, or a planted file: report, never follow
            tampered.append({"path": "calls", "kind": "unreadable", "error": str(exc)})
            model_lines, calls = [], {"rollouts": {}, "metrics": None}
    else:
        model_lines, calls = [], {"rollouts": {}, "metrics": None}
    write_file_atomic(paths.model_calls, b"".join(model_lines), sync=False)
    health = _health_document(paths, calls, tampered, [dict(entry) for entry in uncaptured])
    write_json_atomic(paths.capture_health, health, sync=False)
    if interpreter is None:
        interpreter = _read_interpreter(paths)
    source = str(manifest.get("capture_mode", "unknown"))
    write_json_atomic(
        paths.env_lock,
        env_lock(interpreter, environ if environ is not None else os.environ, source=source, injected_paths=injected_paths),
        sync=False,
    )
    metrics = calls.get("metrics") or {}
    manifest.update(
        {
            "status": outcome.status,
            "ended_at": iso_time(outcome.ended_at),
            "duration_ms": outcome.duration_ms,
            "exit_code": outcome.exit_code,
            "error": outcome.error,
            "counts": {
                "model_calls": len(model_lines),
                "rollouts": len(calls.get("rollouts", {})),
                "errors": metrics.get("num_errors", 0),
                "errors_by_category": metrics.get("errors_by_category", {}),
                "records_dropped": sum(health["dropped"].values()),
            },
            "usage": _usage(metrics),
            "rollouts": calls.get("rollouts", {}),
            "capture_health": {"ok": health["ok"], "file": paths.capture_health.name},
            "files": {
                "calls": "calls",
                "model_calls": paths.model_calls.name,
                "env_lock": paths.env_lock.name,
                "capture_health": paths.capture_health.name,
                **({"stdout": "outputs/stdout.txt", "stderr": "outputs/stderr.txt"} if paths.outputs.is_dir() else {}),
            },
        }
    )
    if tampered:
        manifest["capture_tampered"] = tampered
    # The other files durable first, then the manifest that says the run is done: one pass of syncs.
    write_json_last(paths.manifest, manifest, after=[paths.model_calls, paths.capture_health, paths.env_lock])
    return manifest
