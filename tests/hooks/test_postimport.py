"""Post-import hooks fire after the watched module executes, once, and can be removed."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from llmtap.hooks.postimport import PostImportFinder, when_imported


@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [name for name in sys.modules if name.startswith("llmtap_probe")]:
        del sys.modules[name]


def test_the_callback_runs_after_the_module_has_executed(module_dir: Path) -> None:
    (module_dir / "llmtap_probe_a.py").write_text("VALUE = 42\n")
    seen: list[int] = []
    undo = when_imported("llmtap_probe_a", lambda module: seen.append(module.VALUE))
    try:
        import llmtap_probe_a  # type: ignore[import-not-found]  # noqa: F401

        assert seen == [42]
    finally:
        undo()


def test_an_already_imported_module_gets_its_callback_at_once(module_dir: Path) -> None:
    (module_dir / "llmtap_probe_b.py").write_text("VALUE = 7\n")
    import llmtap_probe_b  # type: ignore[import-not-found]  # noqa: F401

    seen: list[ModuleType] = []
    undo = when_imported("llmtap_probe_b", seen.append)
    undo()
    assert [module.__name__ for module in seen] == ["llmtap_probe_b"]


def test_removing_the_last_callback_takes_the_finder_off_the_meta_path(module_dir: Path) -> None:
    undo = when_imported("llmtap_probe_c", lambda module: None)
    assert any(isinstance(finder, PostImportFinder) for finder in sys.meta_path)
    undo()
    assert not any(isinstance(finder, PostImportFinder) for finder in sys.meta_path)


def test_a_failing_callback_never_breaks_the_import(module_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    (module_dir / "llmtap_probe_d.py").write_text("VALUE = 1\n")

    def boom(module: ModuleType) -> None:
        raise RuntimeError("hook bug")

    undo = when_imported("llmtap_probe_d", boom)
    try:
        import llmtap_probe_d  # type: ignore[import-not-found]

        assert llmtap_probe_d.VALUE == 1
        assert "post-import hook for llmtap_probe_d failed (RuntimeError)" in caplog.text
    finally:
        undo()
