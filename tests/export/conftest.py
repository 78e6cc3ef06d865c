"""A capture directory of every recorded fixture, built once per test session and read only."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.export.support import build_fixture_store


@pytest.fixture(scope="session")
def fixture_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[str]]]:
    """(capture directory, rollout id -> call ids) holding every recorded fixture once."""
    root = tmp_path_factory.mktemp("fixture-store") / "model-calls"
    return root, build_fixture_store(root)
