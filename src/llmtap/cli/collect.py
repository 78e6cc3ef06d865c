"""`llmtap collect` and `llmtap attach`: rollout records with their captured calls attached."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from ..errors import LlmtapError
from .options import capture_dir_option

__all__ = ["attach", "collect"]

_CAPTURE_DIR_OVERRIDE = "++model_call_capture_dir="
_OBSERVABILITY_OVERRIDE = "++observability_enabled="


def _attach_options(trajectory: bool, include_payloads: bool, keep_payloads_out: bool) -> Any:
    from ..rollouts.attach import AttachOptions

    return AttachOptions(trajectory=trajectory, include_payloads=include_payloads, keep_payloads_out=keep_payloads_out)


def _attach_option_flags(command: Any) -> Any:
    """The attachment options shared by `collect` and `attach`."""
    for decorator in reversed(
        [
            click.option("--trajectory/--no-trajectory", default=True, show_default=True, help="Project ng_trajectory."),
            click.option("--include-payloads", is_flag=True, help="Keep payloads on attached calls when there is no trajectory."),
            click.option("--keep-payloads-out", is_flag=True, help="No request/response payload copies in the rows at all."),
        ]
    ):
        command = decorator(command)
    return command


class _RateColumn(ProgressColumn):
    """Rollouts per second (or per minute, when slower than one a second)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        if not speed:
            return Text("-- /s", style="progress.data.speed")
        return Text(f"{speed:.2f}/s" if speed >= 1 else f"{speed * 60:.1f}/min", style="progress.data.speed")


class _ErrorsColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        errors = int(task.fields.get("errors", 0))
        return Text(f"{errors} errors", style="bold red" if errors else "dim")


