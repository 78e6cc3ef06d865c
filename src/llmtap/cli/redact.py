"""`llmtap redact DIR`: redact the secrets in a capture directory's rollout files, with proof."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import LlmtapError

__all__ = ["redact"]


@click.command()
@click.argument("capture_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), metavar="DIR")
def redact(capture_dir: Path) -> None:
    """Redact secrets in a capture directory's rollout files and write redaction-proof.json."""
    from ..trust import PROOF_NAME, redact_capture_dir

    try:
        summary = redact_capture_dir(capture_dir)
    except (LlmtapError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    changed = summary.changed_files
    click.echo(
        f"{summary['findings_count']} secret(s) redacted in {len(changed)} of {len(summary['files'])} file(s); "
        f"proof: {capture_dir / PROOF_NAME}"
    )
