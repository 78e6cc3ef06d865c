"""`llmtap demo`: the main job on this machine, with the real local model."""

from __future__ import annotations

from pathlib import Path

import click

from .options import capture_dir_option

__all__ = ["demo"]


@click.command()
@capture_dir_option("Where to capture (default ./.llmtap/demo-calls).")
def demo(capture_dir: Path | None) -> None:
    """Run a tool-using agent against a local model through llmtap serve, and show what was captured."""
    from ..demo.run import run_demo
    from ..errors import LlmtapError

    try:
        run_demo(capture_dir)
    except LlmtapError as exc:
        raise click.ClickException(str(exc)) from None
