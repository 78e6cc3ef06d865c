"""Shared material for the evidence tests: one real capsule from `llmtap run`, and a signing key pair.

The capsule comes from a real run: a small program using the openai SDK (one plain and one
streamed chat completion) under `llmtap run`, against the replay upstream serving recorded
exchanges. It is made once per test session; tests that change it work on a copy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.fixtures import fixture

if TYPE_CHECKING:
    from llmtap.trust.keys import KeyPair
    from tests.support.replay import ReplayUpstream

WORKLOAD = """
import json, os, openai
requests = json.loads(os.environ["REPLAY_REQUESTS"])
with openai.OpenAI(base_url=os.environ["REPLAY_BASE"] + "/v1", api_key="sk-test", max_retries=0) as client:
    print(client.chat.completions.create(**requests["plain"]).choices[0].message.content)
    stream = client.chat.completions.create(**requests["stream"])
    print("".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices))
"""
CALLS = 2


@pytest.fixture(scope="session")
def pristine_capsule(_replay_server: ReplayUpstream, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished capsule from a real `llmtap run` of the openai SDK; never change it, copy it (`capsule`)."""
    work = tmp_path_factory.mktemp("evidence-run")
    (work / "workload.py").write_text(WORKLOAD)
    requests = {
        "plain": fixture("chat/text-basic-gpt4o").request_json,
        "stream": fixture("chat/text-stream-include-usage-gpt4").request_json,
    }
    env = dict(os.environ, REPLAY_BASE=_replay_server.base_url, REPLAY_REQUESTS=json.dumps(requests))
    command = [
        sys.executable,
        "-m",
        "llmtap.cli.run",
        "--capsule-dir",
        str(work / "runs"),
        "--",
        sys.executable,
        "workload.py",
    ]
    done = subprocess.run(command, env=env, cwd=work, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    [capsule] = [path for path in (work / "runs").iterdir() if (path / "capsule.json").exists()]
    manifest = json.loads((capsule / "capsule.json").read_text())
    assert manifest["status"] == "success" and manifest["counts"]["model_calls"] == CALLS
    return capsule


@pytest.fixture
def capsule(pristine_capsule: Path, tmp_path: Path) -> Path:
    """A copy of the real capsule this test may change (links copied as links, never followed)."""
    copy = tmp_path / "runs" / pristine_capsule.name
    shutil.copytree(pristine_capsule, copy, symlinks=True)
    return copy


@pytest.fixture(scope="session")
def key_pair(tmp_path_factory: pytest.TempPathFactory) -> KeyPair:
    """An ed25519 key pair made by `generate_key_pair`, shared by the session."""
    from llmtap.trust.keys import generate_key_pair

    return generate_key_pair(tmp_path_factory.mktemp("keys"), name="signer")


@pytest.fixture(scope="session")
def good_bundle(pristine_capsule: Path, key_pair: KeyPair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The real capsule exported once with `key_pair`; tests read it, or copy it to change it."""
    from llmtap.trust.evidence import export_evidence
    from llmtap.trust.keys import load_private_key

    bundle = tmp_path_factory.mktemp("bundle") / "bundle.zip"
    export_evidence(pristine_capsule, bundle, load_private_key(key_pair.private_path))
    yield bundle
    shutil.rmtree(bundle.parent, ignore_errors=True)
