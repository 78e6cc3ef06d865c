"""Finalising a capsule once its capture has ended, on success, failure or interruption alike.

Order matters: first every path finalisation manages is checked without being opened (a link,
FIFO, socket, device, hard link or swapped folder the workload put there is removed, never
followed, and reported: `tamper`); then the calls are read through the store's tolerant reader
and projected into `model-calls.jsonl`; the processes' health counts are summed into
`capture-health.json`; `env.lock` is written; every file is redacted and `redaction-proof.json`
written (the manifest about to be written is redacted in memory and hashed into the proof); and
the manifest is replaced last, so `status` flips from `running` only once everything else is on
disk.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import LlmtapError
from .envlock import env_lock, parse_interpreter_lines
from .health import sum_process_health
from .manifest import iso_time, manifest_bytes, write_manifest_last
from .tamper import sweep_managed_entries
from .writer import CapsulePaths, directory_identity, read_regular_file, write_file_atomic, write_json_atomic

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
    "event_write_failed",  # tool-call or network-event lines the collector could not append
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


def _has_calls(paths: CapsulePaths) -> bool:
    try:
        return any(name.endswith((".capture.jsonl", ".capture.incomplete")) for name in os.listdir(paths.calls))
    except OSError:
        return False


def _project_calls(paths: CapsulePaths) -> tuple[list[bytes], dict[str, Any]]:
    """Read every rollout's calls; return the model-calls lines and the store's view of the calls."""
    from ..export.genai import genai_record
    from ..records import ModelCallRecord, aggregate_metrics
    from ..store import CaptureStore
    from ..store.readers import read_rollout_calls_with_lines

    lines: list[bytes] = []
    summary: dict[str, Any] = {"rollouts": {}, "unreadable_lines": 0, "torn_tails": 0, "incomplete": [], "late_writes": 0}
    all_records: list[ModelCallRecord] = []
    with CaptureStore(paths.calls, create=False, refuse_links=True) as store:
        for rollout_id in store.rollouts():
            result, raw_lines = read_rollout_calls_with_lines(store, rollout_id)
            for line, record in zip(raw_lines, result.records):
                lines.append(json.dumps(genai_record(line, record, rollout_id=rollout_id), default=str).encode() + b"\n")
            summary["unreadable_lines"] += len(result.unreadable_lines)
            summary["torn_tails"] += int(result.torn_tail)
            summary["late_writes"] += result.late_writes
            if result.incomplete:
                summary["incomplete"].append(rollout_id)
            metrics = aggregate_metrics(result.records)
            summary["rollouts"][rollout_id] = {
                "calls": len(result.records),
                "file": f"calls/{rollout_id}.capture.jsonl",
                "errors": metrics["num_errors"],
            }
            all_records.extend(result.records)
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
    unhooked = unhooked_model_traffic(totals)
    problems = bool(dropped or calls.get("unreadable_lines") or calls.get("incomplete") or tampered or uncaptured or unhooked)
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
        "unhooked_model_traffic": unhooked,
        "totals": totals,
        "processes": processes["processes"],
        "unreadable_process_files": processes["unreadable_files"],
        "tampered_entries": tampered,
        "uncaptured_processes": uncaptured,
        "source": "counts reported by the workload's own processes",
    }


def unhooked_model_traffic(totals: Mapping[str, int]) -> list[dict[str, Any]]:
    """Connections to model-API hosts no hook recorded (`hooks.socket_watch` counts), most first."""
    prefix = "unhooked_connections:"
    found = []
    for key, count in totals.items():
        if not key.startswith(prefix):
            continue
        host, _, rest = key[len(prefix) :].partition(":")
        port, _, module = rest.partition(":")
        found.append({"host": host, "port": int(port) if port.isdigit() else None, "module": module or None, "connections": count})
    return sorted(found, key=lambda entry: (-entry["connections"], entry["host"], str(entry["module"])))


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
    from ..trust.proof import PROOF_NAME
    from .manifest import CapsuleError

    identity = directory_identity(paths.root)
    if identity is None or (root_identity is not None and identity != root_identity):
        raise CapsuleError(
            f"The capsule directory '{paths.root}' was replaced (by a link or another directory) while the run went on; "
            "it was not finalised, so nothing outside it is touched: look for the original capsule directory."
        )
    tampered: list[dict[str, str]] = sweep_managed_entries(paths)
    from ..spool.collector import drain_spool

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
    uncaptured_list = [dict(entry) for entry in uncaptured]
    health = _health_document(paths, calls, tampered, uncaptured_list)
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
            "capture_health": {
                "ok": health["ok"],
                "file": paths.capture_health.name,
                **({"unhooked_model_traffic": health["unhooked_model_traffic"]} if health["unhooked_model_traffic"] else {}),
            },
            "files": {
                "calls": "calls",
                "model_calls": paths.model_calls.name,
                "env_lock": paths.env_lock.name,
                "capture_health": paths.capture_health.name,
                "redaction_proof": PROOF_NAME,
                **({"stdout": "outputs/stdout.txt", "stderr": "outputs/stderr.txt"} if paths.outputs.is_dir() else {}),
            },
        }
    )
    for key, path in (("tool_calls", paths.tool_calls), ("network_events", paths.network_events)):
        lines = _count_lines(path)
        if lines is not None:
            manifest["files"][key] = path.name
            manifest["counts"][key] = lines
    content = _redact(paths, manifest, tampered, lambda: _health_document(paths, calls, tampered, uncaptured_list))
    written = [paths.model_calls, paths.capture_health, paths.env_lock, paths.root / PROOF_NAME, paths.stdout, paths.stderr]
    write_manifest_last(paths, content, after=written)
    final: dict[str, Any] = json.loads(content)  # as on disk: redacted
    return final


def _redact(
    paths: CapsulePaths, manifest: dict[str, Any], tampered: list[dict[str, str]], health: Callable[[], dict[str, Any]]
) -> bytes:
    """Redact every capsule file and write the proof; return the redacted manifest bytes to write last.

    Redaction refuses a file that is no longer a regular file with one name, which only a workload
    process still running (one that outlived the linger) can cause after the sweep: then the sweep
    runs again, what it finds is recorded as tampering, and redaction is tried once more. If that
    fails too the capsule keeps no proof (`validate` says so), the manifest says why
    (`redaction_error`, paths only) and is still redacted itself.
    """
    from ..trust.proof import ProofBuilder
    from ..trust.redact_files import redact_capsule, redact_file_bytes

    error = None
    for _ in range(2):
        if tampered:
            manifest["capture_tampered"] = tampered
        content = manifest_bytes(manifest)
        try:
            summary = redact_capsule(paths.root, manifest=content, tampered_entries=tampered, sync=False)
        except (LlmtapError, OSError) as exc:
            error = _error_text(exc)
            again = sweep_managed_entries(paths)
            if again:  # swapped after the first sweep: tampering; anything else (a full disk) is not
                tampered.extend(again)
                write_json_atomic(paths.capture_health, health(), sync=False)
            continue
        assert summary.manifest is not None
        return summary.manifest
    if tampered:
        manifest["capture_tampered"] = tampered
    manifest["files"].pop("redaction_proof", None)
    manifest["redaction_error"] = error
    return redact_file_bytes(manifest_bytes(manifest), "json", ProofBuilder(), "capsule.json")


def _count_lines(path: Any) -> int | None:
    """How many lines an event stream file holds; None when there is none (or it is not a plain file)."""
    try:
        return read_regular_file(path).count(b"\n")
    except OSError:
        return None


def _error_text(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, LlmtapError) else f"{type(exc).__name__}: {getattr(exc, 'strerror', None) or exc}"
