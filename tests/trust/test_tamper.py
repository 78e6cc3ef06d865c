"""Tamper-safe finalisation on a real `llmtap run`: a workload that swaps what llmtap manages gains nothing.

Each workload makes a real openai SDK call against the replay upstream, replaces llmtap's files
(a symbolic link to a file outside, a FIFO, a hard link to that file) or its `calls/` folder (a
link to a folder outside), and exits with code 7. Afterwards the outside file and folder are
byte-identical, nothing hung (every run is bounded by a timeout), the capsule says it was tampered
with in all three places, `llmtap validate` fails, and `llmtap run` exits with the workload's code
and prints one `capture integrity` line.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmtap.trust.validate import validate_path
from tests.fixtures import fixture

OUTSIDE_BYTES = b"OUTSIDE: a file of the user's that no capsule may change or copy\n"
EXIT_CODE = 7
# Every file llmtap manages in a capsule, including those only finalisation writes.
TARGETS = [
    "capsule.json",
    "outputs/stdout.txt",
    "outputs/stderr.txt",
    "url_registry.json",
    "model-calls.jsonl",
    "env.lock",
    "capture-health.json",
    "redaction-proof.json",
    "calls/default.capture.jsonl",
]

WORKLOAD = """
import json, os, sys, time
import openai
capsule = os.environ["LLMTAP_RUN_CAPSULE"]
outside, kind, targets = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
deadline = time.monotonic() + 20
while not os.path.exists(os.path.join(capsule, "capsule.json")) and time.monotonic() < deadline:
    time.sleep(0.01)  # the recorder writes the running manifest once the command has started
print("before the swap", flush=True)
for relative in targets:
    path = os.path.join(capsule, relative)
    if os.path.lexists(path) and kind != "calls-link":
        os.unlink(path)
    if kind == "symlink":
        os.symlink(outside, path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "hardlink":
        os.link(outside, path)
    elif kind == "calls-link":
        os.rename(path, path + "-moved")
        os.symlink(outside, path, target_is_directory=True)
with openai.OpenAI(base_url=os.environ["REPLAY_BASE"] + "/v1", api_key="sk-test", max_retries=0) as client:
    client.chat.completions.create(**json.loads(os.environ["REPLAY_REQUEST"]))
print("after the swap", flush=True)
sys.exit(7)
"""


def _tree(directory: Path) -> dict[str, Any]:
    """Every entry of `directory`, links read as links: what must be identical after the run."""
    found: dict[str, Any] = {}
    for path in sorted(directory.rglob("*")):
        info = path.lstat()
        key = str(path.relative_to(directory))
        if stat.S_ISLNK(info.st_mode):
            found[key] = ("link", os.readlink(path))
        elif stat.S_ISREG(info.st_mode):
            found[key] = ("file", path.read_bytes(), info.st_nlink)
        else:
            found[key] = ("other", stat.S_IFMT(info.st_mode))
    return found


def _run(
    tmp_path: Path, replay_base: str, outside: Path, kind: str, targets: list[str]
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    env = dict(
        os.environ,
        REPLAY_BASE=replay_base,
        REPLAY_REQUEST=json.dumps(fixture("chat/text-basic-gpt4o").request_json),
    )
    command = [
        sys.executable, "-m", "llmtap.cli.run", "--capsule-dir", str(tmp_path / "runs"), "--",
        sys.executable, str(script), str(outside), kind, json.dumps(targets),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, check=False, timeout=120)
    [capsule] = [path for path in (tmp_path / "runs").iterdir() if path.is_dir()]
    return capsule, done


def _assert_marked(capsule: Path, done: subprocess.CompletedProcess[str], expected: list[dict[str, str]]) -> None:
    assert done.returncode == EXIT_CODE, done.stderr
    assert [line for line in done.stderr.splitlines() if "capture integrity" in line] != []
    assert len([line for line in done.stderr.splitlines() if "capture integrity" in line]) == 1
    manifest = json.loads((capsule / "capsule.json").read_bytes())
    health = json.loads((capsule / "capture-health.json").read_bytes())
    proof = json.loads((capsule / "redaction-proof.json").read_bytes())
    assert manifest["status"] == "failure" and manifest["exit_code"] == EXIT_CODE
    for entry in expected:
        assert entry in manifest["capture_tampered"]
        assert entry in health["tampered_entries"]
        assert entry in proof["tampered_entries"]
    assert proof["stream_tampered"] is True and health["ok"] is False
    report = validate_path(capsule)
    assert not report.ok
    assert any("capture_tampered" in problem for problem in report.problems)
    assert any("stream_tampered" in problem for problem in report.problems)
    cli = subprocess.run(
        [sys.executable, "-m", "llmtap", "validate", str(capsule)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert cli.returncode == 1 and "capture_tampered" in cli.stdout


def _assert_nothing_planted_left(capsule: Path) -> None:
    for path in capsule.rglob("*"):
        info = path.lstat()
        assert stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode), path
        assert not stat.S_ISREG(info.st_mode) or info.st_nlink == 1, path


@pytest.mark.parametrize("kind", ["symlink", "fifo", "hardlink"])
def test_a_workload_that_swaps_every_managed_file_changes_nothing_outside_and_is_marked(
    replay_upstream: Any, tmp_path: Path, kind: str
) -> None:
    outside = tmp_path / "outside" / "precious.txt"
    outside.parent.mkdir()
    outside.write_bytes(OUTSIDE_BYTES)
    before = _tree(outside.parent)
    capsule, done = _run(tmp_path, replay_upstream.base_url, outside, kind, TARGETS)
    after = _tree(outside.parent)
    if kind == "hardlink":  # the link count went up while the workload's names existed, and back down since
        assert {k: v[:2] for k, v in after.items()} == {k: v[:2] for k, v in before.items()}
    assert after == before
    _assert_marked(capsule, done, [{"path": target, "kind": kind} for target in TARGETS])
    _assert_nothing_planted_left(capsule)
    for stream in ("outputs/stdout.txt", "outputs/stderr.txt", "calls/default.capture.jsonl"):
        assert (capsule / stream).is_file() and OUTSIDE_BYTES not in (capsule / stream).read_bytes()  # recreated empty
    for path in capsule.rglob("*"):
        assert not path.is_file() or OUTSIDE_BYTES not in path.read_bytes()  # nothing of the outside file was copied in


def test_a_workload_that_replaces_calls_with_a_link_writes_nothing_outside_and_is_marked(
    replay_upstream: Any, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_bytes(OUTSIDE_BYTES)
    (elsewhere / "default.capture.jsonl").write_bytes(OUTSIDE_BYTES)
    (elsewhere / "link").symlink_to(elsewhere / "keep.txt")
    os.mkfifo(elsewhere / "fifo")
    before = _tree(elsewhere)
    capsule, done = _run(tmp_path, replay_upstream.base_url, elsewhere, "calls-link", ["calls"])
    assert _tree(elsewhere) == before
    _assert_marked(capsule, done, [{"path": "calls", "kind": "symlink"}])
    assert (capsule / "calls").is_dir() and not (capsule / "calls").is_symlink()
    manifest = json.loads((capsule / "capsule.json").read_bytes())
    assert manifest["counts"]["model_calls"] == 1  # the call was spooled, then recorded into a real calls/
    _assert_nothing_planted_left(capsule)
