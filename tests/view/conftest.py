"""Fixtures for the viewer's tests: a capture store from the recorded fixtures, and the app over it."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from llmtap.view import ViewerSettings, create_app, discover
from tests.view.stores import build_store

PORT = 8765


@pytest.fixture
def capture_dir(tmp_path: Path) -> tuple[Path, dict[str, list[str]]]:
    """A capture directory of the test rollouts, and each rollout's call outcomes in time order."""
    root = tmp_path / "calls"
    return root, build_store(root)


def client_for(paths: list[Path], *, port: int = PORT) -> TestClient:
    """A client of the viewer over `paths`, addressed as the viewer's own origin."""
    app = create_app(discover([str(path) for path in paths]), ViewerSettings(port=port, background=False))
    return TestClient(app, base_url=f"http://127.0.0.1:{port}")


@pytest.fixture
def client(capture_dir: tuple[Path, dict[str, list[str]]]) -> TestClient:
    return client_for([capture_dir[0]])
