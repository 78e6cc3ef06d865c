"""Options that several commands share, defined once so their name, type and meaning never drift apart.

Each is a function returning a click decorator: the help text can say what the directory is for in
that command, while the flag, its type and its parameter name stay the same everywhere.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

__all__ = ["capsule_dir_option", "capture_dir_option", "capture_dir_or_argument", "json_option"]

F = TypeVar("F", bound=Callable[..., Any])

_RUNS_DIR_DEFAULT = "(default: $LLMTAP_RUNS_DIR or .llmtap/runs)"


def capture_dir_option(help: str, *, required: bool = False, must_exist: bool = False) -> Callable[[F], F]:
    """`--capture-dir DIR`: a capture directory (`<rollout_id>.capture.jsonl` files), passed as `capture_dir`."""
    return click.option(
        "--capture-dir",
        "capture_dir",
        required=required,
        type=click.Path(exists=must_exist, file_okay=False, path_type=Path),
        help=help,
    )


def capsule_dir_option(help: str = f"Directory holding the run capsules {_RUNS_DIR_DEFAULT}.") -> Callable[[F], F]:
    """`--capsule-dir DIR`: where run capsules are (or go), passed as `capsule_dir`."""
    return click.option("--capsule-dir", "capsule_dir", type=click.Path(file_okay=False, path_type=Path), help=help)


def json_option(help: str = "Print JSON instead of text.") -> Callable[[F], F]:
    """`--json`: machine-readable output, passed as `as_json`."""
    return click.option("--json", "as_json", is_flag=True, help=help)


def capture_dir_or_argument(*after: str, help: str = "The capture directory to read.") -> Callable[[F], F]:
    """`--capture-dir DIR` like every other command, or DIR as the first argument (as `records` always took it).

    `after` names the required arguments that follow DIR (`"rollout_id"`); declare them here, not
    with `click.argument`, so that `show --capture-dir DIR R1` and `show DIR R1` both mean the same.
    The command receives `capture_dir` (an existing directory) and each of `after` by name.
    """
    directory = click.Path(exists=True, file_okay=False, path_type=Path)
    names = " ".join(name.upper() for name in after)

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def run(*args: Any, capture_dir: Path | None, capture_dir_positionals: tuple[str, ...], **kwargs: Any) -> Any:
            values = list(capture_dir_positionals)
            ctx = click.get_current_context()
            if capture_dir is None:
                if len(values) != len(after) + 1:
                    raise click.UsageError(f"Expected --capture-dir DIR (or DIR) {names}".rstrip() + ".")
                capture_dir = directory.convert(values.pop(0), None, ctx)
            elif len(values) != len(after):
                raise click.UsageError(
                    f"Expected {names or 'no argument'} after --capture-dir DIR; give the directory once."
                )
            kwargs.update(zip(after, values))
            return command(*args, capture_dir=capture_dir, **kwargs)

        metavar = f"[DIR] {names}".rstrip()
        decorated = click.argument("capture_dir_positionals", nargs=-1, metavar=metavar)(run)
        return click.option("--capture-dir", "capture_dir", type=directory, help=help)(decorated)  # type: ignore[return-value]

    return decorate
