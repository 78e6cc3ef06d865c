"""Running a workload against its recording: mocked and intervention replay (what `llmtap replay` does).

The workload runs exactly as under `llmtap run` (the injected `sitecustomize`, the capture hooks,
a new capsule), with `LLMTAP_REPLAY_SOURCE` naming the recording: the hooks then answer every
model call from it instead of sending (see `live`). The new capsule's capsule.json names the
replayed recording (`replay_of`, `replay_mode`), and its `replay-report.json` says what was
served, missed and never asked for. The exit code is the workload's, or 1 when it exited 0 but
a call missed or a connection was refused: a replay that did not reproduce never passes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .live import EVENTS_NAME, ON_MISS_ENV, OVERRIDE_ENV, REPLAY_ENV, SPEED_ENV, OnMiss
from .matching import RecordingIndex, recording_calls_dir
from .report import mocked_report, read_events, write_report

__all__ = ["ReplayResult", "replay_command"]

EXIT_REPLAY_FAILED = 1


@dataclass
class ReplayResult:
    """How a replayed run ended: its exit code (non-zero on any miss), its new capsule, and its report."""

    exit_code: int
    capsule: Path
    report: dict[str, Any]


def replay_command(
    source: str | os.PathLike[str],
    command: Sequence[str],
    *,
    speed: float = 0.0,
    on_miss: OnMiss = "error",
    override: str | os.PathLike[str] | None = None,
    runs_dir: str | os.PathLike[str] | None = None,
    echo: bool = True,
    environ: dict[str, str] | None = None,
) -> ReplayResult:
    """Run `command` with its model calls answered from the recording at `source`; capture it into a new capsule."""
    from ..capsule.runner import run_captured

    recording = Path(source).resolve()
    recording_calls_dir(recording)  # refuse a missing or linked recording before anything runs
    index = RecordingIndex.from_path(recording)
    if override is not None:  # checked now, so a bad file stops the replay before the workload starts
        from .intervention import load_override

        load_override(Path(override))
    mode = "intervention" if override is not None else "mocked"
    env = dict(os.environ if environ is None else environ)
    env.update({REPLAY_ENV: str(recording), SPEED_ENV: repr(float(speed)), ON_MISS_ENV: on_miss})
    if override is not None:
        env[OVERRIDE_ENV] = str(Path(override).resolve())
    else:
        env.pop(OVERRIDE_ENV, None)
    holder: dict[str, Any] = {}

    def write(root: Path) -> None:
        events = read_events(root / "internal" / EVENTS_NAME)
        holder["report"] = mocked_report(mode, recording, index, events, None)
        write_report(root, holder["report"])

    result = run_captured(
        command,
        runs_dir=runs_dir,
        echo=echo,
        environ=env,
        manifest_fields={"replay_of": str(recording), "replay_mode": mode},
        before_finalise=write,
    )
    report = holder.get("report") or {"mode": mode, "ok": False}
    report["workload_exit_code"] = result.exit_code
    if mode == "intervention":
        failed = not report.get("ok")
    else:
        failed = bool(report.get("misses")) or bool(report.get("network_refused"))
    exit_code = result.exit_code if result.exit_code != 0 else (EXIT_REPLAY_FAILED if failed else 0)
    return ReplayResult(exit_code, result.capsule, report)
