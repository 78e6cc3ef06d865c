"""Every hooked HTTP library runs through the shared suite (`tests/hooks/suite.py`), whole and streamed."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
from collections.abc import Iterable
from typing import Any

import tests.hooks
from llmtap.hooks.install import HOOKED_LIBRARIES
from tests.hooks.suite import HookSuite

# Hooked modules that make no HTTP calls of their own, so the HTTP suite does not apply to them.
NOT_HTTP_LIBRARIES = {
    "mcp.client.session": "records MCP tool calls, not HTTP requests; tested in tests/mcp",
    "socket": "watches connections for traffic no hook recorded; it records no call itself",
}


def suite_styles() -> list[type[HookSuite]]:
    """Every concrete suite class (`Test...`) defined in the test modules of tests/hooks."""
    for module in pkgutil.iter_modules(tests.hooks.__path__):
        if module.name.startswith("test_"):
            importlib.import_module(f"tests.hooks.{module.name}")
    found: list[type[HookSuite]] = []
    pending: list[type[Any]] = [HookSuite]
    while pending:
        for subclass in pending.pop().__subclasses__():
            pending.append(subclass)
            if subclass.__name__.startswith("Test") and not inspect.isabstract(subclass):
                found.append(subclass)
    return found


def missing_styles(libraries: Iterable[str], styles: Iterable[type[HookSuite]]) -> list[str]:
    """One line per library without a whole-body style or without a streamed style."""
    styles = list(styles)
    missing = []
    for library in sorted(libraries):
        kinds = {style.streamed for style in styles if style.library == library}
        if False not in kinds:
            missing.append(f"{library!r} has no whole-body style (a HookSuite subclass)")
        if True not in kinds:
            missing.append(f"{library!r} has no streamed style (a StreamedHookSuite subclass)")
    return missing


def test_every_hooked_http_library_has_a_whole_and_a_streamed_style() -> None:
    http_libraries = set(HOOKED_LIBRARIES) - set(NOT_HTTP_LIBRARIES)
    missing = missing_styles(http_libraries, suite_styles())
    assert not missing, (
        "The shared hook suite does not cover every hooked library: "
        + "; ".join(missing)
        + ". Add the classes to tests/hooks/test_<library>.py (see tests/hooks/suite.py)."
    )


def skipped_here(style: type[HookSuite]) -> bool:
    """True when the style's module skips itself in this tree (a hook that lands in another branch)."""
    marks = getattr(sys.modules[style.__module__], "pytestmark", [])
    marks = marks if isinstance(marks, list) else [marks]
    return any(mark.name == "skipif" and mark.args and mark.args[0] is True for mark in marks)


def test_every_style_drives_a_hooked_library() -> None:
    unknown = sorted({style.library for style in suite_styles() if not skipped_here(style)} - set(HOOKED_LIBRARIES))
    assert unknown == []


def test_the_check_names_the_library_that_has_no_style() -> None:
    styles = [style for style in suite_styles() if style.library != "urllib3"]
    assert missing_styles(["httpx", "urllib3"], styles) == [
        "'urllib3' has no whole-body style (a HookSuite subclass)",
        "'urllib3' has no streamed style (a StreamedHookSuite subclass)",
    ]
    only_whole = [style for style in suite_styles() if style.library == "aiohttp" and not style.streamed]
    assert missing_styles(["aiohttp"], only_whole) == ["'aiohttp' has no streamed style (a StreamedHookSuite subclass)"]
