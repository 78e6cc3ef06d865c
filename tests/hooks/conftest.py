"""A capture session bound to the test's context, with the vendored registry and hooks installed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmtap.hooks.install import acquire_hooks, release_hooks
from llmtap.hooks.registry import load_registry, vendored_registry_path
from llmtap.hooks.session import CaptureSession, reset_session, use_session


@pytest.fixture
def capture_session(tmp_path: Path) -> Iterator[CaptureSession]:
    """Capture into tmp_path/calls for the test; hooks removed and the session closed afterwards."""
    session = CaptureSession(
        tmp_path / "calls", registry=load_registry(vendored_registry_path()), health_path=tmp_path / "health.json"
    )
    token = use_session(session)
    acquire_hooks()
    try:
        yield session
    finally:
        reset_session(token)
        release_hooks()
        session.close()


def recorded_lines(session: CaptureSession, rollout_id: str = "default") -> list[dict[str, Any]]:
    """Every record the session wrote for `rollout_id`, after waiting for queued ones."""
    session.flush()
    return [line for _, line in session.store.read(rollout_id).entries]
