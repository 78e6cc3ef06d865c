"""The active capture: binding at open, drops counted, fail-open, durability, rollouts, fork, spooling."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import llmtap.capture as capture_api
from llmtap.hooks.registry import load_registry, vendored_registry_path
from llmtap.hooks.session import CapturedCall, CaptureSession, reset_session, use_session
from llmtap.spool.frame import KIND_CALL, KIND_HEALTH, KIND_PROCESS, Frame, decode_call, scan_frames
from llmtap.spool.writer import SpoolWriter
from tests.fixtures import fixture
from tests.hooks.conftest import fork_and_post, recorded_lines, session_in_use

JSON_FIXTURE = fixture("chat/text-basic-gpt4o")
STREAM_FIXTURE = fixture("chat/text-stream-include-usage-gpt4")


def _session(tmp_path: Path, name: str, **options: Any) -> CaptureSession:
    return CaptureSession(
        tmp_path / name / "calls",
        registry=load_registry(vendored_registry_path()),
        health_path=tmp_path / name / "health.json",
        **options,
    )


def test_a_stream_ending_after_its_capture_closed_is_dropped_and_counted_there(
    capture_session: CaptureSession, replay_upstream: Any, tmp_path: Path
) -> None:
    url = replay_upstream.base_url + "/v1/chat/completions"
    client = httpx.Client()
    response = client.send(client.build_request("POST", url, json=STREAM_FIXTURE.request_json), stream=True)
    capture_session.close()  # the capture that opened the stream ends first
    later = _session(tmp_path, "later")
    token = use_session(later)
    try:
        body = response.read()  # the stream ends while another capture is active
    finally:
        reset_session(token)
        later.close()
        client.close()
    assert body == STREAM_FIXTURE.body_bytes
    assert capture_session.health.snapshot()["stream_record_dropped"] == 1
    assert recorded_lines(capture_session) == []
    assert later.store.read("default").entries == []
    assert json.loads((tmp_path / "health.json").read_text())["counts"]["stream_record_dropped"] == 1


def _failing_builder(call: CapturedCall) -> Any:
    """A line or frame builder that always fails, with a message that must never reach a log."""
    raise ValueError("secret prompt text must never be logged")


def test_a_failing_record_builder_never_changes_the_result_and_is_counted(
    capture_session: CaptureSession, replay_upstream: Any, caplog: pytest.LogCaptureFixture
) -> None:
    capture_session.line_builder = _failing_builder
    url = replay_upstream.base_url + "/v1/chat/completions"
    with httpx.Client() as client:
        results = [client.post(url, json=JSON_FIXTURE.request_json).content for _ in range(3)]
    assert results == [JSON_FIXTURE.body_bytes] * 3
    assert recorded_lines(capture_session) == []
    assert capture_session.health.snapshot()["record_build_failed"] == 3
    assert "record_build_failed" in caplog.text and "ValueError" in caplog.text
    assert "secret prompt" not in caplog.text


def test_a_failing_tee_never_changes_the_stream_and_is_counted(
    capture_session: CaptureSession, replay_upstream: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: Any, data: bytes) -> None:
        raise RuntimeError("tee bug")

    monkeypatch.setattr("llmtap.exchange.Exchange.add_response_chunk", broken)
    url = replay_upstream.base_url + "/v1/chat/completions"
    with httpx.Client() as client:
        with client.stream("POST", url, json=STREAM_FIXTURE.request_json) as response:
            body = b"".join(response.iter_bytes())
    assert body == STREAM_FIXTURE.body_bytes
    assert capture_session.health.snapshot()["hook_failed"] == 1
    assert recorded_lines(capture_session) == []


def test_call_durability_writes_the_record_before_the_call_returns(replay_upstream: Any, tmp_path: Path) -> None:
    session = _session(tmp_path, "durable", durability="call")
    with capture_api.capture(capture_dir=tmp_path / "unused"):  # installs the hooks
        token = use_session(session)
        try:
            with httpx.Client() as client:
                client.post(replay_upstream.base_url + "/v1/chat/completions", json=JSON_FIXTURE.request_json)
            on_disk = (tmp_path / "durable" / "calls" / "default.capture.jsonl").read_bytes()
        finally:
            reset_session(token)
            session.close()
    assert len(on_disk.splitlines()) == 1


def test_rollout_blocks_and_url_prefixes_choose_the_rollout_file(capture_session: CaptureSession, replay_upstream: Any) -> None:
    with httpx.Client() as client:
        with capture_api.rollout("task-7"):
            client.post(replay_upstream.base_url + "/v1/chat/completions", json=JSON_FIXTURE.request_json)
        client.post(replay_upstream.base_url + "/ng-rollout/3-1/v1/chat/completions", json=JSON_FIXTURE.request_json)
        client.post(replay_upstream.base_url + "/v1/chat/completions", json=JSON_FIXTURE.request_json)
    assert [line["rollout_id"] for line in recorded_lines(capture_session, "task-7")] == ["task-7"]
    assert [line["rollout_id"] for line in recorded_lines(capture_session, "3-1")] == ["3-1"]
    assert [line["rollout_id"] for line in recorded_lines(capture_session)] == ["default"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_records_durably_even_when_it_ends_with_os_exit(capture_session: CaptureSession, replay_upstream: Any) -> None:
    url = replay_upstream.base_url + "/v1/chat/completions"
    pid = fork_and_post(url, JSON_FIXTURE.request_json)
    lines = recorded_lines(capture_session)
    assert [line["capture"]["pid"] for line in lines] == [pid]
    assert capture_session.health.snapshot().get("records_written", 0) == 0  # the child counts its own


# --- spooling (what `llmtap run` uses) -----------------------------------------------------------


@pytest.fixture
def spooling_session(tmp_path: Path) -> Iterator[CaptureSession]:
    """A capture that hands each call to a spool file under tmp_path/spool, hooks installed."""
    yield from session_in_use(
        CaptureSession(tmp_path / "calls", registry=load_registry(vendored_registry_path()), spool=SpoolWriter(tmp_path / "spool"))
    )


def _spooled(tmp_path: Path) -> dict[int, list[Frame]]:
    """Every frame written under tmp_path/spool, by the pid in its file's name."""
    return {
        int(path.name.split("-")[0]): scan_frames(path.read_bytes(), final=True).frames
        for path in sorted((tmp_path / "spool").glob("*.spool"))
    }


