"""The replay report: what a replay served, missed and skipped, as JSON in the new capsule and a readable summary.

Written by every mode (`mocked`, `intervention`, `exact`, `forensic`) as `replay-report.json`
in the capsule the replay made. It states only what was checked: a miss is listed with the
closest recorded call and the differing fields; recorded calls the run never asked for are
listed as unserved; `ok` is true only when there was no miss, no refused connection, and
nothing left unserved. An intervention is ok when its replacement was used, nothing was refused,
and every miss after it went to the live model (`--on-miss passthrough`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import orjson

from .matching import MATCH_KEY_VERSION, RecordingIndex

__all__ = ["REPORT_NAME", "mocked_report", "read_events", "summary_text", "write_report"]

REPORT_NAME = "replay-report.json"
MAX_EVENTS_BYTES = 64 * 1024 * 1024


def read_events(path: Path) -> list[dict[str, Any]]:
    """Read the workload's replay events (a file inside a capsule it could have replaced: no links, bounded)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return []
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_EVENTS_BYTES)
    finally:
        os.close(fd)
    events = []
    for line in data.splitlines():
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(value, dict):
            events.append(value)
    return events


def mocked_report(
    mode: str, source: Path, index: RecordingIndex, events: list[dict[str, Any]], exit_code: int | None
) -> dict[str, Any]:
    """The report of a mocked (or intervention) replay, from the recording and the workload's events."""
    served = {(event.get("rollout_id"), event.get("call_index")) for event in events if event.get("event") == "served"}
    misses = [event for event in events if event.get("event") == "miss"]
    refused = [event for event in events if event.get("event") == "network_refused"]
    replaced = [event for event in events if event.get("event") == "served" and event.get("replaced")]
    reencoded = [event for event in events if event.get("event") == "served" and event.get("exact_bytes") is False]
    tools_replaced = [event for event in events if event.get("event") == "tool_result_replaced"]
    passthrough = sum(1 for event in events if event.get("event") == "passthrough")
    unserved = [
        {"rollout_id": call.rollout_id, "call_index": call.call_index}
        for call in index
        if (call.rollout_id, call.call_index) not in served
    ]
    report = {
        "mode": mode,
        "replay_of": str(source),
        "match_key_version": MATCH_KEY_VERSION,
        "recorded_calls": sum(1 for _ in index),
        "served": len(served),
        "misses": [{key: value for key, value in miss.items() if key not in ("event", "pid")} for miss in misses],
        "passthrough": passthrough,
        "network_refused": [{"host": event.get("host"), "port": event.get("port")} for event in refused],
        "replaced": [{"rollout_id": event.get("rollout_id"), "call_index": event.get("call_index")} for event in replaced],
        "replaced_tool_results": [{"tool": e.get("tool"), "occurrence": e.get("occurrence")} for e in tools_replaced],
        "unserved": unserved,
        # Served as the recorded JSON value, not its bytes (records.json_layout): said, not failed.
        "reencoded": [{"rollout_id": e.get("rollout_id"), "call_index": e.get("call_index")} for e in reencoded],
        "workload_exit_code": exit_code,
        "ok": not misses and not refused and not unserved,
    }
    if mode == "intervention":
        # The run is meant to leave the recording once the replacement is in: its misses are the
        # experiment when they went to the live model, and the recorded calls after them go unasked.
        applied = bool(replaced or tools_replaced)
        report["intervention_applied"] = applied
        report["ok"] = applied and not refused and len(misses) <= passthrough
    return report


def write_report(capsule: Path, report: dict[str, Any]) -> Path:
    """Write `replay-report.json` into a capsule (a new file: never through a link)."""
    path = capsule / REPORT_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    return path


def summary_text(report: dict[str, Any]) -> str:
    """A few readable lines summarising a replay report."""
    lines = [f"llmtap replay ({report.get('mode')}): {report.get('replay_of')}"]
    if "calls" in report:  # forensic and exact list calls
        for call in report["calls"]:
            verdict = call.get("reproduced")
            mark = "" if verdict is None else (" reproduced" if verdict else " DIFFERENT")
            lines.append(
                f"  {call.get('rollout_id')}#{call.get('call_index')} {call.get('endpoint')} {call.get('model')} "
                f"status {call.get('status_code')}{mark}"
            )
    if "served" in report:
        lines.append(f"  served {report['served']} of {report.get('recorded_calls')} recorded calls")
    for miss in report.get("misses", []):
        closest = miss.get("closest") or {}
        lines.append(
            f"  MISS rollout '{miss.get('rollout_id')}' ({miss.get('reason')}), closest call "
            f"{closest.get('rollout_id')}#{closest.get('call_index')}"
        )
        for difference in miss.get("differences", []):
            lines.append(f"    {difference.get('pointer')}: recorded {difference.get('before')}, now {difference.get('after')}")
    for refused in report.get("network_refused", []):
        lines.append(f"  REFUSED a connection to {refused.get('host')}:{refused.get('port')}")
    for replaced in report.get("replaced", []):
        lines.append(f"  REPLACED the answer of {replaced.get('rollout_id')}#{replaced.get('call_index')}")
    for replaced in report.get("replaced_tool_results", []):
        lines.append(f"  REPLACED the result of tool {replaced.get('tool')!r} (its call {replaced.get('occurrence')})")
    if report.get("intervention_applied") is False:
        lines.append("  the intervention never applied: no call it names was made")
    if report.get("reencoded"):
        count = len(report["reencoded"])
        lines.append(f"  {count} JSON answers were sent as the recorded value, not the recorded bytes")
    if report.get("unserved"):
        lines.append(f"  {len(report['unserved'])} recorded calls were never asked for")
    lines.append("  ok" if report.get("ok") else "  NOT ok")
    return "\n".join(lines)
