"""The pytest plugin: model calls of a test answered from a cassette (a capsule), recorded when asked.

Registered by the `pytest11` entry point, so installing llmtap is enough. It is inert: it adds
an option and a marker, and does nothing for a test that neither uses the `llmtap_cassette`
fixture nor carries `@pytest.mark.llmtap`.

A test's cassette is a run capsule under `tests/cassettes/<module>/<test>/` (the directory is
the `llmtap_cassette_dir` ini value, relative to the root directory). `--llmtap-record-mode`
(or `@pytest.mark.llmtap(record_mode=...)`) says what happens to it:

- `none` (the default): replay only. The cassette must exist; every model call is answered from
  it, the network guard refuses the model APIs, and a call it does not hold fails the test with
  the miss (the closest recorded call and the differing fields).
- `once`: replay as `none` when the cassette exists; record it (live calls) when it does not.
- `new_episodes`: replay what the cassette holds, send the other calls live; the cassette
  becomes this run's calls (the replayed ones and the new ones) when the test passes.
- `all`: every call live; the cassette is replaced by this run's calls when the test passes
  (a failing test keeps the old one).
- `rewrite`: the cassette is deleted first, then recorded as in `all`.

What a cassette holds is what capture writes: credential headers never, payload secrets
redacted by the capsule's finalisation. A cassette is read as JSON lines only (it is input a
pull request can change), through the same bounded reader as every recording.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

__all__ = ["RECORD_MODES", "Cassette"]

RECORD_MODES = ("none", "once", "new_episodes", "all", "rewrite")
_DEFAULT_DIR = "tests/cassettes"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_CASSETTE_KEY = pytest.StashKey["Cassette"]()
_PASSED_KEY = pytest.StashKey[bool]()


@dataclass
class Cassette:
    """One test's cassette: where it lives, the mode it runs in, and what the replay saw."""

    path: Path
    mode: str
    replaying: bool
    recording: bool
    replayer: Any = None
    misses: list[Any] = field(default_factory=list)
    written: bool = False

    @property
    def exists(self) -> bool:
        return (self.path / "capsule.json").is_file()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmtap", "llmtap cassettes (model calls answered from run capsules)")
    group.addoption(
        "--llmtap-record-mode",
        action="store",
        default=None,
        choices=RECORD_MODES,
        help="none (default): replay only; once: record missing cassettes; new_episodes: record calls a "
        "cassette lacks; all: record every call; rewrite: delete and record.",
    )
    parser.addini("llmtap_cassette_dir", "Where llmtap cassettes live, relative to the root directory.", default=_DEFAULT_DIR)
    parser.addini("llmtap_record_mode", "The default --llmtap-record-mode.", default="none")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "llmtap(record_mode=None, cassette=None): answer the test's model calls from its llmtap cassette."
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A marked test gets the fixture; no other test is touched.
    for item in items:
        if item.get_closest_marker("llmtap") is not None and "llmtap_cassette" not in getattr(item, "fixturenames", ()):
            item.fixturenames.append("llmtap_cassette")  # type: ignore[attr-defined]


def _safe(name: str) -> str:
    cleaned = _UNSAFE.sub("_", name).strip("._")
    return cleaned[:120] or "test"


def cassette_path(config: pytest.Config, item: pytest.Item, name: str | None) -> Path:
    """`<cassette dir>/<module>/<test>/`; every part made a plain name, so a test id cannot climb out."""
    base = Path(str(config.getini("llmtap_cassette_dir")) or _DEFAULT_DIR)
    if not base.is_absolute():
        base = config.rootpath / base
    module = getattr(item, "module", None)
    module_name = module.__name__.rsplit(".", 1)[-1] if module is not None else item.path.stem
    return base / _safe(module_name) / _safe(name or item.name)


def _mode(config: pytest.Config, marker: pytest.Mark | None) -> str:
    chosen = marker.kwargs.get("record_mode") if marker is not None else None
    chosen = chosen or config.getoption("--llmtap-record-mode") or str(config.getini("llmtap_record_mode")) or "none"
    if chosen not in RECORD_MODES:
        raise pytest.UsageError(f"llmtap record mode {chosen!r} is not one of {', '.join(RECORD_MODES)}.")
    return str(chosen)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A test that passed although a model call missed (its code caught the error) still fails, with the miss."""
    result = yield
    cassette = item.stash.get(_CASSETTE_KEY, None)
    if cassette is not None and cassette.replayer is not None and cassette.mode in ("none", "once"):
        misses = list(cassette.replayer.misses)
        if misses:
            pytest.fail(
                f"llmtap cassette {cassette.path}: {len(misses)} model call(s) are not in the cassette.\n"
                + "\n".join(miss.describe() for miss in misses),
                pytrace=False,
            )
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Note whether the test body passed: a recording mode keeps a cassette only from a passing test."""
    report = yield
    if report.when == "call":
        item.stash[_PASSED_KEY] = report.passed
    return report


@pytest.fixture
def llmtap_cassette(request: pytest.FixtureRequest) -> Iterator[Cassette]:
    """Answer this test's model calls from its cassette, or record them (see the module's record modes)."""
    from ..capture import capture
    from .guard import uninstall_guard
    from .live import Replayer, set_replayer
    from .matching import RecordingIndex

    marker = request.node.get_closest_marker("llmtap")
    mode = _mode(request.config, marker)
    path = cassette_path(request.config, request.node, marker.kwargs.get("cassette") if marker is not None else None)
    if mode == "rewrite" and path.exists():
        shutil.rmtree(path)
    exists = (path / "capsule.json").is_file()
    if mode == "none" and not exists:
        pytest.fail(
            f"llmtap cassette {path} does not exist and the record mode is 'none'; "
            "run once with --llmtap-record-mode=once to record it.",
            pytrace=False,
        )
    replaying = exists and mode in ("none", "once", "new_episodes")
    recording = mode in ("new_episodes", "all", "rewrite") or (mode == "once" and not exists)
    cassette = Cassette(path, mode, replaying, recording)
    request.node.stash[_CASSETTE_KEY] = cassette
    scratch = Path(tempfile.mkdtemp(prefix="llmtap-cassette-"))
    if replaying:
        cassette.replayer = Replayer(
            RecordingIndex.from_path(path), on_miss="passthrough" if mode == "new_episodes" else "error"
        )
        set_replayer(cassette.replayer)
        if mode != "new_episodes":
            cassette.replayer.install_guard()
    try:
        with capture(runs_dir=scratch, durability="call") as run:
            yield cassette
    finally:
        set_replayer(None)
        uninstall_guard()
        try:
            if cassette.replayer is not None:
                cassette.misses = list(cassette.replayer.misses)
            passed = request.node.stash.get(_PASSED_KEY, False)
            if recording and passed and run.capsule_dir is not None:
                _store(run.capsule_dir, path)
                cassette.written = True
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def _store(capsule: Path, path: Path) -> None:
    """Put a finalised capsule in the cassette's place (the old one goes only once the new one is there)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.parent / f".{path.name}.new"
    if staged.exists():
        shutil.rmtree(staged)
    shutil.copytree(capsule, staged, symlinks=True)
    old = path.parent / f".{path.name}.old"
    if path.exists():
        os.replace(path, old)
    os.replace(staged, path)
    if old.exists():
        shutil.rmtree(old)