def test_a_spooling_capture_writes_each_call_to_its_spool_file_before_the_call_returns(
    spooling_session: CaptureSession, replay_upstream: Any, tmp_path: Path
) -> None:
    url = replay_upstream.base_url + "/v1/chat/completions"
    with httpx.Client() as client:
        answer = client.post(url, json=JSON_FIXTURE.request_json, headers={"authorization": "Bearer sk-never-on-disk"})
        spooled = _spooled(tmp_path)  # no flush, no close: the frame is there already
    calls = [frame for frame in spooled[os.getpid()] if frame.kind == KIND_CALL]
    assert len(calls) == 1 and calls[0].response == answer.content == JSON_FIXTURE.body_bytes
    exchange, _ = decode_call(calls[0])
    assert exchange.status_code == 200 and exchange.path == "/v1/chat/completions"
    assert "authorization" not in exchange.request_headers and exchange.request_headers["content-type"] == "application/json"
    assert not (tmp_path / "calls").exists()  # the recorder writes the store, not the workload
    assert b"sk-never-on-disk" not in b"".join(path.read_bytes() for path in (tmp_path / "spool").iterdir())


def test_a_spooling_capture_reports_each_lost_call_in_its_spool_file(
    spooling_session: CaptureSession, replay_upstream: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spooling_session.frame_builder = _failing_builder
    url = replay_upstream.base_url + "/v1/chat/completions"
    with httpx.Client() as client:
        results = [client.post(url, json=JSON_FIXTURE.request_json).content for _ in range(2)]
    assert results == [JSON_FIXTURE.body_bytes] * 2
    frames = _spooled(tmp_path)[os.getpid()]
    assert [frame.kind for frame in frames if frame.kind != KIND_PROCESS] == [KIND_HEALTH, KIND_HEALTH]
    assert all(frame.meta["counts"] == {"record_build_failed": 1, "calls_captured": 1} for frame in frames if frame.kind == KIND_HEALTH)
    assert "record_build_failed" in caplog.text and "secret prompt" not in caplog.text


def test_a_stream_outliving_its_spooling_capture_is_reported_open_then_dropped(
    spooling_session: CaptureSession, replay_upstream: Any, tmp_path: Path
) -> None:
    url = replay_upstream.base_url + "/v1/chat/completions"
    with httpx.Client() as client:
        response = client.send(client.build_request("POST", url, json=STREAM_FIXTURE.request_json), stream=True)
        spooling_session.close()
        body = response.read()
    assert body == STREAM_FIXTURE.body_bytes
    counts = [frame.meta["counts"] for frame in _spooled(tmp_path)[os.getpid()] if frame.kind == KIND_HEALTH]
    assert counts == [{"calls_open_at_close": 1, "calls_captured": 1}, {"stream_record_dropped": 1}]
    assert not any(frame.kind == KIND_CALL for frame in _spooled(tmp_path)[os.getpid()])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_spooling_child_keeps_its_call_in_a_file_of_its_own_even_after_os_exit(
    spooling_session: CaptureSession, replay_upstream: Any, tmp_path: Path
) -> None:
    url = replay_upstream.base_url + "/v1/chat/completions"
    with httpx.Client() as client:
        client.post(url, json=JSON_FIXTURE.request_json)
    pid = fork_and_post(url, JSON_FIXTURE.request_json)
    spooled = _spooled(tmp_path)
    assert {owner: sum(frame.kind == KIND_CALL for frame in frames) for owner, frames in spooled.items()} == {os.getpid(): 1, pid: 1}
    (child_call,) = [frame for frame in spooled[pid] if frame.kind == KIND_CALL]
    assert child_call.meta["extra"]["capture"]["pid"] == pid
