"""`llmtap validate PATH`: whether a run capsule or a capture directory can be shared as it is.

Each check reports problems as one line each, never a secret:

- **Files**: every entry is a regular file with one name or a folder (walked with lstat
  semantics through folder descriptors, never following a link: `capsule_files`).
- **Formats**: every line of every `.jsonl` file parses as a JSON object and ends with a newline;
  capture lines are capture records of a schema version this llmtap reads; every JSON document
  parses and carries the schema version this llmtap writes.
- **Proof**: `redaction-proof.json` exists, every file it lists has the digest it records, and
  every file that may hold captured text is listed.
- **Secrets**: a re-scan of every file (with the current rule pack) finds no live secret.
- **Tampering**: none recorded (`capture_tampered`, `tampered_entries`, `stream_tampered`), and
  the capsule is finalised.
- **Counts**: capsule.json's call and rollout counts equal the records on disk.

`validation_problems` is the plug for `export_evidence(..., extra_validator=...)`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..export.genai import RECORD_SCHEMA_VERSION
from ..records import SCHEMA_VERSION as CAPTURE_SCHEMA_VERSION
from ..records import ModelCallRecord
from ..store.layout import DATA_SUFFIX, LATE_SUFFIX
from .bundle_format import BundleLimits
from .capsule_files import CapsuleChangedError, CapsuleFile, CapsuleReader
from .proof import PROOF_NAME, PROOF_SCHEMA_VERSION, ProofBuilder
from .redact_files import CAPSULE_FILES, MAX_FILE_BYTES, redact_file_bytes

__all__ = ["ValidationReport", "validate_path", "validation_problems"]

MANIFEST_NAME = "capsule.json"
HEALTH_NAME = "capture-health.json"
MODEL_CALLS_NAME = "model-calls.jsonl"
_ROLLOUT_SUFFIXES = (DATA_SUFFIX, LATE_SUFFIX)
# The schema version each JSON document must carry (the versions this llmtap writes).
_DOCUMENT_VERSIONS = {MANIFEST_NAME: 1, HEALTH_NAME: 1, "env.lock": 1, PROOF_NAME: PROOF_SCHEMA_VERSION}
_LIMITS = BundleLimits(max_member_bytes=MAX_FILE_BYTES)


@dataclass
class ValidationReport:
    """What `validate_path` found: `ok` when `problems` is empty."""

    path: Path
    kind: str  # "capsule", "capture-dir" or "unknown"
    files: int = 0
    run_id: str | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "kind": self.kind,
            "ok": self.ok,
            "run_id": self.run_id,
            "files": self.files,
            "problems": list(self.problems),
        }


@dataclass
class _Seen:
    """What the file checks learned, for the checks across files."""

    digests: dict[str, str] = field(default_factory=dict)
    documents: dict[str, Any] = field(default_factory=dict)
    records: dict[str, int] = field(default_factory=dict)  # rollout file -> capture records in it
    model_call_lines: int | None = None


def validation_problems(path: Path) -> list[str]:
    """The problems `llmtap validate` finds in `path` (empty when it is valid): `extra_validator`'s shape."""
    return validate_path(path).problems


def validate_path(path: str | Path) -> ValidationReport:
    """Check a run capsule or a capture directory; never raises for what it finds.

    report = validate_path(".llmtap/runs/01J...")
    for problem in report.problems:
        print(problem)
    """
    root = Path(path)
    report = ValidationReport(root, "unknown")
    try:
        with CapsuleReader(root) as reader:
            files, walk_problems = reader.walk(_LIMITS)
            report.problems.extend(walk_problems)
            report.files = len(files)
            names = {file.path for file in files}
            if MANIFEST_NAME in names:
                report.kind = "capsule"
            elif any(name.endswith(_ROLLOUT_SUFFIXES) and "/" not in name for name in names):
                report.kind = "capture-dir"
            else:
                report.problems.append(
                    "holds neither capsule.json nor any *.capture.jsonl: not a capsule or capture directory"
                )
                return report
            seen = _Seen()
            for file in files:
                report.problems.extend(_file_problems(reader, file, report.kind, seen))
    except OSError as exc:
        report.problems.append(f"could not be read as a folder ({exc.strerror or exc})")
        return report
    report.problems.extend(_proof_problems(files, report.kind, seen))
    if report.kind == "capsule":
        manifest = seen.documents.get(MANIFEST_NAME)
        if isinstance(manifest, dict):
            report.run_id = manifest.get("run_id") if isinstance(manifest.get("run_id"), str) else None
            report.problems.extend(_manifest_problems(manifest, seen.documents.get(HEALTH_NAME), seen))
    return report


