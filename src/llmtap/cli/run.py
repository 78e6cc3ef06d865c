"""`llmtap run -- CMD ...`: run a program with every model call it makes captured into a run capsule.

The click command built by `_command` is the one definition of the options, their help and
their error messages. Its fixed cost counts on every run, though (importing click alone takes
longer than the recorder's whole start-up), so `run_fast` reads the usual, valid forms of the
same arguments without click: `--capsule-dir DIR`, `--registry PATH` (or `--opt=VALUE`), `-q` /
`--quiet`, then the command, after `--` or from its first word. Anything else (help, a value
click would refuse, an option it does not know, no command) is left to the click command.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # click is imported only when the click command is needed
if TYPE_CHECKING:
    from collections.abc import Sequence

    import click

    from ..capsule.runner import RunResult

    run: click.Command

__all__ = ["RunArguments", "execute", "exit_quickly", "parse_fast", "run", "run_fast", "summary_line"]

_VALUE_OPTIONS = ("--capsule-dir", "--registry")
_QUIET_FLAGS = ("-q", "--quiet")


class RunArguments:
    """What `llmtap run` was asked to do."""

    __slots__ = ("capsule_dir", "command", "quiet", "registry_path")

    def __init__(self, command: list[str], *, capsule_dir: str | None = None, registry_path: str | None = None, quiet: bool = False) -> None:
        self.command = command
        self.capsule_dir = capsule_dir
        self.registry_path = registry_path
        self.quiet = quiet

    def __repr__(self) -> str:
        return (
            f"RunArguments({self.command!r}, capsule_dir={self.capsule_dir!r}, "
            f"registry_path={self.registry_path!r}, quiet={self.quiet!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunArguments):
            return NotImplemented
        return (self.command, self.capsule_dir, self.registry_path, self.quiet) == (
            other.command,
            other.capsule_dir,
            other.registry_path,
            other.quiet,
        )

    __hash__ = None  # type: ignore[assignment]


def parse_fast(args: Sequence[str]) -> RunArguments | None:
    """Parse `llmtap run` arguments as the click command would, or return None for anything it should see.

    None means: help, an unknown or malformed option, a path value click would refuse (a capsule
    directory that is a file, a registry that is a directory, an unreadable one), or no command.
    """
    values: dict[str, str] = {}
    quiet = False
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            index += 1
            break
        if not arg.startswith("-") or arg == "-":
            break  # the command's first word: click takes everything from here on as the command
        name, equals, value = arg.partition("=")
        if name in _VALUE_OPTIONS:
            if not equals:
                index += 1
                if index == len(args):
                    return None
                value = args[index]
            if not value or value.startswith("-") or not _path_accepted(value, directory=name == "--capsule-dir"):
                return None
            values[name] = value  # given twice, the last one counts (as in click)
        elif arg in _QUIET_FLAGS:
            quiet = True
        else:
            return None
        index += 1
    command = list(args[index:])
    if not command:
        return None
    return RunArguments(command, capsule_dir=values.get("--capsule-dir"), registry_path=values.get("--registry"), quiet=quiet)


def _path_accepted(value: str, *, directory: bool) -> bool:
    """What `click.Path(file_okay=not directory, dir_okay=directory)` accepts without complaint."""
    try:
        mode = os.stat(value).st_mode
    except OSError:
        return True  # it need not exist
    import stat

    if stat.S_ISREG(mode) if directory else stat.S_ISDIR(mode):
        return False
    return os.access(value, os.R_OK)


def run_fast(args: Sequence[str]) -> int | None:
    """Run `llmtap run ARGS` without click and return the exit code, or None to hand ARGS to click.

    A capture error is reported the way the click command reports it (`Error: ...`, exit 1), and
    so is a Ctrl-C the recorder does not handle itself (before it has taken SIGINT over, or after
    it has given it back): `Aborted!`, exit 1.
    """
    parsed = parse_fast(args)
    if parsed is None:
        return None
    try:
        return execute(parsed.command, capsule_dir=parsed.capsule_dir, registry_path=parsed.registry_path, quiet=parsed.quiet)
    except KeyboardInterrupt:
        sys.stderr.write("\nAborted!\n")
        return 1
    except Exception as exc:
        from ..errors import LlmtapError

        if not isinstance(exc, LlmtapError):
            raise
        import click

        click.ClickException(str(exc)).show()
        return 1


def execute(
    command: Sequence[str],
    *,
    capsule_dir: str | os.PathLike[str] | None,
    registry_path: str | os.PathLike[str] | None,
    quiet: bool,
) -> int:
    """Run `command` under capture, print the one-line summary unless `quiet`, return its exit code.

    Raises LlmtapError (before anything has run) for a bad URL registry.
    """
    from ..capsule.runner import run_captured

    result = run_captured(list(command), runs_dir=capsule_dir, registry_path=registry_path)
    if not quiet:
        sys.stderr.write(summary_line(result) + "\n")
        sys.stderr.flush()
    return result.exit_code


def summary_line(result: RunResult) -> str:
    """`llmtap: run <id> <status> (exit <code>), <n> model call(s) -> <capsule>`."""
    counts = result.manifest.get("counts", {})
    dropped = counts.get("records_dropped", 0)
    note = f", {dropped} record(s) dropped (see capture-health.json)" if dropped else ""
    if not note and not (result.manifest.get("capture_health") or {}).get("ok", True):
        note = ", capture health not ok (see capture-health.json)"
    return (
        f"llmtap: run {result.capsule.name} {result.status} (exit {result.exit_code}), "
        f"{counts.get('model_calls', 0)} model call(s){note} -> {result.capsule}"
    )


def _command() -> click.Command:
    """The `run` click command: the definition of the options, their help and their errors."""
    from pathlib import Path

    import click

    from ..errors import LlmtapError
    from .options import capsule_dir_option

    @click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
    @capsule_dir_option("Directory the run capsule is created in (default: $LLMTAP_RUNS_DIR or .llmtap/runs).")
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
        try:
            code = execute(command, capsule_dir=capsule_dir, registry_path=registry_path, quiet=quiet)
        except LlmtapError as exc:
            raise click.ClickException(str(exc)) from None
        sys.exit(code)

    return run


def __getattr__(name: str) -> object:
    if name == "run":
        command = _command()
        globals()["run"] = command
        return command
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def exit_quickly(code: int) -> None:
    """Exit with `code` once `llmtap run` is done, without a garbage-collector pass over everything imported.

    The capsule is complete; what is left is interpreter teardown, whose collections over the
    recorder's modules would add milliseconds to every run (docs/benchmarks.md). Frozen objects are skipped by them;
    the rest of a normal exit (atexit handlers, thread joins, flushing) still happens.
    """
    import gc

    gc.freeze()
    sys.exit(code)


def main() -> None:
    """`python -m llmtap.cli.run ARGS`: the fast path when it applies, else the click command."""
    code = run_fast(sys.argv[1:])
    if code is None:
        _command()()  # exits
    else:
        exit_quickly(code)


if __name__ == "__main__":
    main()
