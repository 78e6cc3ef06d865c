"""A capture session bound to the test's context, with the vendored registry and hooks installed."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmtap.hooks.install import acquire_hooks, release_hooks
from llmtap.hooks.registry import load_registry, vendored_registry_path
from llmtap.hooks.session import CaptureSession, reset_session, use_session

pytest.register_assert_rewrite("tests.hooks.suite")  # the shared suite's failures show their values too


def session_in_use(session: CaptureSession) -> Iterator[CaptureSession]:
    """Make `session` the test's capture with the hooks installed; undo both and close it after."""
    token = use_session(session)
    acquire_hooks()
    try:
        yield session
    finally:
        reset_session(token)
        release_hooks()
        session.close()


@pytest.fixture
def capture_session(tmp_path: Path) -> Iterator[CaptureSession]:
    """Capture into tmp_path/calls for the test; hooks removed and the session closed afterwards."""
    yield from session_in_use(
        CaptureSession(
            tmp_path / "calls", registry=load_registry(vendored_registry_path()), health_path=tmp_path / "health.json"
        )
    )


def fork_and_post(url: str, body: Any) -> int:
    """POST `body` to `url` from a forked child that ends with os._exit; return the child's pid once it exited 0."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            with httpx.Client() as client:
                code = 0 if client.post(url, json=body).status_code == 200 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return pid


def recorded_lines(session: CaptureSession, rollout_id: str = "default") -> list[dict[str, Any]]:
    """Every record the session wrote for `rollout_id`, after waiting for queued ones."""
    session.flush()
    return [line for _, line in session.store.read(rollout_id).entries]
