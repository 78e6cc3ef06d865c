"""`llmtap diff A B`: what changed between two runs, and `--assert-no-regressions` as a CI gate."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

__all__ = ["diff"]

EXIT_REGRESSION = 1
EXIT_NOT_COMPARABLE = 2


def _fraction(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    from ..diff.gate import parse_fraction

    if value is None:
        return None
    try:
        return parse_fraction(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command()
@click.argument("run_a", metavar="A")
@click.argument("run_b", metavar="B")
@click.option(
    "--key",
    "key_fields",
    multiple=True,
    help="Align collect/attach rows by this row key instead of the rollout id (repeat for a compound key).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON (same as --format json).")
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json", "github"]),
    default=None,
    help="text (default), json, or github (GitHub Actions annotations).",
)
@click.option("--assert-no-regressions", is_flag=True, help="Exit 1 when B regresses against A, listing each reason.")
@click.option("--allow-added", is_flag=True, help="With the gate: calls new in B are not a regression.")
@click.option(
    "--max-token-increase", callback=_fraction, help="With the gate: fail when tokens in+out grow more (10% or 0.1)."
)
@click.option(
    "--max-latency-p95-increase", callback=_fraction, help="With the gate: fail when call latency p95 grows more."
)
@click.option(
    "--runs-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where run ids and 'latest' are looked up (default: $LLMTAP_RUNS_DIR or .llmtap/runs).",
)
def diff(
    run_a: str,
    run_b: str,
    key_fields: tuple[str, ...],
    as_json: bool,
    output_format: str | None,
    assert_no_regressions: bool,
    allow_added: bool,
    max_token_increase: float | None,
    max_latency_p95_increase: float | None,
    runs_dir: Path | None,
) -> None:
    """Compare two runs (capsules, capture directories, collect/attach rows, or run ids): rollouts by id, calls aligned.

    Exit 0 when comparable (and, with --assert-no-regressions, no regression), 1 on a regression, 2
    when the inputs are not comparable.
    """
    from ..diff.comparison import compare_runs
    from ..diff.gate import GateOptions, evaluate_gate
    from ..diff.render import render_github, render_text, to_json
    from ..diff.sources import open_source
    from ..errors import LlmtapError

    if (
        allow_added or max_token_increase is not None or max_latency_p95_increase is not None
    ) and not assert_no_regressions:
        raise click.UsageError(
            "--allow-added and the --max-* thresholds belong to the gate; add --assert-no-regressions."
        )
    output = "json" if as_json else output_format or "text"
    try:
        with (
            open_source(run_a, key_fields=key_fields, runs_dir=runs_dir) as source_a,
            open_source(run_b, key_fields=key_fields, runs_dir=runs_dir) as source_b,
        ):
            comparison = compare_runs(source_a, source_b)
    except LlmtapError as exc:  # DiffInputError, or a store that could not be read
        click.echo(f"Error: the runs are not comparable: {exc}", err=True)
        sys.exit(EXIT_NOT_COMPARABLE)
    gate = None
    if assert_no_regressions:
        options = GateOptions(allow_added, max_token_increase, max_latency_p95_increase)
        gate = evaluate_gate(comparison, options)
    if output == "json":
        click.echo(json.dumps(to_json(comparison, gate), indent=2, ensure_ascii=False))
    elif output == "github":
        for line in render_github(comparison, gate):
            click.echo(line)
    else:
        from rich.console import Console

        render_text(comparison, gate, Console(soft_wrap=True, highlight=False))
    if gate is not None and not gate.passed:
        sys.exit(EXIT_REGRESSION)
