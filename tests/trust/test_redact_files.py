"""`llmtap redact DIR` and `redact_capsule`: files rewritten safely, a proof without secrets, idempotent."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from llmtap.cli import main
from llmtap.store import CaptureStore
from llmtap.trust import PROOF_NAME, RedactionError, redact_capsule, redact_capture_dir
from llmtap.trust.secrets import RULE_PACK_DIGEST
from tests.fixtures import fixture
from tests.trust.corpus import SECRETS
from tests.trust.streams import capture_line, plant_split

KEY = SECRETS[0].secret
GITHUB = SECRETS[18].secret
PEM = next(s.secret for s in SECRETS if s.rule_id == "private-key-pem")


def _capture_dir(root: Path) -> dict[str, list[dict[str, object]]]:
    """A capture directory of real recorded calls, a few carrying planted secrets."""
    chat = fixture("chat/tool-call-gpt4o")
    stream = fixture("chat/text-stream-include-usage-gpt4")
    request = dict(chat.request_json)
    request["messages"] = [*request["messages"], {"role": "user", "content": f"my key is {KEY}\n{PEM}"}]
    lines = {
        "clean-0": [capture_line(chat), capture_line(stream)],
        "dirty-1": [
            capture_line(chat),
            capture_line(chat, request=request),
            capture_line(stream, body=plant_split(stream, f"token {GITHUB} end", pieces=3)),
        ],
    }
    with CaptureStore(root) as store:
        for rollout_id, records in lines.items():
            for record in records:
                store.append(rollout_id, record)
    return lines


def _digests(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir()) if p.is_file()}


def test_redact_dir_removes_every_secret_and_keeps_every_record(tmp_path: Path) -> None:
    _capture_dir(tmp_path)
    with CaptureStore(tmp_path, create=False) as store:
        before = store.read("dirty-1")
    summary = redact_capture_dir(tmp_path)
    assert summary.changed_files == ["dirty-1.capture.jsonl"]
    data = (tmp_path / "dirty-1.capture.jsonl").read_bytes()
    for secret in (KEY, GITHUB, PEM, PEM.splitlines()[3]):
        assert secret.encode() not in data
    with CaptureStore(tmp_path, create=False) as store:
        after = store.read("dirty-1", strict=True)
    assert [index for index, _ in after.entries] == [index for index, _ in before.entries] == [0, 1, 2]
    assert after.entries[0] == before.entries[0]  # the clean record is untouched
    rules = {finding["rule_id"] for finding in summary["findings"]}
    assert rules == {"openai-project-key", "private-key-pem", "github-pat-classic"}


def test_the_proof_names_pack_files_and_findings_but_no_secret(tmp_path: Path) -> None:
    _capture_dir(tmp_path)
    redact_capture_dir(tmp_path)
    raw = (tmp_path / PROOF_NAME).read_bytes()
    proof = orjson.loads(raw)
    for secret in (KEY, GITHUB, PEM, KEY[:16], GITHUB[4:20], PEM.splitlines()[2]):
        assert secret.encode() not in raw
    assert proof["rule_pack"]["digest"] == RULE_PACK_DIGEST
    assert proof["findings_count"] == len(proof["findings"]) >= 3
    for name, entry in proof["files"].items():
        assert entry["sha256"] == hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
    for finding in proof["findings"]:
        assert finding["file"] == "dirty-1.capture.jsonl" and finding["line"] in (2, 3)
        assert len(finding["hmac_sha256"]) == 64 and finding["length"] > 0
        unsalted = hashlib.sha256(KEY.encode()).hexdigest()
        assert finding["hmac_sha256"] != unsalted
    assert len(proof["salt_sha256"]) == 64


def test_a_second_run_finds_nothing_and_changes_no_byte(tmp_path: Path) -> None:
    _capture_dir(tmp_path)
    redact_capture_dir(tmp_path)
    first = _digests(tmp_path)
    summary = redact_capture_dir(tmp_path)
    assert summary["findings_count"] == 0 and summary.changed_files == []
    assert _digests(tmp_path) == first


def test_a_symlinked_rollout_file_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text(json.dumps({"content": KEY}) + "\n")
    captures = tmp_path / "captures"
    _capture_dir(captures)
    os.symlink(outside, captures / "evil.capture.jsonl")
    before = _digests(captures)
    with pytest.raises(RedactionError, match="evil.capture.jsonl"):
        redact_capture_dir(captures)
    assert outside.read_text() == json.dumps({"content": KEY}) + "\n"
    assert _digests(captures) == before  # nothing was changed, the good files neither


def test_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    _capture_dir(tmp_path)
    os.mkfifo(tmp_path / "stuck.capture.jsonl")
    outcome: list[BaseException] = []
    worker = threading.Thread(target=lambda: _catch(outcome, tmp_path))
    worker.start()
    worker.join(20)
    assert not worker.is_alive()
    assert isinstance(outcome[0], RedactionError)


def _catch(outcome: list[BaseException], path: Path) -> None:
    try:
        redact_capture_dir(path)
    except BaseException as exc:  # noqa: BLE001 - the test inspects it
        outcome.append(exc)


def test_a_hard_linked_rollout_file_is_refused(tmp_path: Path) -> None:
    captures = tmp_path / "captures"
    _capture_dir(captures)
    os.link(captures / "dirty-1.capture.jsonl", tmp_path / "elsewhere.jsonl")
    with pytest.raises(RedactionError, match="hard links"):
        redact_capture_dir(captures)
    assert KEY.encode() in (tmp_path / "elsewhere.jsonl").read_bytes()


def test_the_cli_redacts_and_reports_in_one_line(tmp_path: Path) -> None:
    _capture_dir(tmp_path)
    result = CliRunner().invoke(main, ["redact", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("4 secret(s) redacted in 1 of 2 file(s)")
    assert KEY not in result.output
    again = CliRunner().invoke(main, ["redact", str(tmp_path)])
    assert again.exit_code == 0 and again.output.startswith("0 secret(s)")


def test_the_cli_refuses_a_link_with_one_line_and_exit_1(tmp_path: Path) -> None:
    _capture_dir(tmp_path)
    os.symlink("/etc/hostname", tmp_path / "x.capture.jsonl")
    result = CliRunner().invoke(main, ["redact", str(tmp_path)])
    assert result.exit_code == 1
    assert "x.capture.jsonl" in result.output and "Traceback" not in result.output


def _capsule(root: Path) -> Path:
    capsule = root / "01JE8Z7Q4X2K9M3N5P6R7S8T9V"
    (capsule / "outputs").mkdir(parents=True)
    _capture_dir(capsule / "calls")
    (capsule / "model-calls.jsonl").write_text(json.dumps({"gen_ai.input.messages": [{"content": KEY}]}) + "\n")
    (capsule / "tool-calls.jsonl").write_text(json.dumps({"result": f"GITHUB_TOKEN={GITHUB}\n"}) + "\n")
    (capsule / "outputs" / "stdout.txt").write_text(f"starting\nusing key {KEY}\ndone\n")
    (capsule / "outputs" / "stderr.txt").write_text("warning: nothing\n")
    (capsule / "env.lock").write_text(
        json.dumps({"environment": {"DATABASE_URL": "postgres://u:Zq8pLm2Xv9Rt@db/x"}}, indent=2)
    )
    (capsule / "capsule.json").write_text(json.dumps({"command": ["python", "agent.py", "--key", KEY]}, indent=2))
    return capsule


def test_redact_capsule_covers_every_file_and_writes_the_proof(tmp_path: Path) -> None:
    capsule = _capsule(tmp_path)
    summary = redact_capsule(capsule)
    for name in ("model-calls.jsonl", "tool-calls.jsonl", "outputs/stdout.txt", "env.lock", "capsule.json"):
        data = (capsule / name).read_bytes()
        assert KEY.encode() not in data and GITHUB.encode() not in data and b"Zq8pLm2Xv9Rt" not in data, name
    assert json.loads((capsule / "capsule.json").read_text())["command"][-1] == "[REDACTED:openai-project-key]"
    assert (
        capsule / "outputs" / "stdout.txt"
    ).read_text() == "starting\nusing key [REDACTED:openai-project-key]\ndone\n"
    assert "calls/dirty-1.capture.jsonl" in summary.changed_files
    proof = json.loads((capsule / PROOF_NAME).read_text())
    assert set(proof["files"]) >= {"calls/clean-0.capture.jsonl", "outputs/stderr.txt", "capsule.json"}
    stdout_finding = next(f for f in proof["findings"] if f["file"] == "outputs/stdout.txt")
    assert stdout_finding["line"] == 2 and stdout_finding["offset"] == len("using key ")
    before = _digests(capsule)
    assert redact_capsule(capsule)["findings_count"] == 0 and _digests(capsule) == before


def test_redact_capsule_refuses_a_linked_calls_directory(tmp_path: Path) -> None:
    capsule = _capsule(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    (capsule / "calls").rename(elsewhere)
    os.symlink(elsewhere, capsule / "calls")
    with pytest.raises(RedactionError, match="not a directory"):
        redact_capsule(capsule)
    assert KEY.encode() in (elsewhere / "dirty-1.capture.jsonl").read_bytes()


def test_a_file_over_the_size_bound_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmtap.trust import redact_files

    _capture_dir(tmp_path)
    size = (tmp_path / "dirty-1.capture.jsonl").stat().st_size
    monkeypatch.setattr(redact_files, "MAX_FILE_BYTES", size - 1)
    with pytest.raises(RedactionError, match="more than the"):
        redact_capture_dir(tmp_path)
    assert KEY.encode() in (tmp_path / "dirty-1.capture.jsonl").read_bytes()


def test_a_linked_proof_is_refused_before_any_file_changes(tmp_path: Path) -> None:
    captures = tmp_path / "captures"
    _capture_dir(captures)
    target = tmp_path / "target.json"
    target.write_text("{}")
    os.symlink(target, captures / PROOF_NAME)
    before = _digests(captures)
    with pytest.raises(RedactionError, match=PROOF_NAME):
        redact_capture_dir(captures)
    assert _digests(captures) == before and target.read_text() == "{}"
