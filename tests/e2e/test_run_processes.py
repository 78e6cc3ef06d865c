"""`llmtap run` over a program with its own sitecustomize, a subprocess and multiprocessing pools,
which exits non-zero: every call captured, its sitecustomize still ran, its exit code returned."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from tests.e2e.test_run_sdks import llmtap_run, only_capsule
from tests.fixtures import fixture

USER_SITECUSTOMIZE = '''
import os
with open(os.environ["SITE_MARKER"], "a") as marker:
    marker.write(f"{os.getpid()}\\n")
'''

AGENT = '''
import json, os, subprocess, sys, multiprocessing as mp
import openai
import sitecustomize

BASE = os.environ["REPLAY_BASE"]
REQUEST = json.loads(os.environ["REPLAY_REQUEST"])

def ask(_=None):
    with openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0) as client:
        return client.chat.completions.create(**REQUEST).choices[0].message.content

if __name__ == "__main__":
    if sys.argv[1:] == ["child"]:
        print("child:", ask(), flush=True)
        sys.exit(0)
    print("sitecustomize:", sitecustomize.__file__, flush=True)
    print("main:", ask(), flush=True)
    subprocess.run([sys.executable, __file__, "child"], check=True)
    with mp.get_context("spawn").Pool(2) as pool:
        print("spawn:", pool.map(ask, range(2)), flush=True)
    with mp.get_context("fork").Pool(2) as pool:
        print("fork:", pool.map(ask, range(2)), flush=True)
    print("failing on purpose", file=sys.stderr, flush=True)
    sys.exit(3)
'''


def test_children_workers_and_the_users_sitecustomize_all_work_and_the_exit_code_passes_through(
    replay_upstream: Any, tmp_path: Path
) -> None:
    user_site = tmp_path / "usersite"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text(USER_SITECUSTOMIZE)
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    marker = tmp_path / "marker.txt"
    env = dict(
        os.environ,
        PYTHONPATH=str(user_site),
        SITE_MARKER=str(marker),
        REPLAY_BASE=replay_upstream.base_url,
        REPLAY_REQUEST=json.dumps(fixture("chat/text-basic-gpt4o").request_json),
    )

    result = llmtap_run(["--", sys.executable, str(script)], env, tmp_path)

    assert result.returncode == 3
    assert f"sitecustomize: {user_site / 'sitecustomize.py'}" in result.stdout
    assert result.stdout.count("Oi!") == 6  # main, child, two spawn workers, two fork workers
    assert "failing on purpose" in result.stderr
    started = marker.read_text().split()
    assert len(started) >= 4  # main, child and spawn workers each ran the user's sitecustomize
    assert replay_upstream.request_count == 6

    capsule = only_capsule(tmp_path)
    manifest = json.loads((capsule / "capsule.json").read_text())
    assert manifest["status"] == "failure" and manifest["exit_code"] == 3
    assert manifest["error"]["type"] == "NonZeroExit"
    assert manifest["counts"]["model_calls"] == 6
    lines = [json.loads(line) for line in (capsule / "calls" / "default.capture.jsonl").read_text().splitlines()]
    assert len({line["capture"]["pid"] for line in lines}) >= 4  # a pool worker may serve both its tasks
    assert all(line["response"]["usage"]["total_tokens"] == 22 for line in lines)
    health = json.loads((capsule / "capture-health.json").read_text())
    assert health["records"]["written"] == 6 and health["dropped"] == {}
    assert len(health["processes"]) >= 4
    assert (capsule / "outputs" / "stdout.txt").read_text() == result.stdout
    assert "failing on purpose" in (capsule / "outputs" / "stderr.txt").read_text()
