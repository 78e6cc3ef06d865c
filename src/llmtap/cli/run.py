"""`llmtap run -- CMD ...`: run a program with every model call it makes captured into a run capsule."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..errors import LlmtapError

__all__ = ["run"]


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--capsule-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory the run capsule is created in (default: $LLMTAP_RUNS_DIR or .llmtap/runs).",
)
@click.option(
    "--registry",
    "registry_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="URL registry to use instead of $LLMTAP_URL_REGISTRY, ~/.llmtap/url_registry.yaml or the built-in one.",
)
@click.option("-q", "--quiet", is_flag=True, help="Do not print the capsule summary line on stderr.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(capsule_dir: Path | None, registry_path: Path | None, quiet: bool, command: tuple[str, ...]) -> None:
    """Run COMMAND with its model calls captured; exits with COMMAND's exit code.

    Every Python process COMMAND starts is captured (subprocesses and multiprocessing workers
    too). Its output is shown live and kept in the capsule. Example:

        llmtap run -- python agent.py --task 3
    """
    from ..capsule.runner import run_captured

    try:
        result = run_captured(list(command), runs_dir=capsule_dir, registry_path=registry_path)
    except LlmtapError as exc:
        raise click.ClickException(str(exc)) from None
    if not quiet:
        counts = result.manifest.get("counts", {})
        dropped = counts.get("records_dropped", 0)
        note = f", {dropped} record(s) dropped (see capture-health.json)" if dropped else ""
        click.echo(
            f"llmtap: run {result.capsule.name} {result.status} (exit {result.exit_code}), "
            f"{counts.get('model_calls', 0)} model call(s){note} -> {result.capsule}",
            err=True,
        )
    sys.exit(result.exit_code)


if __name__ == "__main__":  # `python -m llmtap.cli.run -- CMD ...`
    run()
