"""Finalisation redacts every capsule, and removes what the workload planted without ever following it.

The cases `tests/reliability/test_store_plantings.py` already covers (symlinks and FIFOs at
managed files, managed folders replaced by links) are not repeated here; these are the rest:
hard links, sockets, folders where files belong, a planted proof, links inside a linked folder,
the retry when a late workload process swaps a file after the sweep, and redaction itself.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from llmtap.capsule.finalise import CaptureOutcome, finalise_capsule
from llmtap.capsule.manifest import start_manifest
from llmtap.capsule.writer import CapsulePaths, create_capsule
from llmtap.trust.validate import validate_path
from tests.spool.test_collector import _spool_calls
from tests.trust.corpus import SECRETS

OUTSIDE_BYTES = b"outside the capsule: must never change\n"
KEY = SECRETS[0].secret


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    target = tmp_path / "outside" / "precious.txt"
    target.parent.mkdir()
    target.write_bytes(OUTSIDE_BYTES)
    return target


def _capsule(tmp_path: Path, command: list[str] | None = None) -> tuple[CapsulePaths, dict[str, Any]]:
    paths = create_capsule(tmp_path / "runs")
    manifest = start_manifest(
        paths,
        capture_mode="run",
        command=command or ["x"],
        cwd=str(tmp_path),
        started_at=time.time(),
        registry_source=None,
    )
    paths.stdout.write_bytes(b"")
    paths.stderr.write_bytes(b"")
    return paths, manifest


def _finalise(paths: CapsulePaths, manifest: dict[str, Any]) -> dict[str, Any]:
    return finalise_capsule(paths, manifest, CaptureOutcome("success", exit_code=0))


def test_a_clean_capsule_gets_a_proof_and_validates(tmp_path: Path) -> None:
    paths, manifest = _capsule(tmp_path)
    _spool_calls(paths, 2)
    final = _finalise(paths, manifest)
    proof = json.loads((paths.root / "redaction-proof.json").read_bytes())
    assert final["files"]["redaction_proof"] == "redaction-proof.json"
    assert proof["findings_count"] == 0 and proof["stream_tampered"] is False
    assert {"capsule.json", "model-calls.jsonl", "env.lock", "capture-health.json", "outputs/stdout.txt"} <= set(
        proof["files"]
    )
    assert validate_path(paths.root).problems == []


def test_secrets_in_the_command_line_and_output_are_redacted_and_the_proof_hashes_the_final_manifest(
    tmp_path: Path,
) -> None:
    paths, manifest = _capsule(tmp_path, ["python", "agent.py", "--key", KEY])
    paths.stdout.write_text(f"using {KEY}\n")
    final = _finalise(paths, manifest)
    data = paths.manifest.read_bytes()
    assert KEY.encode() not in data and KEY not in json.dumps(final)
    assert final["command"][-1] == "[REDACTED:openai-project-key]"
    assert KEY.encode() not in paths.stdout.read_bytes()
    proof = json.loads((paths.root / "redaction-proof.json").read_bytes())
    assert sorted(finding["file"] for finding in proof["findings"]) == ["capsule.json", "outputs/stdout.txt"]
    assert KEY[:16] not in json.dumps(proof)
    import hashlib

    assert proof["files"]["capsule.json"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert validate_path(paths.root).problems == []


@pytest.mark.parametrize("name", ["outputs/stdout.txt", "capsule.json", "url_registry.json", "internal/interpreter"])
def test_a_hard_link_to_a_file_outside_is_removed_and_its_bytes_never_read(
    tmp_path: Path, outside: Path, name: str
) -> None:
    paths, manifest = _capsule(tmp_path)
    outside.write_bytes(f"{KEY}\n".encode())  # a secret of the user's the workload wants in the capsule
    target = paths.root / name
    target.unlink(missing_ok=True)
    os.link(outside, target)
    final = _finalise(paths, manifest)
    assert {"path": name, "kind": "hardlink"} in final["capture_tampered"]
    assert outside.read_bytes() == f"{KEY}\n".encode() and outside.stat().st_nlink == 1
    for path in paths.root.rglob("*"):
        assert not path.is_file() or KEY[:12].encode() not in path.read_bytes()


def test_a_hard_link_inside_calls_is_removed_and_the_stream_recreated_empty(tmp_path: Path, outside: Path) -> None:
    paths, manifest = _capsule(tmp_path)
    os.link(outside, paths.calls / "r1.capture.jsonl")
    final = _finalise(paths, manifest)
    assert {"path": "calls/r1.capture.jsonl", "kind": "hardlink"} in final["capture_tampered"]
    assert (paths.calls / "r1.capture.jsonl").read_bytes() == b"" and outside.read_bytes() == OUTSIDE_BYTES
    assert final["rollouts"]["r1"]["calls"] == 0


def test_a_socket_and_a_folder_at_file_paths_are_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths, manifest = _capsule(tmp_path)
    paths.stdout.unlink()
    monkeypatch.chdir(paths.outputs)  # a relative name: the full path is longer than AF_UNIX allows
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind("stdout.txt")
    (paths.root / "model-calls.jsonl").mkdir()
    (paths.root / "model-calls.jsonl" / "inner").symlink_to(tmp_path)
    final = _finalise(paths, manifest)
    assert {"path": "outputs/stdout.txt", "kind": "socket"} in final["capture_tampered"]
    assert {"path": "model-calls.jsonl", "kind": "directory"} in final["capture_tampered"]
    assert paths.stdout.is_file() and paths.stdout.read_bytes() == b""
    assert paths.model_calls.is_file() and tmp_path.is_dir()


def test_a_proof_planted_before_finalisation_is_replaced(tmp_path: Path) -> None:
    paths, manifest = _capsule(tmp_path)
    (paths.root / "redaction-proof.json").write_text('{"findings_count": 0, "files": {}}')
    final = _finalise(paths, manifest)
    assert {"path": "redaction-proof.json", "kind": "planted"} in final["capture_tampered"]
    proof = json.loads((paths.root / "redaction-proof.json").read_bytes())
    assert proof["stream_tampered"] is True and "previous_proof_sha256" not in proof


def test_files_under_a_linked_outputs_folder_are_never_unlinked_there(tmp_path: Path, outside: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "stdout.txt").symlink_to(outside)  # what a file check that followed `outputs` would remove
    os.mkfifo(elsewhere / "stderr.txt")
    paths, manifest = _capsule(tmp_path)
    for stream in (paths.stdout, paths.stderr):
        stream.unlink()
    paths.outputs.rmdir()
    paths.outputs.symlink_to(elsewhere, target_is_directory=True)
    final = _finalise(paths, manifest)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["stderr.txt", "stdout.txt"]
    assert (elsewhere / "stdout.txt").is_symlink() and outside.read_bytes() == OUTSIDE_BYTES
    assert {"path": "outputs", "kind": "symlink"} in final["capture_tampered"]
    assert paths.stdout.read_bytes() == b"" and paths.stderr.read_bytes() == b""  # recreated empty


def test_internal_replaced_by_a_link_gets_its_folders_back(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    paths, manifest = _capsule(tmp_path)
    os.rename(paths.internal, tmp_path / "internal-moved")
    paths.internal.symlink_to(elsewhere, target_is_directory=True)
    final = _finalise(paths, manifest)
    assert {"path": "internal", "kind": "symlink"} in final["capture_tampered"]
    assert paths.process_health.is_dir() and not paths.internal.is_symlink()
    assert list(elsewhere.iterdir()) == []


def test_a_file_swapped_after_the_sweep_is_swept_again_and_redaction_retried(
    tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmtap.trust import redact_files

    paths, manifest = _capsule(tmp_path)
    real = redact_files.redact_capsule
    calls: list[int] = []

    def late_swap(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:  # a workload process that outlived the run swaps stdout now
            paths.stdout.unlink()
            paths.stdout.symlink_to(outside)
        return real(*args, **kwargs)

    monkeypatch.setattr(redact_files, "redact_capsule", late_swap)
    final = _finalise(paths, manifest)
    assert len(calls) == 2
    assert {"path": "outputs/stdout.txt", "kind": "symlink"} in final["capture_tampered"]
    health = json.loads(paths.capture_health.read_bytes())
    assert {"path": "outputs/stdout.txt", "kind": "symlink"} in health["tampered_entries"]
    assert outside.read_bytes() == OUTSIDE_BYTES
    assert json.loads((paths.root / "redaction-proof.json").read_bytes())["stream_tampered"] is True


def test_in_process_capture_redacts_its_capsule(tmp_path: Path, replay_upstream: Any) -> None:
    import httpx

    import llmtap
    from tests.fixtures import fixture

    request = dict(fixture("chat/text-basic-gpt4o").request_json)
    request["messages"] = [*request["messages"], {"role": "user", "content": f"my key is {KEY}"}]
    with llmtap.capture(runs_dir=tmp_path / "runs") as captured:
        httpx.post(
            replay_upstream.base_url + "/v1/chat/completions",
            json=request,
            headers={"x-replay-fixture": "chat/text-basic-gpt4o"},
        )
    capsule = captured.capsule_dir
    assert capsule is not None
    for path in capsule.rglob("*"):
        assert not path.is_file() or KEY.encode() not in path.read_bytes()
    proof = json.loads((capsule / "redaction-proof.json").read_bytes())
    assert {finding["file"].split("/")[0] for finding in proof["findings"]} >= {"calls", "model-calls.jsonl"}
    assert validate_path(capsule).problems == []


def test_redaction_that_keeps_failing_leaves_no_proof_and_says_why_without_raising(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmtap.trust import redact_files
    from llmtap.trust.redaction import RedactionError

    paths, manifest = _capsule(tmp_path, ["python", "agent.py", "--key", KEY])

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RedactionError("Refusing to redact 'x': it is not a regular file; remove or replace it and run again.")

    monkeypatch.setattr(redact_files, "redact_capsule", refuse)
    final = _finalise(paths, manifest)
    assert final["status"] == "success" and "capture_tampered" not in final  # nothing was swapped
    assert final["redaction_error"].startswith("Refusing to redact 'x'")
    assert not (paths.root / "redaction-proof.json").exists()
    assert KEY.encode() not in paths.manifest.read_bytes()  # the manifest itself is still redacted
    assert "redaction-proof.json: missing" in " ".join(validate_path(paths.root).problems)
