"""`llmtap serve --capsule`: proxied calls without a rollout prefix land in the capsule's default rollout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai

from llmtap.capsule.finalise import CaptureOutcome, finalise_capsule
from llmtap.capsule.manifest import start_manifest
from llmtap.capsule.writer import create_capsule
from llmtap.server.capsule_mode import DefaultRolloutPrefix
from llmtap.server.config import load_serve_config
from llmtap.server.proxy import build_app
from llmtap.store import CaptureStore
from tests.fixtures import fixture
from tests.support.servers import ServerThread


def test_proxied_calls_are_captured_into_the_capsule_with_or_without_a_prefix(replay_upstream: Any, tmp_path: Path) -> None:
    paths = create_capsule(tmp_path / "runs", with_outputs=False)
    manifest = start_manifest(paths, capture_mode="serve", command=["llmtap", "serve"], cwd=str(tmp_path), started_at=0.0, registry_source=None)
    config = load_serve_config(settings={"upstreams": {"default": {"base_url": replay_upstream.base_url}}})
    store = CaptureStore(paths.calls)
    # lifespan on: the proxy closes its upstream connection pool at shutdown
    server = ServerThread(DefaultRolloutPrefix(build_app(config, store=store)), lifespan="on").start()
    request = fixture("chat/text-basic-gpt4o").request_json
    try:
        with openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0) as client:
            client.chat.completions.create(**request)
        with openai.OpenAI(base_url=server.base_url + "/ng-rollout/7-0/v1", api_key="x", max_retries=0) as client:
            client.chat.completions.create(**request)
    finally:
        server.stop()
        store.close()
    final = finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0))
    assert final["rollouts"].keys() == {"default", "7-0"}
    assert final["counts"]["model_calls"] == 2
    calls = [json.loads(line) for line in paths.model_calls.read_text().splitlines()]
    assert {call["attributes"]["gen_ai.provider.name"] for call in calls} == {"openai"}
    assert all(call["attributes"]["gen_ai.usage.input_tokens"] == 20 for call in calls)


def test_serve_into_capsule_finalises_the_capsule_when_the_server_is_stopped(replay_upstream: Any, tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    from tests.support.servers import free_port, wait_for_http

    port = free_port()
    code = (
        "import sys; from pathlib import Path; from llmtap.server.config import load_serve_config; "
        "from llmtap.server.capsule_mode import serve_into_capsule; "
        "config = load_serve_config(settings={'upstreams': {'default': {'base_url': sys.argv[1]}}, 'port': int(sys.argv[2])}); "
        "serve_into_capsule(config, runs_dir=Path(sys.argv[3]))"
    )
    command = [sys.executable, "-c", code, replay_upstream.base_url, str(port), str(tmp_path / "runs")]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        wait_for_http(f"http://127.0.0.1:{port}/v1/models", timeout=30)
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0) as client:
            client.chat.completions.create(**fixture("chat/text-basic-gpt4o").request_json)
    finally:
        server.send_signal(signal.SIGINT)
        _, stderr = server.communicate(timeout=30)
    assert "capturing into run capsule" in stderr
    [capsule] = list((tmp_path / "runs").iterdir())
    manifest = json.loads((capsule / "capsule.json").read_text())
    assert manifest["status"] == "success" and manifest["capture_mode"] == "serve"
    assert manifest["counts"]["model_calls"] == 1
