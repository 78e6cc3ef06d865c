"""The capsule a forensic or exact replay writes: its report, and for exact the live answers as records.

Mocked and intervention replays run a workload, so `llmtap run`'s machinery makes their capsule.
Forensic and exact replays run no workload, yet their outcome is evidence too: each writes a
new capsule of its own, like any run's, whose capsule.json names the recording
(`replay_of`, `replay_mode`), with its `replay-report.json`. An exact replay also captures each
answer it got from the live endpoint into the capsule's `calls/` (under the recorded call's
rollout), so `llmtap diff RECORDING CAPSULE` compares the recorded answers with today's, and
redaction, the proof and `llmtap verify` treat those calls like any others.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .report import write_report

__all__ = ["report_into_capsule"]


def report_into_capsule(
    mode: str,
    recording: str | os.PathLike[str],
    produce: Callable[[Any], dict[str, Any]],
    *,
    runs_dir: str | os.PathLike[str] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Make a new capsule, call `produce(store)` (a CaptureStore on the capsule's calls/) for the
    report, write it into the capsule and finalise it; return (the capsule, the report).

    A failure inside `produce` still finalises the capsule, as `failure`, and is raised again.
    """
    from ..capsule.finalise import CaptureOutcome
    from ..capsule.store_capsule import store_capsule

    source = Path(recording).resolve()
    fields = {"replay_of": str(source), "replay_mode": mode}
    with store_capsule(f"replay-{mode}", runs_dir=runs_dir, manifest_fields=fields) as capsule:
        report: dict[str, Any] = {"mode": mode, "replay_of": str(source), "ok": False}
        try:
            report = produce(capsule.store)
            if not report.get("ok", False):
                capsule.outcome = CaptureOutcome("failure", exit_code=1)
        except BaseException as exc:
            report = {**report, "error": type(exc).__name__}
            raise
        finally:
            report["capsule"] = str(capsule.paths.root)
            write_report(capsule.paths.root, report)
    return capsule.paths.root, report