def _is_rollout_file(name: str, kind: str) -> bool:
    folder, _, base = name.rpartition("/")
    return base.endswith(_ROLLOUT_SUFFIXES) and folder == ("calls" if kind == "capsule" else "")


def _needs_proof(name: str, kind: str) -> bool:
    """Files that can hold captured text, and so must be listed in the proof."""
    return _is_rollout_file(name, kind) or (kind == "capsule" and name in CAPSULE_FILES)


def _scan_kind(name: str) -> str:
    if name.endswith(".jsonl"):
        return "jsonl"
    if name.endswith(".json") or name == "env.lock":
        return "json"
    return "text"


def _file_problems(reader: CapsuleReader, file: CapsuleFile, kind: str, seen: _Seen) -> list[str]:
    name = file.path
    try:
        data = reader.read_all(file, MAX_FILE_BYTES)
    except CapsuleChangedError as exc:
        return [str(exc)]
    seen.digests[name] = hashlib.sha256(data).hexdigest()
    problems: list[str] = []
    scan_kind = _scan_kind(name)
    if scan_kind == "jsonl":
        problems.extend(_jsonl_problems(name, data, kind, seen))
    elif scan_kind == "json":
        problems.extend(_document_problems(name, data, seen))
    if name != PROOF_NAME and data:
        proof = ProofBuilder()
        redact_file_bytes(data, scan_kind, proof, name)
        if proof.findings:
            rules = sorted({finding["rule_id"] for finding in proof.findings})
            problems.append(
                f"{name}: a re-scan finds {len(proof.findings)} live secret(s) ({', '.join(rules)}); run `llmtap redact`"
            )
    return problems


def _jsonl_problems(name: str, data: bytes, kind: str, seen: _Seen) -> list[str]:
    problems: list[str] = []
    rollout = _is_rollout_file(name, kind)
    segments = data.split(b"\n")
    if segments[-1].strip():
        problems.append(f"{name}: the last line has no newline (a torn write)")
    bad: list[int] = []
    versions: list[int] = []
    records = 0
    lines = 0
    for number, segment in enumerate(segments[:-1] if not segments[-1].strip() else segments, start=1):
        if not segment.strip():
            continue
        lines += 1
        try:
            value = orjson.loads(segment)
        except orjson.JSONDecodeError:
            bad.append(number)
            continue
        if not isinstance(value, dict):
            bad.append(number)
            continue
        version = value.get("schema_version")
        if rollout:
            if version is not None and (not isinstance(version, int) or not 0 <= version <= CAPTURE_SCHEMA_VERSION):
                versions.append(number)
            try:
                ModelCallRecord.from_raw_line(value, records)
            except ValueError:
                bad.append(number)
                continue
            records += 1
        elif name == MODEL_CALLS_NAME and version != RECORD_SCHEMA_VERSION:
            versions.append(number)
    if bad:
        problems.append(f"{name}: {len(bad)} line(s) do not parse as records (first: line {bad[0]})")
    if versions:
        problems.append(
            f"{name}: {len(versions)} line(s) carry a schema version this llmtap does not read (first: line {versions[0]})"
        )
    if rollout and name.endswith(DATA_SUFFIX):
        seen.records[name] = records
    if name == MODEL_CALLS_NAME:
        seen.model_call_lines = lines
    return problems


