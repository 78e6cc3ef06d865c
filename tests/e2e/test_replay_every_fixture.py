"""Every recorded exchange, recorded under `llmtap run` and replayed with `llmtap replay` and the upstream gone: the same bytes.

A program posts every recorded fixture (httpx and requests in turn) to the replay upstream and
prints each answer's status and SHA-256. Recorded under `llmtap run`, it is replayed from its
capsule with the upstream stopped: the program's output must be identical (so every status and
every body byte is), the report must say every call was served byte for byte (nothing
`reencoded`), and the network guard must have refused nothing, since nothing tried to connect.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.fixtures import all_fixtures
from tests.support.replay import FIXTURE_HEADER, ReplayUpstream

FIXTURES = [recorded for recorded in all_fixtures() if isinstance(recorded.request_json, dict)]

WORKLOAD = f"""
import hashlib, json, os, sys
import httpx, requests

calls = json.loads(open(sys.argv[1]).read())
base = os.environ["REPLAY_BASE"]
said = []
with httpx.Client(base_url=base, timeout=30) as client:
    for number, (name, path, body) in enumerate(calls):
        headers = {{"{FIXTURE_HEADER}": name}}
        if number % 2:
            answer = requests.post(base + path, json=body, headers=headers, timeout=30)
            said.append([name, answer.status_code, hashlib.sha256(answer.content).hexdigest()])
        else:
            with client.stream("POST", path, json=body, headers=headers) as answer:
                said.append([name, answer.status_code, hashlib.sha256(answer.read()).hexdigest()])
print(json.dumps(said))
"""


def _llmtap(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmtap", *args], check=False, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def _capsule(directory: Path) -> Path:
    [capsule] = [path for path in directory.iterdir() if (path / "capsule.json").exists()]
    return capsule


def test_every_recorded_exchange_replays_byte_for_byte_under_llmtap_replay(tmp_path: Path) -> None:
    assert len(FIXTURES) > 60  # every dialect's recordings, JSON, streams and errors
    script, calls = tmp_path / "workload.py", tmp_path / "calls.json"
    script.write_text(WORKLOAD)
    calls.write_text(json.dumps([[recorded.id, recorded.request_path, recorded.request_json] for recorded in FIXTURES]))
    with ReplayUpstream().start() as upstream:
        env = dict(os.environ, REPLAY_BASE=upstream.base_url)
        recorded = _llmtap(["run", "--capsule-dir", str(tmp_path / "recorded"), "--", sys.executable, str(script), str(calls)], env, tmp_path)
        assert recorded.returncode == 0, recorded.stderr
        assert upstream.request_count == len(FIXTURES)
    said = json.loads(recorded.stdout.splitlines()[0])
    for recorded_exchange, (name, status, digest) in zip(FIXTURES, said):  # what the program got is what was recorded
        assert (name, status, digest) == (recorded_exchange.id, recorded_exchange.status, hashlib.sha256(recorded_exchange.body_bytes).hexdigest())

    replayed = _llmtap(
        ["replay", str(_capsule(tmp_path / "recorded")), "--capsule-dir", str(tmp_path / "replayed"), "--json", "--",
         sys.executable, str(script), str(calls)],
        env,
        tmp_path,
    )
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout.splitlines()[0] == recorded.stdout.splitlines()[0]
    report = json.loads(replayed.stdout[replayed.stdout.index("\n{") + 1 :])
    assert report["ok"] is True and report["served"] == len(FIXTURES)
    assert report["misses"] == [] and report["network_refused"] == [] and report["reencoded"] == []
