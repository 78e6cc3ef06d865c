"""`llmtap records`: look at what a capture directory holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import orjson
from rich.console import Console
from rich.table import Table

from ..errors import LlmtapError, UnsafeCaptureFileError
from ..store import CaptureStore
from ..store.readers import aggregate_model_call_metrics, read_rollout_calls
from .display import calls_table, format_value, metrics_line, print_table
from .options import capture_dir_or_argument

__all__ = ["records"]

# `--capture-dir DIR` as in every other command; `DIR` first, as before, still works.
capture_dir_argument = capture_dir_or_argument()


def _open_store(capture_dir: Path) -> CaptureStore:
    return CaptureStore(capture_dir, create=False)


@click.group()
def records() -> None:
    """Inspect captured model calls in a capture directory."""


@records.command("list")
@capture_dir_argument
def list_rollouts(capture_dir: Path) -> None:
    """List the rollouts in a capture directory with their call counts."""
    store = _open_store(capture_dir)
    table = Table("rollout", "calls", "errors", "unreadable", "tokens in", "tokens out", "flags")
    for rollout_id in store.rollouts():
        calls = _read(store, rollout_id)
        metrics = aggregate_model_call_metrics(calls.records)
        flags = []
        if calls.incomplete:
            flags.append("incomplete")
        if calls.late_writes:
            flags.append(f"late={calls.late_writes}")
        table.add_row(
            rollout_id,
            str(metrics["num_calls"]),
            str(metrics["num_errors"]),
            str(len(calls.unreadable_lines)),
            format_value(metrics["tokens_in"]),
            format_value(metrics["tokens_out"]),
            ",".join(flags),
        )
    Console().print(table)


@records.command("status")
@capture_dir_argument
def status(capture_dir: Path) -> None:
    """Print where a capture directory is and what it holds: rollouts, calls, size, problems."""
    store = _open_store(capture_dir)
    rollouts = store.rollouts()
    calls = errors = unreadable = torn = failures = size = 0
    incomplete: list[str] = []
    refused: list[str] = []
    late = 0
    for rollout_id in rollouts:
        try:
            read = read_rollout_calls(store, rollout_id)
        except LlmtapError as exc:
            if isinstance(exc.__cause__, UnsafeCaptureFileError):  # a link or FIFO planted at its file: never followed
                refused.append(rollout_id)
                continue
            raise click.ClickException(str(exc)) from None
        calls += len(read.records)
        errors += sum(1 for record in read.records if record.error_category is not None)
        unreadable += len(read.unreadable_lines)
        torn += int(read.torn_tail)  # a cut-off last line: damage, even if a write may still finish it
        failures += read.capture_failures
        late += read.late_writes
        size += store.size_of(rollout_id)
        if read.incomplete:
            incomplete.append(rollout_id)
    click.echo(f"directory: {store.root}")
    click.echo(f"rollouts: {len(rollouts)}  calls: {calls}  errors: {errors}  size: {size:,} bytes")
    click.echo(f"damaged lines: {unreadable + torn} (torn tails: {torn})  late writes set aside: {late}")
    click.echo(f"capture failures: {failures}")
    click.echo(f"incomplete (a write failed): {', '.join(incomplete) if incomplete else 'none'}")
    if refused:
        click.echo(f"refused (not a regular file, never read): {', '.join(refused)}")


@records.command("path")
@capture_dir_or_argument("rollout_id")
def path(capture_dir: Path, rollout_id: str) -> None:
    """Print the capture file of a rollout."""
    store = _open_store(capture_dir)
    try:
        click.echo(str(store.path_for(rollout_id)))
    except LlmtapError as exc:
        raise click.ClickException(str(exc)) from None


@records.command("show")
@capture_dir_or_argument("rollout_id")
@click.option("--json", "as_json", is_flag=True, help="Print the normalized records as JSON lines.")
@click.option("--payloads/--no-payloads", default=False, help="With --json, include request and response payloads.")
@click.option("--wide", is_flag=True, help="Show every column, whatever the terminal's width.")
def show(capture_dir: Path, rollout_id: str, as_json: bool, payloads: bool, wide: bool) -> None:
    """Show a rollout's captured calls as a table, with totals."""
    store = _open_store(capture_dir)
    calls = _read(store, rollout_id)
    if not calls.exists and not calls.incomplete:
        raise click.ClickException(
            f"No capture for rollout {rollout_id!r} in '{capture_dir}'; `llmtap records list {capture_dir}` shows what is there."
        )
    if as_json:
        for record in calls.records:
            click.echo(orjson.dumps(record.to_dict(include_payloads=payloads)).decode())
        return
    console = Console()
    print_table(console, calls_table(f"rollout {rollout_id}", calls.records, width=console.width, wide=wide), wide=wide)
    hosted = _hosted_calls_table(calls.records)
    if hosted is not None:
        console.print(hosted)
    console.print(metrics_line(aggregate_model_call_metrics(calls.records)))
    if calls.unreadable_lines:
        console.print(f"[yellow]{len(calls.unreadable_lines)} damaged line(s) skipped at call_index {calls.unreadable_lines}[/]")
    if calls.incomplete:
        console.print("[yellow]A capture write failed for this rollout (.capture.incomplete marker present).[/]")
    if calls.late_writes:
        console.print(f"[yellow]{calls.late_writes} late write(s) from a cleared attempt were set aside.[/]")
    _print_tool_calls(capture_dir, rollout_id, calls.records)


def _print_tool_calls(capture_dir: Path, rollout_id: str, model_calls: list[Any]) -> None:
    """The rollout's MCP tool calls (`<rollout_id>.tool-calls.jsonl`), between the model calls that asked for them."""
    from ..mcp.timeline import interleave, tool_call_line
    from ..store.tool_calls import read_tool_calls

    try:
        read = read_tool_calls(capture_dir, rollout_id)
    except LlmtapError as exc:
        raise click.ClickException(str(exc)) from None
    if not read.records:
        return
    click.echo(f"timeline: {len(model_calls)} model call(s), {len(read.records)} MCP request(s)")
    for kind, item in interleave(model_calls, [call.started_at for call in model_calls], read.records):
        if kind == "model":
            click.echo(f"  model call {item.call_index}  {item.model or '?'}  status {item.status_code}")
        else:
            click.echo(tool_call_line(item))
    if read.unreadable_lines:
        click.echo(f"{read.unreadable_lines} damaged tool-call line(s) skipped")


def _hosted_calls_table(records: Any) -> Table | None:
    """One row per tool call the provider ran itself (not in the "tools" column), or None when there are none."""
    rows = [(record.call_index, hosted) for record in records for hosted in record.hosted_tool_calls]
    if not rows:
        return None
    table = Table("#", "hosted tool", "type", "call id", "status", "result", title="hosted tool calls", title_justify="left")
    for call_index, hosted in rows:
        table.add_row(
            str(call_index),
            str(hosted.get("name") or "-"),
            str(hosted.get("type") or "-"),
            str(hosted.get("call_id") or "-"),
            str(hosted.get("status") or "-"),
            "yes" if hosted.get("result") is not None else "-",
        )
    return table


def _read(store: CaptureStore, rollout_id: str) -> Any:
    try:
        return read_rollout_calls(store, rollout_id)
    except LlmtapError as exc:
        raise click.ClickException(str(exc)) from None
