"""Evidence bundles from a real `llmtap run` capsule: export, verify, reproducibility, refusals, the CLI."""

from __future__ import annotations

import base64
import json
import os
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmtap.cli import main
from llmtap.trust.bundle_format import SIGNATURE_FILES, BundleLimits, parse_sums
from llmtap.trust.dsse import pae
from llmtap.trust.evidence import CapsuleRefusedError, EvidenceError, capsule_export_problems, export_evidence
from llmtap.trust.keys import KeyPair, fingerprint, generate_key_pair, load_private_key, load_public_key
from llmtap.trust.verify import verify_bundle
from tests.trust.zip_tools import members_of, top


def _export(capsule: Path, key_pair: KeyPair, bundle: Path, **options: object) -> Path:
    export_evidence(capsule, bundle, load_private_key(key_pair.private_path), **options)  # type: ignore[arg-type]
    return bundle


def test_a_real_capsule_exports_and_verifies_against_the_pinned_key(
    good_bundle: Path, key_pair: KeyPair, pristine_capsule: Path
) -> None:
    report = verify_bundle(good_bundle, expected_key=load_public_key(key_pair.public_path))
    assert report.problems == []
    assert report.verdict == "verified" and report.exit_code == 0
    assert report.capsule_id == pristine_capsule.name
    capsule_files = sorted(
        str(path.relative_to(pristine_capsule)) for path in pristine_capsule.rglob("*") if path.is_file()
    )
    assert report.files == len(capsule_files)
    members = members_of(good_bundle)
    for relative in capsule_files:  # every capsule file, byte for byte
        assert members[top(f"capsule/{relative}")] == (pristine_capsule / relative).read_bytes()
    assert report.key_fingerprint == key_pair.fingerprint


def test_without_a_pinned_key_a_good_bundle_is_only_self_consistent(good_bundle: Path) -> None:
    report = verify_bundle(good_bundle)
    assert report.problems == [] and report.verdict == "self-consistent" and report.exit_code == 3


def test_a_bundle_signed_by_another_key_fails_when_a_key_is_pinned(good_bundle: Path, tmp_path: Path) -> None:
    other = generate_key_pair(tmp_path, name="other")
    report = verify_bundle(good_bundle, expected_key=load_public_key(other.public_path))
    assert report.verdict == "failed"
    assert [problem.message for problem in report.problems] == [
        f"the bundle is signed by key {report.key_fingerprint}, not by the key given ({other.fingerprint})"
    ]
    assert verify_bundle(good_bundle, expected_fingerprint=other.fingerprint.upper()).verdict == "failed"


def test_sums_list_every_file_sorted_in_gnu_format_and_the_signatures_verify(
    good_bundle: Path, key_pair: KeyPair
) -> None:
    members = members_of(good_bundle)
    sums = members[top("SHA256SUMS")]
    entries, problems = parse_sums(sums)
    assert problems == []
    listed = {name for name in members if name.removeprefix(top("")) not in SIGNATURE_FILES}
    assert {top(path) for path in entries} == listed
    lines = sums.decode().splitlines()
    assert lines == sorted(lines, key=lambda line: line[66:].encode()) and all(line[64:66] == "  " for line in lines)
    public = load_public_key(key_pair.public_path)
    public.verify(members[top("SHA256SUMS.sig")], sums)  # raw 64-byte ed25519 over the exact bytes
    assert len(members[top("SHA256SUMS.sig")]) == 64
    assert members[top("key.pem")] == key_pair.public_path.read_bytes()


def test_the_statement_is_in_toto_v1_in_a_dsse_envelope_binding_every_path(
    good_bundle: Path, key_pair: KeyPair, pristine_capsule: Path
) -> None:
    members = members_of(good_bundle)
    envelope = json.loads(members[top("statement.dsse.json")])
    assert envelope["payloadType"] == "application/vnd.in-toto+json"  # the in-toto media type, written out
    payload = base64.b64decode(envelope["payload"])
    [signature] = envelope["signatures"]
    assert signature["keyid"] == key_pair.fingerprint
    load_public_key(key_pair.public_path).verify(base64.b64decode(signature["sig"]), pae("application/vnd.in-toto+json", payload))
    statement = json.loads(payload)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "urn:llmtap:predicate:capture-evidence:v1"
    entries, _ = parse_sums(members[top("SHA256SUMS")])
    assert {subject["name"]: subject["digest"]["sha256"] for subject in statement["subject"]} == entries
    manifest = json.loads((pristine_capsule / "capsule.json").read_text())
    assert statement["predicate"] == {
        "llmtap_version": manifest["llmtap_version"],
        "capsule_id": pristine_capsule.name,
        "capsule_status": "success",
        "created_at": manifest["ended_at"],
    }


def test_pae_is_the_dsse_v1_encoding() -> None:
    assert (
        pae("http://example.com/HelloWorld", b"hello world")
        == b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )
    assert pae("t", b"") == b"DSSEv1 1 t 0 "
    assert pae("é", b"\x00") == b"DSSEv1 2 \xc3\xa9 1 \x00"  # lengths count bytes, not characters


