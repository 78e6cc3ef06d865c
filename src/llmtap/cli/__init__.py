"""The `llmtap` command: noun groups with verb commands, each a thin layer over the library.

`console_main` is the console script. `llmtap run` goes straight to the runner without importing
click (its fixed cost is paid on every captured run; see `cli/run.py`); every other command, and
any `llmtap run` arguments the fast path leaves alone, go through the click group `main`. The
group and its commands are built on first use: `llmtap run -- python agent.py` does not pay for
click, the serve, collect and display stacks before the workload starts.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # click and typing are imported only when the click group is needed
if TYPE_CHECKING:
    import click

    main: click.Group

__all__ = ["console_main", "main"]

# Command name -> "module:attribute" under llmtap.cli.
_COMMANDS = {
    "agent": "agent:agent",
    "attach": "collect:attach",
    "collect": "collect:collect",
    "demo": "demo:demo",
    "diff": "diff:diff",
    "export": "export:export",
    "export-evidence": "evidence:export_evidence",
    "keys": "keys:keys",
    "mcp-proxy": "mcp:mcp_proxy",
    "query": "query:query",
    "records": "records:records",
    "redact": "redact:redact",
    "replay": "replay:replay",
    "run": "run:run",
    "runs": "runs:runs",
    "serve": "serve:serve",
    "validate": "validate:validate",
    "verify": "evidence:verify",
    "view": "view:view",
}
_main: click.Group | None = None


def console_main() -> None:
    """The `llmtap` console script: `llmtap run` without click when it can, everything else through `main`."""
    if sys.argv[1:2] == ["run"]:
        from .run import exit_quickly, run_fast

        code = run_fast(sys.argv[2:])
        if code is not None:
            exit_quickly(code)
    _group()()


def _group() -> click.Group:
    """The click group `main`, built on first use."""
    global _main
    if _main is None:
        _main = _build_group()
        globals()["main"] = _main  # later look-ups no longer go through __getattr__
    return _main


def _build_group() -> click.Group:
    from importlib import import_module

    import click

    from .. import __version__

    class LazyGroup(click.Group):
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

    @click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
    @click.version_option(__version__, prog_name="llmtap")
    def main() -> None:
        """Record every model call an agent or RL rollout makes, as evidence you can trust."""

    return main


def __getattr__(name: str) -> object:
    if name == "main":
        return _group()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
