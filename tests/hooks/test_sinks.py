"""The record sinks: where each kind of capture sends a finished call, and that a failing sink never raises."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmtap.hooks.registry import load_registry, vendored_registry_path
from llmtap.hooks.session import CaptureSession, open_call, reset_session, use_session
from llmtap.spool.frame import KIND_CALL, KIND_HEALTH, decode_call, scan_frames
from llmtap.spool.writer import SpoolWriter
from tests.fixtures import fixture

JSON_FIXTURE = fixture("chat/text-basic-gpt4o")


def _session(tmp_path: Path, mode: str, *, root: Path | None = None, spool: Path | None = None) -> CaptureSession:
    registry = load_registry(vendored_registry_path())
    options: dict[str, Any] = {"registry": registry, "health_path": tmp_path / "health.json"}
    if mode == "spool":
        options["spool"] = SpoolWriter(spool or tmp_path / "spool")
    else:
        options["durability"] = mode
    return CaptureSession(root or tmp_path / "calls", **options)


def _finish_one_call(session: CaptureSession) -> None:
    """One chat call through the session's hook entry points, as a hooked HTTP library makes it."""
    token = use_session(session)
    try:
        body = json.dumps(JSON_FIXTURE.request_json).encode()
        call = open_call("test", "POST", "api.openai.com", 443, "/v1/chat/completions", [], body)
    finally:
        reset_session(token)
    assert call is not None
    call.set_response(200, [("content-type", "application/json"), ("authorization", "Bearer sk-secret")])
    call.add_chunk(JSON_FIXTURE.body_bytes)
    call.finish("eof")


def test_a_call_durability_capture_has_the_record_on_disk_when_the_call_returns(tmp_path: Path) -> None:
    session = _session(tmp_path, "call")
    _finish_one_call(session)
    [(_, line)] = session.store.read("default").entries  # no flush: written before finish returned
    assert line["status_code"] == 200
    assert line["response"] == json.loads(JSON_FIXTURE.body_bytes)
    assert line["http"]["response_headers"] == {"content-type": "application/json"}  # the credential dropped
    session.close()


def test_a_background_capture_has_every_record_on_disk_once_flushed(tmp_path: Path) -> None:
    session = _session(tmp_path, "background")
    for _ in range(3):
        _finish_one_call(session)
    assert session.flush(10.0) is True
    assert len(session.store.read("default").entries) == 3
    assert session.health.snapshot()["records_written"] == 3
    session.close()


def test_a_spooling_capture_writes_one_call_frame_and_no_store(tmp_path: Path) -> None:
    session = _session(tmp_path, "spool")
    _finish_one_call(session)
    assert session.flush() is True
    assert session.spool is not None
    frames = scan_frames(Path(session.spool.path).read_bytes(), final=True).frames
    calls = [frame for frame in frames if frame.kind == KIND_CALL]
    assert len(calls) == 1
    exchange, dialect = decode_call(calls[0])
    match = session.registry.match("api.openai.com", 443, "/v1/chat/completions")
    assert match is not None and dialect == match.dialect  # what the recorder parses it as
    assert exchange.response_body == JSON_FIXTURE.body_bytes
    assert "authorization" not in exchange.response_headers  # the credential never reached the frame
    assert not (tmp_path / "calls").exists()
    session.close()


@pytest.mark.parametrize("mode", ["call", "background", "spool"])
def test_a_sink_that_cannot_write_never_raises_into_the_workload_and_counts_the_loss(tmp_path: Path, mode: str) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the capture's directory should be")
    session = _session(tmp_path, mode, root=blocker / "calls", spool=blocker / "spool")

    _finish_one_call(session)  # must return normally
    session.flush(10.0)

    assert session.health.snapshot()["record_write_failed"] == 1
    assert "records_written" not in session.health.snapshot()
    session.close()


def test_a_spooling_capture_closed_with_a_call_open_reports_it_in_its_spool_file(tmp_path: Path) -> None:
    session = _session(tmp_path, "spool")
    token = use_session(session)
    try:
        call = open_call("test", "POST", "api.openai.com", 443, "/v1/chat/completions", [], b"{}")
    finally:
        reset_session(token)
    assert call is not None
    call.add_chunk(b"{")  # the response has begun; the call never ends

    session.close()

    assert session.spool is not None
    frames = scan_frames(Path(session.spool.path).read_bytes(), final=True).frames
    counts = [frame.meta["counts"] for frame in frames if frame.kind == KIND_HEALTH]
    assert counts == [{"calls_open_at_close": 1, "calls_captured": 1}]


def test_a_background_capture_in_a_forked_child_writes_each_record_before_the_call_returns(tmp_path: Path) -> None:
    session = _session(tmp_path, "background")
    session.after_fork()  # what the at-fork handler does in the child
    assert session.durability == "call"
    _finish_one_call(session)
    assert len(session.store.read("default").entries) == 1  # no flush needed
    session.close()
