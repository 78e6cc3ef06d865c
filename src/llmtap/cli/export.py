"""`llmtap export`: send captured calls to an OpenTelemetry collector, or write them as Parquet."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import LlmtapError

__all__ = ["export", "require_export_extra"]

EXPORT_EXTRA_INSTALL = "pip install 'llmtap[export]'"

path_argument = click.argument(
    "path", type=click.Path(exists=True, file_okay=False, path_type=Path), metavar="PATH"
)


def require_export_extra(command: str) -> None:
    """Stop with the install line when the `export` extra (pyarrow, duckdb) is missing."""
    try:
        import duckdb  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError as exc:
        raise click.ClickException(
            f"`llmtap {command}` needs pyarrow and duckdb, which are not installed ({exc.name} is missing); "
            f"install them with: {EXPORT_EXTRA_INSTALL}"
        ) from None


@click.group()
def export() -> None:
    """Export captured calls (a capture directory or a run capsule) to other engines."""


@export.command("otlp")
@path_argument
@click.option(
    "--endpoint",
    help="OTLP/HTTP collector URL, base (http://host:4318) or full (.../v1/traces). "
    "Default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT, else http://localhost:4318.",
)
@click.option("--batch-size", type=click.IntRange(1, 10_000), default=512, show_default=True, help="Spans per request.")
@click.option("--timeout", type=click.FloatRange(min=0.1), help="Seconds per request, retries included (default 10).")
@click.option(
    "--content/--no-content",
    default=None,
    help="Include message content (default: OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true turns it on).",
)
def otlp(path: Path, endpoint: str | None, batch_size: int, timeout: float | None, content: bool | None) -> None:
    """Send one OpenTelemetry span per captured call to an OTLP/HTTP collector."""
    from ..export.otlp import export_otlp

    try:
        report = export_otlp(path, endpoint=endpoint, content=content, batch_size=batch_size, timeout=timeout)
    except LlmtapError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"exported {report.exported:,} of {report.calls:,} calls from {report.rollouts:,} rollouts "
        f"to {report.endpoint} in {report.batches:,} batches"
    )
    if report.skipped_no_time:
        click.echo(f"skipped {report.skipped_no_time:,} calls without a start or end time")
    if report.unreadable_lines:
        click.echo(f"skipped {report.unreadable_lines:,} damaged lines")
    if not report.ok:
        raise click.ClickException(
            f"The collector at {report.endpoint} did not accept a batch: {report.exported:,} spans exported, "
            f"{report.failed:,} failed, {report.not_sent:,} not sent. Check that the collector is up and "
            "accepts OTLP/HTTP protobuf, then run the export again (span ids are fixed, so nothing is doubled)."
        )


@export.command("parquet")
@path_argument
@click.option(
    "-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path), help="Export directory."
)
@click.option("--payloads", is_flag=True, help="Add request and response payloads as JSON text columns.")
@click.option(
    "--rollouts",
    "rollouts_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Attached rollouts JSONL (llmtap attach): adds reward and terminal attribution to the rollouts table.",
)
def parquet(path: Path, out_dir: Path, payloads: bool, rollouts_file: Path | None) -> None:
    """Write the calls and rollouts tables as Parquet; a re-run appends only what is new."""
    require_export_extra("export parquet")
    from ..export.parquet import export_parquet

    try:
        report = export_parquet(path, out_dir, payloads=payloads, rollouts_file=rollouts_file)
    except LlmtapError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"run {report.export_run}: {report.calls_written:,} new calls and {report.rollout_rows_written:,} "
        f"rollout rows from {report.rollouts_read:,} of {report.rollouts:,} rollouts, into {out_dir}"
    )
    if report.rollouts_replaced:
        click.echo(f"{report.rollouts_replaced:,} rollouts were cleared and captured again: their new calls were added")
    if report.unreadable_lines:
        click.echo(f"skipped {report.unreadable_lines:,} damaged lines")
    if report.refused_files:
        click.echo(f"refused {len(report.refused_files):,} capture files that are links or special files")
    if report.attached_bad_lines:
        click.echo(f"skipped {report.attached_bad_lines:,} lines of the rollouts file without a capture attachment")
