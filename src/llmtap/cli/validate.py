"""`llmtap validate PATH`: check a run capsule or capture directory before sharing it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

__all__ = ["validate"]


@click.command()
@click.argument("target", metavar="PATH")
@click.option(
    "--capsule-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory holding the run capsules, for a run id (default: $LLMTAP_RUNS_DIR or .llmtap/runs).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def validate(target: str, capsule_dir: Path | None, as_json: bool) -> None:
    """Check a capsule or capture directory: formats, redaction proof, no live secret, no tampering, counts.

    PATH is a folder, or a run id, id prefix or `latest`. Exit status: 0 when valid; 1 with one
    line per problem.
    """
    from ..capsule.manifest import CapsuleError, find_capsule
    from ..capsule.writer import default_runs_dir
    from ..trust.validate import validate_path

    path = Path(target).expanduser()
    if not path.is_dir():
        try:
            path = find_capsule(capsule_dir if capsule_dir is not None else default_runs_dir(), target)
        except CapsuleError as exc:
            raise click.ClickException(str(exc)) from None
    report = validate_path(path)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        for problem in report.problems:
            click.echo(f"{path}: {problem}")
        if report.ok:
            click.echo(f"valid: {report.kind} {report.run_id or path} ({report.files} files)")
        else:
            click.echo(f"invalid: {len(report.problems)} problem(s)")
    sys.exit(0 if report.ok else 1)
