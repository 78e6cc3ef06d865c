"""Shared fixtures: the real local model, the replay and fault upstreams, an isolated home.

The servers' modules are imported inside their fixtures, so a run without the venv's extras
(httpx, starlette, uvicorn) can still collect and run every test that does not need them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from llmtap.demo.localmodel import LocalModelServer
    from tests.support.faults import FaultUpstream
    from tests.support.replay import ReplayUpstream


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the real local model as slow, whether or not it says so."""
    for item in items:
        if "local_model" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def isolated_llmtap_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point llmtap's home and capture directory at a fresh temp dir, so no test touches user data."""
    home = tmp_path_factory.mktemp("llmtap-home")
    monkeypatch.setenv("LLMTAP_HOME", str(home))
    monkeypatch.setenv("LLMTAP_CAPTURE_DIR", str(home / "model-calls"))
    return home


@pytest.fixture(scope="session")
def local_model() -> Iterator[LocalModelServer]:
    """Gemma 3 270M behind llama.cpp's OpenAI-compatible server, started once per run."""
    from llmtap.demo.localmodel import LocalModelServer

    with LocalModelServer() as server:
        yield server


@pytest.fixture(scope="session")
def _replay_server() -> Iterator[ReplayUpstream]:
    from tests.support.replay import ReplayUpstream

    with ReplayUpstream().start() as upstream:
        yield upstream


@pytest.fixture
def replay_upstream(_replay_server: ReplayUpstream) -> ReplayUpstream:
    """The replay upstream shared by the run, with its request log emptied for this test."""
    _replay_server.reset()
    return _replay_server


@pytest.fixture(scope="session")
def _fault_server() -> Iterator[FaultUpstream]:
    from tests.support.faults import FaultUpstream

    with FaultUpstream().start() as upstream:
        yield upstream


@pytest.fixture
def fault_upstream(_fault_server: FaultUpstream) -> FaultUpstream:
    """The fault upstream shared by the run, with its request log emptied for this test."""
    _fault_server.reset()
    return _fault_server