def test_exporting_the_same_capsule_twice_gives_byte_identical_bundles(
    capsule: Path, key_pair: KeyPair, tmp_path: Path, good_bundle: Path
) -> None:
    first = _export(capsule, key_pair, tmp_path / "one.zip")
    os.utime(capsule / "capsule.json", (1, 1))  # file times are not part of the bundle
    second = _export(capsule, key_pair, tmp_path / "two.zip")
    assert first.read_bytes() == second.read_bytes() == good_bundle.read_bytes()
    with zipfile.ZipFile(first) as archive:
        assert {(info.date_time, info.external_attr >> 16) for info in archive.infolist()} == {
            ((1980, 1, 1, 0, 0, 0), 0o100644)
        }


def test_an_existing_bundle_is_never_overwritten(capsule: Path, key_pair: KeyPair, tmp_path: Path) -> None:
    existing = tmp_path / "bundle.zip"
    existing.write_bytes(b"keep me")
    with pytest.raises(EvidenceError, match="already exists"):
        _export(capsule, key_pair, existing)
    assert existing.read_bytes() == b"keep me"
    assert [path.name for path in tmp_path.iterdir() if path.name.endswith(".tmp")] == []


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        ("symlink", "model-calls.jsonl: is a symbolic link, not a regular file (never followed)"),
        ("fifo", "env.lock: is a FIFO, not a regular file (never followed)"),
        ("hardlink", "outputs/stdout.txt: is a hard link (2 names), so it may be changed from outside the capsule"),
        ("bad-line", "model-calls.jsonl: 1 line(s) are not valid JSON (first: line 3)"),  # after the two calls
        ("bad-json", "capture-health.json: is not valid JSON"),
        ("running", "capsule.json: status is 'running': the capture has not been finalised"),
        (
            "tampered",
            "capsule.json: capture recorded tampering by the workload (capture_tampered); see capture-health.json",
        ),
        ("no-manifest", "capsule.json: missing, so this is not a run capsule"),
        ("linked-folder", "calls: is a symbolic link, not a regular file (never followed)"),
    ],
)
def test_a_capsule_that_fails_its_checks_is_refused_and_nothing_outside_is_touched(
    capsule: Path, key_pair: KeyPair, tmp_path: Path, damage: str, expected: str
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("host file")
    manifest = json.loads((capsule / "capsule.json").read_text())
    if damage == "symlink":
        (capsule / "model-calls.jsonl").unlink()
        (capsule / "model-calls.jsonl").symlink_to(outside)
    elif damage == "fifo":
        (capsule / "env.lock").unlink()
        os.mkfifo(capsule / "env.lock")  # a read would block forever; the export must not hang
    elif damage == "hardlink":
        os.link(capsule / "outputs" / "stdout.txt", tmp_path / "second-name")
    elif damage == "bad-line":
        with open(capsule / "model-calls.jsonl", "ab") as handle:
            handle.write(b"{torn\n")
    elif damage == "bad-json":
        (capsule / "capture-health.json").write_text("{")
    elif damage in ("running", "tampered"):
        manifest.update(
            {"status": "running"} if damage == "running" else {"capture_tampered": [{"path": "x", "kind": "symlink"}]}
        )
        (capsule / "capsule.json").write_text(json.dumps(manifest))
    elif damage == "no-manifest":
        (capsule / "capsule.json").unlink()
    elif damage == "linked-folder":
        (capsule / "calls").rename(tmp_path / "calls-elsewhere")
        (capsule / "calls").symlink_to(tmp_path / "calls-elsewhere")
    assert expected in capsule_export_problems(capsule)
    with pytest.raises(CapsuleRefusedError) as refused:
        _export(capsule, key_pair, tmp_path / "bundle.zip")
    assert expected in refused.value.problems
    assert not (tmp_path / "bundle.zip").exists()
    assert outside.read_text() == "host file"


def test_an_injected_validator_can_refuse_a_capsule(capsule: Path, key_pair: KeyPair, tmp_path: Path) -> None:
    seen: list[Path] = []

    def validate(path: Path) -> list[str]:
        seen.append(path)
        return ["redaction-proof.json: missing"]

    assert capsule_export_problems(capsule) == []
    with pytest.raises(CapsuleRefusedError, match=r"redaction-proof\.json: missing"):
        _export(capsule, key_pair, tmp_path / "bundle.zip", extra_validator=validate)
    assert seen == [capsule]
    _export(capsule, key_pair, tmp_path / "bundle.zip", extra_validator=lambda path: [])


def test_a_capsule_larger_than_the_bounds_is_refused(capsule: Path) -> None:
    problems = capsule_export_problems(capsule, limits=BundleLimits(max_members=3))
    assert "the capsule holds more than 3 files, more than a bundle may carry" in problems
    sizes = capsule_export_problems(capsule, limits=BundleLimits(max_member_bytes=100))
    assert any(
        problem.startswith("capsule.json: is ") and "more than a bundle member may be (100)" in problem
        for problem in sizes
    )


def test_the_cli_generates_keys_exports_and_verifies_with_documented_exit_codes(capsule: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    generated = runner.invoke(main, ["keys", "generate", "--out", str(tmp_path / "keys")])
    assert generated.exit_code == 0, generated.output
    private, public = tmp_path / "keys" / "llmtap-evidence.key.pem", tmp_path / "keys" / "llmtap-evidence.pub.pem"
    printed = fingerprint(load_public_key(public))
    assert f"fingerprint  {printed}  (sha256 of the raw ed25519 public key)" in generated.output
    assert runner.invoke(main, ["keys", "fingerprint", str(public)]).output.strip() == printed
    bundle = tmp_path / "out.zip"
    exported = runner.invoke(main, ["export-evidence", str(capsule), "-o", str(bundle), "--key", str(private)])
    assert exported.exit_code == 0, exported.output
    assert f"signed by    {printed}" in exported.output
    verified = runner.invoke(main, ["verify", str(bundle), "--key", str(public)])
    assert verified.exit_code == 0 and verified.output.startswith("verified: ")
    unpinned = runner.invoke(main, ["verify", str(bundle)])
    assert (
        unpinned.exit_code == 3 and "self-consistent only" in unpinned.output and "no key was given" in unpinned.output
    )
    by_fingerprint = runner.invoke(main, ["verify", str(bundle), "--fingerprint", printed, "--json"])
    report = json.loads(by_fingerprint.output)
    assert by_fingerprint.exit_code == 0 and report["verdict"] == "verified" and report["ok"] is True
    assert report["capsule_id"] == capsule.name and report["problems"] == []


def test_the_cli_prints_one_line_per_problem_and_exits_1(capsule: Path, key_pair: KeyPair, tmp_path: Path) -> None:
    bundle = _export(capsule, key_pair, tmp_path / "bundle.zip")
    data = bytearray(bundle.read_bytes())
    data[-1] ^= 0xFF  # the end record's last byte
    bundle.write_bytes(bytes(data))
    result = CliRunner().invoke(main, ["verify", str(bundle), "--key", str(key_pair.public_path)])
    assert result.exit_code == 1
    assert result.output.splitlines()[0].startswith("FAIL  not a bundle zip: ")
    assert result.output.splitlines()[-1] == "failed: 1 problem(s)"


def test_the_cli_refuses_a_bad_capsule_with_one_line_per_problem(
    capsule: Path, key_pair: KeyPair, tmp_path: Path
) -> None:
    (capsule / "capture-health.json").write_text("{")
    (capsule / "model-calls.jsonl").write_text("not json\n")
    bundle = tmp_path / "bundle.zip"
    result = CliRunner().invoke(
        main, ["export-evidence", str(capsule), "-o", str(bundle), "--key", str(key_pair.private_path)]
    )
    assert result.exit_code == 1 and not bundle.exists()
    assert f"{capsule}: capture-health.json: is not valid JSON" in result.output
    assert f"{capsule}: model-calls.jsonl: 1 line(s) are not valid JSON (first: line 1)" in result.output
    # and `llmtap validate`'s own lines: both files differ from the redaction proof
    assert f"{capsule}: capture-health.json: its sha256 differs from the one in redaction-proof.json" in result.output
    assert f"{capsule}: model-calls.jsonl: its sha256 differs from the one in redaction-proof.json" in result.output
    problems = [line for line in result.output.splitlines() if line.startswith(f"{capsule}: ")]
    assert f"Error: The capsule was not exported: {len(problems)} problem(s) above." in result.output


def test_the_cli_refuses_a_capsule_that_fails_validate(capsule: Path, key_pair: KeyPair, tmp_path: Path) -> None:
    (capsule / "redaction-proof.json").unlink()  # every check of the export itself still passes
    assert capsule_export_problems(capsule) == []
    bundle = tmp_path / "bundle.zip"
    result = CliRunner().invoke(
        main, ["export-evidence", str(capsule), "-o", str(bundle), "--key", str(key_pair.private_path)]
    )
    assert result.exit_code == 1 and not bundle.exists()
    assert f"{capsule}: redaction-proof.json: missing" in result.output


def test_a_capsule_file_changed_after_the_checks_is_not_exported(
    capsule: Path, key_pair: KeyPair, tmp_path: Path
) -> None:
    def rewrite_after_the_walk(path: Path) -> list[str]:
        with open(path / "model-calls.jsonl", "ab") as handle:
            handle.write(b"{}\n")
        return []

    with pytest.raises(EvidenceError, match="changed during the export") as failed:
        _export(capsule, key_pair, tmp_path / "bundle.zip", extra_validator=rewrite_after_the_walk)
    assert "model-calls.jsonl" in str(failed.value)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["runs"]  # no bundle, no temp file
