"""Every recorded exchange, recorded through the hooks and replayed with no upstream: the same status and body.

One capture records every fixture through httpx against the replay upstream; one replay then
asks for each again, in order, with the client pointed at a port nobody listens on. Every body,
stream or JSON, must come back byte for byte as the provider sent it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

import llmtap
from llmtap.replay.live import Replayer, set_replayer
from llmtap.replay.matching import RecordingIndex
from tests.fixtures import all_fixtures
from tests.support.replay import FIXTURE_HEADER

FIXTURES = [recorded for recorded in all_fixtures() if isinstance(recorded.request_json, dict)]
NOWHERE = "http://127.0.0.1:9"


def _post(client: httpx.Client, recorded: Any) -> tuple[int, bytes]:
    headers = {FIXTURE_HEADER: recorded.id}  # picks the upstream's answer; not part of the match key
    with client.stream("POST", recorded.request_path, json=recorded.request_json, headers=headers) as response:
        return response.status_code, response.read()


def test_every_recorded_exchange_replays_with_its_status_and_body(replay_upstream: Any, tmp_path: Path) -> None:
    assert len(FIXTURES) > 20  # every dialect's recordings, streams and errors among them
    recording = tmp_path / "recording"
    with llmtap.capture(capture_dir=recording, durability="call"), httpx.Client(base_url=replay_upstream.base_url) as client:
        live = [_post(client, recorded) for recorded in FIXTURES]
    assert replay_upstream.request_count == len(FIXTURES)
    replayer = Replayer(RecordingIndex.from_path(recording))
    set_replayer(replayer)
    try:
        with llmtap.capture(capture_dir=tmp_path / "replayed", durability="call"), httpx.Client(base_url=NOWHERE) as client:
            replayed = [_post(client, recorded) for recorded in FIXTURES]
    finally:
        set_replayer(None)
    assert replayer.served == len(FIXTURES) and replayer.misses == []
    for recorded, (live_status, live_body), (status, body) in zip(FIXTURES, live, replayed):
        assert status == live_status == recorded.status, recorded.id
        assert body == live_body == recorded.body_text.encode(), recorded.id