def _parse_overrides(overrides: tuple[str, ...], capture_dir: Path | None) -> Path | None:
    """Accept the spec's `++model_call_capture_dir=...` and `++observability_enabled=...` overrides."""
    enabled = True
    for override in overrides:
        if override.startswith(_CAPTURE_DIR_OVERRIDE):
            capture_dir = Path(override[len(_CAPTURE_DIR_OVERRIDE) :])
        elif override.startswith(_OBSERVABILITY_OVERRIDE):
            enabled = override[len(_OBSERVABILITY_OVERRIDE) :].strip().lower() in ("true", "1", "yes")
        else:
            raise click.UsageError(
                f"Unknown argument {override!r}; collect takes ++model_call_capture_dir=DIR and ++observability_enabled=BOOL."
            )
    return capture_dir if enabled else None


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--agent-url", required=True, help="Base URL of the agent server; rows go to its POST /run.")
@click.option("--input", "input_path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path), help="Task rows (JSONL).")
@click.option("--output", "output_path", required=True, type=click.Path(dir_okay=False, path_type=Path), help="Rollout rows (JSONL).")
@capture_dir_option("The model server's capture directory; attach its calls.")
@click.option("--num-repeats", type=click.IntRange(min=1), default=1, show_default=True, help="Rollouts per task.")
@click.option("--limit", type=click.IntRange(min=0), help="Collect only the first N tasks.")
@click.option("--concurrency", type=click.IntRange(min=1), default=8, show_default=True, help="Rollouts in flight at once.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=1800.0, show_default=True, help="Seconds one rollout may take.")
@click.option("--resume", is_flag=True, help="Finish an interrupted run: send only rollouts without a finished row.")
@click.option("--overwrite", is_flag=True, help="Start over when the output already holds rows.")
@click.option("--max-attempts", type=click.IntRange(min=1), default=3, show_default=True, help="Failed attempts after which --resume stops retrying a rollout.")
@click.option("--model-sampling", help='Sampling values for rows without _ng_model_sampling, as JSON: \'{"temperature": 0.7}\'.')
@_attach_option_flags
@click.option("--progress/--no-progress", default=True, help="Show the progress bar.")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def collect(
    agent_url: str,
    input_path: Path,
    output_path: Path,
    capture_dir: Path | None,
    num_repeats: int,
    limit: int | None,
    concurrency: int,
    timeout_s: float,
    resume: bool,
    overwrite: bool,
    max_attempts: int,
    model_sampling: str | None,
    trajectory: bool,
    include_payloads: bool,
    keep_payloads_out: bool,
    progress: bool,
    overrides: tuple[str, ...],
) -> None:
    """Send each task row to an agent's POST /run and write one row per rollout with its calls attached.

    Ctrl-C leaves a resumable output: run the same command with --resume to finish it.
    """
    from ..rollouts.collect import CollectReport, collect_rollouts

    capture_dir = _parse_overrides(overrides, capture_dir)
    sampling: dict[str, Any] | None = None
    if model_sampling is not None:
        try:
            sampling = json.loads(model_sampling)
        except json.JSONDecodeError:
            raise click.BadParameter(f"{model_sampling!r} is not JSON; pass an object such as '{{\"temperature\": 0.7}}'.", param_hint="--model-sampling") from None
        if not isinstance(sampling, dict):
            raise click.BadParameter(f"{model_sampling!r} is not a JSON object.", param_hint="--model-sampling")
    console = Console(stderr=True)
    if capture_dir is None:
        console.print("[yellow]No --capture-dir: rows are written without captured calls.[/]")
    bar = Progress(
        TextColumn("[bold]collect"), BarColumn(), MofNCompleteColumn(), _RateColumn(), _ErrorsColumn(),
        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
        console=console, disable=not progress, speed_estimate_period=600.0,
    )  # fmt: skip
    task_id = bar.add_task("collect", total=None, errors=0)

    def show(report: CollectReport) -> None:
        bar.update(task_id, total=report.to_dispatch, completed=report.finished, errors=report.failed)

    try:
        with bar:
            report = collect_rollouts(
                input_path, output_path, agent_url=agent_url, capture_dir=capture_dir, progress=show,
                num_repeats=num_repeats, limit=limit, concurrency=concurrency, timeout_s=timeout_s, resume=resume,
                overwrite=overwrite, max_attempts=max_attempts, model_sampling=sampling,
                attach_options=_attach_options(trajectory, include_payloads, keep_payloads_out),
            )  # fmt: skip
    except LlmtapError as exc:
        raise click.ClickException(str(exc)) from None
    _summarize(console, report)
    if report.interrupted:
        sys.exit(130)


def _summarize(console: Console, report: Any) -> None:
    errors = ", ".join(f"{kind}={count}" for kind, count in sorted(report.error_counts.items()))
    done = f" ({report.already_done} already done)" if report.already_done else ""
    console.print(
        f"{report.finished} rollouts written{done}: {report.succeeded} ok, {report.failed} with errors"
        f"{f' ({errors})' if errors else ''}, in {report.elapsed_s:.1f} s -> {report.output_path}"
    )
    if report.dropped_lines:
        console.print(f"{report.dropped_lines} unreadable or superseded lines were dropped from the output.")
    if report.interrupted:
        console.print("[yellow]Interrupted.[/] Run the same command with --resume to finish; no finished row is lost.")
    elif report.failed:
        console.print("Run the same command with --resume to retry the rollouts that failed.")


@click.command()
@click.argument("rollouts", type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="ROLLOUTS.jsonl")
@capture_dir_option("Capture directory the model server wrote to.", required=True, must_exist=True)
@click.option("--output", "output_path", type=click.Path(dir_okay=False, path_type=Path), help="Where to write (default: replace ROLLOUTS.jsonl atomically).")
@_attach_option_flags
def attach(
    rollouts: Path,
    capture_dir: Path,
    output_path: Path | None,
    trajectory: bool,
    include_payloads: bool,
    keep_payloads_out: bool,
) -> None:
    """Attach captured calls, trajectories and terminal attribution to rollouts another tool produced."""
    from ..rollouts.attach import AttachReport, attach_file

    console = Console(stderr=True)

    def show(report: AttachReport) -> None:
        console.print(f"{report.rows} rows, {report.rows_per_second:.0f}/s, {report.bytes_read}/{report.total_bytes} bytes", end="\r")

    target = output_path or rollouts
    try:
        report = attach_file(
            rollouts, target, capture_dir, options=_attach_options(trajectory, include_payloads, keep_payloads_out), progress=show
        )
    except (LlmtapError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    gaps = ", ".join(f"{code}={count}" for code, count in sorted(report.gap_counts.items()))
    console.print(
        f"{report.attached} of {report.rows} rows attached ({report.calls} calls) in {report.elapsed_s:.1f} s -> {target}"
        + (f"; gaps: {gaps}" if gaps else "")
    )
    for line_number, reason in report.bad_line_samples[:10]:
        console.print(f"  line {line_number} written back unchanged: {reason}")
