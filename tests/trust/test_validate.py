"""`llmtap validate`: a real capsule passes; each kind of damage, secret, tampering or miscount fails it, one line each."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmtap.cli import main
from llmtap.trust import redact_capture_dir
from llmtap.trust.validate import validate_path
from tests.trust.corpus import SECRETS

KEY = SECRETS[0].secret


def _reprove(capsule: Path, name: str) -> None:
    """Update the proof's digest of `name`, as someone covering their tracks would."""
    proof_path = capsule / "redaction-proof.json"
    proof = json.loads(proof_path.read_bytes())
    data = (capsule / name).read_bytes()
    proof["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "redacted": False}
    proof_path.write_text(json.dumps(proof))


def test_a_real_capsule_is_valid(capsule: Path) -> None:
    report = validate_path(capsule)
    assert report.problems == []
    assert report.ok and report.kind == "capsule" and report.run_id == capsule.name
    proof = json.loads((capsule / "redaction-proof.json").read_bytes())
    assert proof["stream_tampered"] is False
    assert {"capsule.json", "model-calls.jsonl", "env.lock", "outputs/stdout.txt"} <= set(proof["files"])
    assert any(name.startswith("calls/") for name in proof["files"])


def test_the_cli_exits_0_and_prints_json(capsule: Path) -> None:
    result = CliRunner().invoke(main, ["validate", str(capsule)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"valid: capsule {capsule.name}")
    result = CliRunner().invoke(main, ["validate", str(capsule), "--json"])
    report = json.loads(result.output)
    assert result.exit_code == 0 and report["ok"] is True and report["problems"] == []


def test_a_run_id_is_found_under_the_capsule_dir(capsule: Path) -> None:
    result = CliRunner().invoke(main, ["validate", capsule.name[:10], "--capsule-dir", str(capsule.parent)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"valid: capsule {capsule.name}")  # the capsule the prefix names, checked


def test_a_changed_byte_fails_the_proof_digest(capsule: Path) -> None:
    path = capsule / "model-calls.jsonl"
    data = bytearray(path.read_bytes())
    data[data.index(b'"CLIENT"') + 1] = ord("c")
    path.write_bytes(bytes(data))
    result = CliRunner().invoke(main, ["validate", str(capsule)])
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert (
        f"{capsule}: model-calls.jsonl: its sha256 differs from the one in redaction-proof.json (changed after redaction)"
        in lines
    )
    assert lines[-1] == "invalid: 1 problem(s)"


def test_a_file_added_after_redaction_is_not_covered(capsule: Path) -> None:
    (capsule / "tool-calls.jsonl").write_text('{"tool": "x"}\n')
    assert validate_path(capsule).problems == [
        "tool-calls.jsonl: not covered by redaction-proof.json (added after redaction)"
    ]


def test_a_missing_or_damaged_proof_fails(capsule: Path) -> None:
    proof = capsule / "redaction-proof.json"
    proof.write_text("{")
    assert "redaction-proof.json: is not valid JSON" in validate_path(capsule).problems
    proof.unlink()
    assert validate_path(capsule).problems == [
        "redaction-proof.json: missing, so nothing shows the files were redacted; run `llmtap redact`"
    ]


def test_a_live_secret_is_found_by_the_re_scan_even_with_the_digest_updated(capsule: Path) -> None:
    path = capsule / "outputs" / "stdout.txt"
    path.write_bytes(path.read_bytes() + f"token {KEY}\n".encode())
    _reprove(capsule, "outputs/stdout.txt")
    problems = validate_path(capsule).problems
    assert problems == [
        "outputs/stdout.txt: a re-scan finds 1 live secret(s) (openai-project-key); run `llmtap redact`"
    ]
    assert KEY not in json.dumps(problems) and KEY[:12] not in json.dumps(problems)


def test_recorded_tampering_fails(capsule: Path) -> None:
    manifest_path = capsule / "capsule.json"
    manifest = json.loads(manifest_path.read_bytes())
    manifest["capture_tampered"] = [{"path": "calls", "kind": "symlink"}]
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    _reprove(capsule, "capsule.json")
    assert validate_path(capsule).problems == ["capsule.json: capture_tampered: the workload replaced calls"]


def test_counts_that_differ_from_the_records_fail(capsule: Path) -> None:
    manifest_path = capsule / "capsule.json"
    manifest = json.loads(manifest_path.read_bytes())
    calls = manifest["counts"]["model_calls"]
    manifest["counts"]["model_calls"] = calls + 1
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    _reprove(capsule, "capsule.json")
    assert validate_path(capsule).problems == [
        f"capsule.json: counts.model_calls is {calls + 1}, the capture files hold {calls}"
    ]


def test_a_torn_capture_line_and_a_foreign_schema_version_fail(capsule: Path) -> None:
    [rollout] = sorted((capsule / "calls").glob("*.capture.jsonl"))
    lines = rollout.read_bytes().splitlines(keepends=True)
    record = json.loads(lines[0])
    record["schema_version"] = 99
    rollout.write_bytes(json.dumps(record).encode() + b"\n" + b"".join(lines[1:]) + b'{"torn": ')
    name = f"calls/{rollout.name}"
    _reprove(capsule, name)
    problems = validate_path(capsule).problems
    assert f"{name}: the last line has no newline (a torn write)" in problems
    assert f"{name}: 1 line(s) do not parse as records (first: line {len(lines) + 1})" in problems
    assert f"{name}: 1 line(s) carry a schema version this llmtap does not read (first: line 1)" in problems


def test_a_planted_link_is_reported_never_followed(capsule: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text(f"key {KEY}\n")
    os.symlink(outside, capsule / "outputs" / "extra.txt")
    problems = validate_path(capsule).problems
    assert problems == ["outputs/extra.txt: is a symbolic link, not a regular file (never followed)"]


def test_an_unfinished_capsule_fails(capsule: Path) -> None:
    manifest_path = capsule / "capsule.json"
    manifest = json.loads(manifest_path.read_bytes())
    manifest["status"] = "running"
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    _reprove(capsule, "capsule.json")
    assert validate_path(capsule).problems == ["capsule.json: status is 'running': the capture was never finalised"]


def test_a_capture_directory_redacted_by_llmtap_redact_is_valid(tmp_path: Path, capsule: Path) -> None:
    captures = tmp_path / "captures"
    captures.mkdir()
    [rollout] = sorted((capsule / "calls").glob("*.capture.jsonl"))
    line = json.loads(rollout.read_bytes().splitlines()[0])
    line["request"]["messages"][-1]["content"] = f"my key is {KEY}"
    (captures / "r-1.capture.jsonl").write_bytes(json.dumps(line).encode() + b"\n")
    report = validate_path(captures)
    assert report.kind == "capture-dir"
    assert (
        "r-1.capture.jsonl: a re-scan finds 1 live secret(s) (openai-project-key); run `llmtap redact`"
        in report.problems
    )
    redact_capture_dir(captures)
    assert validate_path(captures).problems == []


@pytest.mark.parametrize("content", [b"", b"hello\n"])
def test_a_folder_that_is_neither_fails(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "notes.txt").write_bytes(content)
    result = CliRunner().invoke(main, ["validate", str(tmp_path)])
    assert result.exit_code == 1 and "not a capsule or capture directory" in result.output
