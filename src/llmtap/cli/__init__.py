"""The `llmtap` command: noun groups with verb commands, each a thin layer over the library."""

from __future__ import annotations

import click

from .. import __version__
from .agent import agent
from .collect import attach, collect
from .demo import demo
from .records import records
from .serve import serve

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="llmtap")
def main() -> None:
    """Record every model call an agent or RL rollout makes, as evidence you can trust."""


main.add_command(agent)
main.add_command(attach)
main.add_command(collect)
main.add_command(demo)
main.add_command(records)
main.add_command(serve)
