"""`llmtap runs`: list run capsules and show one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from ..errors import LlmtapError

__all__ = ["runs"]

capsule_dir_option = click.option(
    "--capsule-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory holding the run capsules (default: $LLMTAP_RUNS_DIR or .llmtap/runs).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


def _runs_dir(capsule_dir: Path | None) -> Path:
    from ..capsule.writer import default_runs_dir

    return capsule_dir if capsule_dir is not None else default_runs_dir()


def _command_text(manifest: dict[str, Any], width: int = 48) -> str:
    text = " ".join(str(part) for part in manifest.get("command") or [])
    return text if len(text) <= width else text[: width - 1] + "…"


def _tokens(manifest: dict[str, Any]) -> str:
    usage = manifest.get("usage") or {}
    parts = [f"{usage[key]}" if usage.get(key) is not None else "?" for key in ("input_tokens", "output_tokens")]
    return "/".join(parts)


@click.group()
def runs() -> None:
    """Look at the run capsules `llmtap run` and `llmtap.capture()` wrote."""


@runs.command("list")
@capsule_dir_option
@json_option
def list_runs(capsule_dir: Path | None, as_json: bool) -> None:
    """List runs, oldest first: id, status, exit code, calls, tokens in/out, command.

    A `running` run whose recorder is gone shows as `stale`: `llmtap runs recover RUN` finalises it.
    """
    from ..capsule.manifest import list_capsules

    found = list_capsules(_runs_dir(capsule_dir))
    if as_json:
        listed = []
        for path, manifest in found:
            entry = manifest or {"run_id": path.name, "status": "unreadable"}
            if entry.get("status") == "running":
                entry = {**entry, "runner": _runner_state(path)}
            listed.append(entry)
        click.echo(json.dumps(listed, indent=2))
        return
    if not found:
        click.echo(f"No runs under '{_runs_dir(capsule_dir)}'.")
        return
    click.echo(f"{'RUN':26}  {'STATUS':11}  {'EXIT':>4}  {'CALLS':>5}  {'TOKENS IN/OUT':>13}  {'STARTED':20}  COMMAND")
    for path, manifest in found:
        if manifest is None:
            click.echo(f"{path.name:26}  {'unreadable':11}")
            continue
        exit_code = manifest.get("exit_code")
        counts = manifest.get("counts") or {}
        status = manifest.get("status", "?")
        if status == "running" and _runner_state(path) == "gone":
            status = "stale"
        click.echo(
            f"{path.name:26}  {status:11}  {'' if exit_code is None else exit_code:>4}  "
            f"{counts.get('model_calls', ''):>5}  {_tokens(manifest):>13}  {str(manifest.get('started_at', ''))[:19]:20}  "
            f"{_command_text(manifest)}"
        )


def _runner_state(capsule: Path) -> str:
    from ..capsule.recover import runner_state

    return runner_state(capsule)


@runs.command("recover")
@click.argument("run_ref", metavar="RUN")
@capsule_dir_option
def recover_run(run_ref: str, capsule_dir: Path | None) -> None:
    """Finalise a run whose recorder died (status `interrupted`), from what its processes spooled."""
    from ..capsule.manifest import find_capsule
    from ..capsule.recover import recover_capsule

    try:
        manifest = recover_capsule(find_capsule(_runs_dir(capsule_dir), run_ref))
    except LlmtapError as exc:
        raise click.ClickException(str(exc)) from None
    counts = manifest.get("counts") or {}
    health = manifest.get("capture_health") or {}
    click.echo(
        f"Recovered run {manifest.get('run_id')}: status {manifest.get('status')}, "
        f"{counts.get('model_calls', 0)} call(s) in {counts.get('rollouts', 0)} rollout(s), "
        f"health {'ok' if health.get('ok') else 'see capture-health.json'}."
    )


@runs.command("show")
@click.argument("run_ref", metavar="RUN", default="latest")
@capsule_dir_option
@json_option
@click.option("--calls/--no-calls", default=True, help="List the captured calls (default: yes).")
@click.option("--wide", is_flag=True, help="Show every column of the calls, whatever the terminal's width.")
def show_run(run_ref: str, capsule_dir: Path | None, as_json: bool, calls: bool, wide: bool) -> None:
    """Show one run (an id, a unique id prefix, a capsule path, or `latest`)."""
    from ..capsule.manifest import find_capsule, read_manifest

    try:
        capsule = find_capsule(_runs_dir(capsule_dir), run_ref)
        manifest = read_manifest(capsule)
    except LlmtapError as exc:
        raise click.ClickException(str(exc)) from None
    model_calls = _model_calls(capsule) if calls else []
    tool_calls = _tool_calls(capsule) if calls else []
    if as_json:
        listed = {"capsule": str(capsule), "manifest": manifest, "model_calls": model_calls}
        listed["tool_calls"] = [record.to_dict() for record in tool_calls]
        click.echo(json.dumps(listed, indent=2))
        return
    counts = manifest.get("counts") or {}
    usage = manifest.get("usage") or {}
    lines = [
        f"run         {manifest.get('run_id')}  ({capsule})",
        f"status      {manifest.get('status')}  exit {manifest.get('exit_code')}",
        f"command     {' '.join(manifest.get('command') or [])}",
        f"directory   {manifest.get('working_directory')}",
        f"started     {manifest.get('started_at')}  ended {manifest.get('ended_at')}  ({manifest.get('duration_ms')} ms)",
        f"calls       {counts.get('model_calls', 0)} in {counts.get('rollouts', 0)} rollout(s), "
        f"{counts.get('errors', 0)} error(s), {counts.get('records_dropped', 0)} record(s) dropped",
        "usage       " + ", ".join(f"{key}={value}" for key, value in usage.items() if value is not None),
    ]
    if manifest.get("error"):
        lines.append(f"error       {json.dumps(manifest['error'])}")
    health = manifest.get("capture_health") or {}
    lines.append(f"health      {'ok' if health.get('ok') else 'see capture-health.json'}")
    for line in lines:
        click.echo(line)
    if model_calls:
        from rich.console import Console

        from .display import model_calls_table, print_table

        console = Console()
        print_table(console, model_calls_table(model_calls, width=console.width, wide=wide), wide=wide)
    if tool_calls:
        _print_timeline(model_calls, tool_calls)


def _tool_calls(capsule: Path) -> list[Any]:
    """The capsule's MCP tool-call records (tool-calls.jsonl); unreadable lines are skipped."""
    from ..capsule.writer import read_regular_file
    from ..mcp.records import ToolCallRecordError, parse_tool_call_line

    try:
        data = read_regular_file(capsule / "tool-calls.jsonl")
    except OSError:
        return []
    found = []
    for line in data.splitlines():
        try:
            found.append(parse_tool_call_line(line))
        except ToolCallRecordError:
            continue
    return found


def _print_timeline(model_calls: list[dict[str, Any]], tool_calls: list[Any]) -> None:
    """Model calls and the tool calls between them, in order of start."""
    from ..mcp.timeline import interleave, tool_call_line

    click.echo(f"timeline    {len(model_calls)} model call(s), {len(tool_calls)} MCP request(s)")
    numbers = {id(call): position for position, call in enumerate(model_calls)}
    for kind, item in interleave(model_calls, [call.get("start_time") for call in model_calls], tool_calls):
        if kind == "model":
            click.echo(f"  model call {numbers[id(item)]}  {item.get('name')}  {item.get('start_time')}")
        else:
            click.echo(tool_call_line(item))


def _model_calls(capsule: Path) -> list[dict[str, Any]]:
    from ..capsule.writer import read_regular_file
    from ..store.readers import json_objects

    try:
        data = read_regular_file(capsule / "model-calls.jsonl")
    except OSError:
        return []
    return json_objects(data)