def _document_problems(name: str, data: bytes, seen: _Seen) -> list[str]:
    if not data and not name.endswith(".json"):
        return []
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError:
        return [f"{name}: is not valid JSON"]
    seen.documents[name] = document
    wanted = _DOCUMENT_VERSIONS.get(name)
    if wanted is None:
        return []
    version = document.get("schema_version") if isinstance(document, dict) else None
    if version != wanted:
        return [f"{name}: schema_version is {version!r}, this llmtap reads {wanted}"]
    return []


def _proof_problems(files: list[CapsuleFile], kind: str, seen: _Seen) -> list[str]:
    proof = seen.documents.get(PROOF_NAME)
    if PROOF_NAME not in seen.digests:
        return [f"{PROOF_NAME}: missing, so nothing shows the files were redacted; run `llmtap redact`"]
    if not isinstance(proof, dict) or not isinstance(proof.get("files"), dict):
        return [f"{PROOF_NAME}: does not list the redacted files"]
    problems: list[str] = []
    listed: dict[str, Any] = proof["files"]
    for name, entry in sorted(listed.items()):
        digest = entry.get("sha256") if isinstance(entry, Mapping) else None
        if name not in seen.digests:
            problems.append(f"{name}: listed in {PROOF_NAME} but missing")
        elif digest != seen.digests[name]:
            problems.append(f"{name}: its sha256 differs from the one in {PROOF_NAME} (changed after redaction)")
    for file in files:
        if _needs_proof(file.path, kind) and file.path not in listed:
            problems.append(f"{file.path}: not covered by {PROOF_NAME} (added after redaction)")
    if proof.get("stream_tampered"):
        problems.append(f"{PROOF_NAME}: stream_tampered: finalisation found capsule files replaced by the workload")
    return problems


def _manifest_problems(manifest: dict[str, Any], health: Any, seen: _Seen) -> list[str]:
    problems: list[str] = []
    if manifest.get("kind") != "llmtap.run-capsule":
        problems.append(f"{MANIFEST_NAME}: kind is {manifest.get('kind')!r}, not an llmtap run capsule")
    if manifest.get("status") in (None, "running"):
        problems.append(f"{MANIFEST_NAME}: status is {manifest.get('status')!r}: the capture was never finalised")
    tampered = manifest.get("capture_tampered")
    if tampered:
        paths = ", ".join(str(entry.get("path")) for entry in tampered if isinstance(entry, Mapping))
        problems.append(f"{MANIFEST_NAME}: capture_tampered: the workload replaced {paths}")
    if isinstance(health, dict) and health.get("tampered_entries"):
        problems.append(f"{HEALTH_NAME}: tampered_entries is not empty")
    counts: dict[str, Any] = manifest["counts"] if isinstance(manifest.get("counts"), dict) else {}
    rollouts: dict[str, Any] = manifest["rollouts"] if isinstance(manifest.get("rollouts"), dict) else {}
    on_disk = sum(seen.records.values())
    if counts.get("model_calls") != on_disk:
        problems.append(
            f"{MANIFEST_NAME}: counts.model_calls is {counts.get('model_calls')!r}, the capture files hold {on_disk}"
        )
    if seen.model_call_lines is not None and seen.model_call_lines != on_disk:
        problems.append(
            f"{MODEL_CALLS_NAME}: holds {seen.model_call_lines} line(s), the capture files hold {on_disk} record(s)"
        )
    if counts.get("rollouts") != len(rollouts):
        problems.append(f"{MANIFEST_NAME}: counts.rollouts is {counts.get('rollouts')!r}, it lists {len(rollouts)}")
    for rollout_id, entry in sorted(rollouts.items()):
        file = f"calls/{rollout_id}{DATA_SUFFIX}"
        found = seen.records.get(file, 0)
        if not isinstance(entry, Mapping) or entry.get("calls") != found:
            claimed = entry.get("calls") if isinstance(entry, Mapping) else None
            problems.append(f"{MANIFEST_NAME}: rollout {rollout_id!r} claims {claimed!r} call(s), {file} holds {found}")
    for file in sorted(seen.records):
        if file.endswith(DATA_SUFFIX) and file[len("calls/") : -len(DATA_SUFFIX)] not in rollouts:
            problems.append(f"{file}: holds records of a rollout capsule.json does not list")
    return problems
