"""Spotting a command whose Python will not load the capture hooks: `python -I`, `-E` or `-S`.

`llmtap run` captures through a `sitecustomize` on PYTHONPATH. `-I` (isolated) and `-E` ignore
PYTHONPATH, and `-S` skips `site`, which is what imports `sitecustomize`: such a process makes its
model calls uncaptured, and the capsule would silently hold nothing. This looks at the command
line and, for a script, at its `#!` line, before the command starts (only `os`, no reads beyond
the first line of one file). A Python started later with those flags by the workload itself is
not seen here.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # `llmtap run` calls this before its command starts: no typing at run time
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

__all__ = ["uncaptured_python"]

_FLAG_REASONS = {
    "I": "-I (isolated mode) ignores PYTHONPATH",
    "E": "-E ignores PYTHONPATH",
    "S": "-S skips the site module that loads sitecustomize",
}
_SHEBANG_LIMIT = 256


def _is_python(program: str) -> bool:
    """`python`, `python3`, `python3.12`, `pypy3` and the like, by the program's file name."""
    name = os.path.basename(program)
    for stem in ("python", "pypy"):
        if name.startswith(stem):
            rest = name[len(stem) :]
            return not rest or all(part.isdigit() for part in rest.split("."))
    return False


def _blocking_flag(arguments: Sequence[str]) -> str | None:
    """The first interpreter option among `arguments` that keeps sitecustomize from loading."""
    takes_value = False
    for argument in arguments:
        if takes_value:  # the value of `-W` or `-X` given as its own argument
            takes_value = False
            continue
        if argument == "--" or not argument.startswith("-") or argument == "-":
            return None  # the script (or stdin): the options have ended
        if argument.startswith("--"):
            if argument in ("--check-hash-based-pycs",):
                takes_value = True
            continue  # other long options (--version, --help) change nothing here
        letters = argument[1:]
        for index, letter in enumerate(letters):
            if letter in _FLAG_REASONS:
                return letter
            if letter in "cm":
                return None  # `-c code` and `-m module` end the options
            if letter in "WX":
                takes_value = index == len(letters) - 1  # else the rest of this argument is the value
                break
    return None


def _shebang(program: str, env: Mapping[str, str]) -> list[str] | None:
    """The words of the `#!` line of `program` (found on PATH like the shell would), if it has one."""
    candidates = [program] if os.path.dirname(program) else [os.path.join(entry, program) for entry in os.get_exec_path(dict(env))]
    for candidate in candidates:
        try:
            fd = os.open(candidate, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            head = os.read(fd, _SHEBANG_LIMIT)
        except OSError:
            return None
        finally:
            os.close(fd)
        if not head.startswith(b"#!"):
            return None
        return head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    return None


def uncaptured_python(command: Sequence[str], env: Mapping[str, str]) -> dict[str, Any] | None:
    """Describe why `command` would run Python without the capture hooks, or None if it would not."""
    if not command:
        return None
    words = list(command)
    if not _is_python(words[0]):
        shebang = _shebang(words[0], env)
        if not shebang:
            return None
        if os.path.basename(shebang[0]) == "env":  # `#!/usr/bin/env python3 -I` (or `env -S "python3 -I"`)
            shebang = [word for word in shebang[1:] if word != "-S"]
        if not shebang or not _is_python(shebang[0]):
            return None
        words = shebang + words
    flag = _blocking_flag(words[1:])
    if flag is None:
        return None
    return {
        "command": words[0],
        "flag": f"-{flag}",
        "reason": f"{_FLAG_REASONS[flag]}, so its model calls are not captured",
    }
