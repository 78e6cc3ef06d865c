"""The `llmtap` command: noun groups with verb commands, each a thin layer over the library.

Commands load on first use, so `llmtap run -- python agent.py` does not pay for importing the
serve, collect and display stacks before the workload starts.
"""

from __future__ import annotations

from importlib import import_module

import click

from .. import __version__

__all__ = ["main"]

# Command name -> "module:attribute" under llmtap.cli.
_COMMANDS = {
    "agent": "agent:agent",
    "attach": "collect:attach",
    "collect": "collect:collect",
    "demo": "demo:demo",
    "records": "records:records",
    "run": "run:run",
    "runs": "runs:runs",
    "serve": "serve:serve",
}


class _LazyGroup(click.Group):
    """A group whose subcommands are imported only when named (or listed for --help)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, _, attribute = target.partition(":")
        command: click.Command = getattr(import_module(f"{__name__}.{module_name}"), attribute)
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="llmtap")
def main() -> None:
    """Record every model call an agent or RL rollout makes, as evidence you can trust."""
