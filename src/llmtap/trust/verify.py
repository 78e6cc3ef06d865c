"""Verifying an evidence bundle from the zip itself, recomputing every digest, never unpacking.

Order: the zip's structure (bounded and checked before anything is decompressed, `zip_checks`),
then SHA256SUMS and its signature, the DSSE statement and its signature, that the statement's
subjects are exactly SHA256SUMS's entries, that the members are exactly the listed files plus
the four signature files, and last every member's SHA-256, streamed. Each problem is reported
(one line each), not just the first.

The verdict: `verified` when there is no problem and the bundle's key is the one the caller
pinned (`expected_key` or `expected_fingerprint`); `self-consistent` when there is no problem but
no key was pinned, which proves only that whoever holds the embedded key signed it; `failed`
otherwise. Exit codes: 0, 3 and 1 respectively.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .bundle_format import (
    CAPSULE_FOLDER,
    KEY_NAME,
    README_NAME,
    SIG_NAME,
    SIGNATURE_BYTES,
    SIGNATURE_FILES,
    STATEMENT_NAME,
    SUMS_NAME,
    TOP_FOLDER,
    BundleLimits,
    parse_sums,
)
from .dsse import PREDICATE_TYPE, STATEMENT_TYPE, EnvelopeError, open_envelope
from .keys import KeyFileError, fingerprint, public_key_from_pem, public_key_pem
from .zip_checks import member_problems, read_end_record, tiling_problems

__all__ = ["EXIT_CODES", "Problem", "VerifyReport", "verify_bundle"]

EXIT_CODES = {"verified": 0, "failed": 1, "self-consistent": 3}
_MANIFEST = f"{CAPSULE_FOLDER}/capsule.json"
_KEY_FILE_LIMIT = 16 * 1024
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Problem:
    """One reason a bundle fails: the member it concerns (None for the whole bundle) and a sentence."""

    member: str | None
    message: str

    def __str__(self) -> str:
        return f"{self.member}: {self.message}" if self.member else self.message


@dataclass
class VerifyReport:
    """The outcome of `verify_bundle`."""

    bundle: Path
    problems: list[Problem] = field(default_factory=list)
    key_fingerprint: str | None = None
    expected_fingerprint: str | None = None
    capsule_id: str | None = None
    files: int = 0

    @property
    def pinned(self) -> bool:
        """True when the caller named a key and the bundle's key is that key."""
        return self.expected_fingerprint is not None and self.expected_fingerprint == self.key_fingerprint

    @property
    def verdict(self) -> str:
        if self.problems:
            return "failed"
        return "verified" if self.pinned else "self-consistent"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def to_json(self) -> dict[str, Any]:
        return {
            "bundle": str(self.bundle),
            "verdict": self.verdict,
            "ok": self.verdict == "verified",
            "key_fingerprint": self.key_fingerprint,
            "expected_fingerprint": self.expected_fingerprint,
            "capsule_id": self.capsule_id,
            "files": self.files,
            "problems": [{"member": problem.member, "message": problem.message} for problem in self.problems],
        }


def verify_bundle(
    bundle: Path,
    *,
    expected_key: Ed25519PublicKey | None = None,
    expected_fingerprint: str | None = None,
    limits: BundleLimits | None = None,
) -> VerifyReport:
    """Check every byte of an evidence bundle against its signatures; the report lists every problem.

    report = verify_bundle(Path("bundle.zip"), expected_key=load_public_key(Path("alice.pub.pem")))
    assert report.verdict == "verified", [str(p) for p in report.problems]
    """
    if expected_key is not None:
        expected_fingerprint = fingerprint(expected_key)
    report = VerifyReport(bundle, expected_fingerprint=expected_fingerprint.lower() if expected_fingerprint else None)
    try:
        fd = os.open(bundle, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        report.problems.append(Problem(None, f"the bundle '{bundle}' could not be opened ({exc.strerror})"))
        return report
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            report.problems.append(Problem(None, f"'{bundle}' is not a regular file"))
            return report
        _verify_zip(handle, info.st_size, report, limits or BundleLimits())
    return report


def _verify_zip(handle: BinaryIO, size: int, report: VerifyReport, limits: BundleLimits) -> None:
    try:
        end = read_end_record(handle, size)
    except ValueError as exc:
        report.problems.append(Problem(None, f"not a bundle zip: {exc}"))
        return
    if end.entries > limits.max_members:
        report.problems.append(
            Problem(None, f"the zip declares {end.entries} members, more than a bundle may hold ({limits.max_members})")
        )
        return
    if end.directory_size > limits.max_central_directory_bytes:
        report.problems.append(
            Problem(
                None,
                f"the zip's central directory is {end.directory_size} bytes, "
                f"more than {limits.max_central_directory_bytes}",
            )
        )
        return
    handle.seek(0)
    try:
        archive = zipfile.ZipFile(handle)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        report.problems.append(Problem(None, f"not a readable zip ({exc})"))
        return
    with archive:
        infos = archive.infolist()
        structural = member_problems(infos, limits) or tiling_problems(handle, infos, end)
        if structural:  # fail fast: nothing is decompressed from a zip of the wrong shape
            report.problems.extend(Problem(member, message) for member, message in structural)
            return
        _verify_members(archive, report, limits)


def _verify_members(archive: zipfile.ZipFile, report: VerifyReport, limits: BundleLimits) -> None:
    prefix = f"{TOP_FOLDER}/"
    members: dict[str, zipfile.ZipInfo] = {}
    for info in archive.infolist():
        if not info.filename.startswith(prefix):
            report.problems.append(Problem(info.filename, f"lies outside the bundle's folder '{TOP_FOLDER}/'"))
        else:
            members[info.filename[len(prefix) :]] = info
    for name in SIGNATURE_FILES:
        if name not in members:
            report.problems.append(Problem(prefix + name, "is missing"))
    if any(name not in members for name in SIGNATURE_FILES):
        return
    sums_bytes = _read_whole(archive, members[SUMS_NAME], limits.max_metadata_bytes, report)
    key = _bundle_key(archive, members[KEY_NAME], report)
    sums, sums_problems = parse_sums(sums_bytes) if sums_bytes is not None else ({}, [])
    report.problems.extend(Problem(prefix + SUMS_NAME, message) for message in sums_problems)
    if key is not None and sums_bytes is not None:
        _check_sums_signature(archive, members[SIG_NAME], sums_bytes, key, report)
        _check_statement(archive, members[STATEMENT_NAME], sums, key, report, limits)
    for required in (README_NAME, _MANIFEST):
        if sums_bytes is not None and required not in sums:
            report.problems.append(Problem(prefix + SUMS_NAME, f"does not list {required}"))
    listed = set(sums)
    present = set(members) - set(SIGNATURE_FILES)
    for name in sorted(present - listed):
        report.problems.append(Problem(prefix + name, "is in the zip but not listed in SHA256SUMS (added)"))
    for name in sorted(listed - present):
        report.problems.append(Problem(prefix + name, "is listed in SHA256SUMS but not in the zip (missing)"))
    for name in sorted(listed & present, key=lambda item: item.encode("utf-8")):
        digest = _member_digest(archive, members[name], report)
        if digest is not None and digest != sums[name]:
            report.problems.append(Problem(prefix + name, "its SHA-256 differs from SHA256SUMS (the file was changed)"))
    report.files = sum(1 for name in listed if name.startswith(f"{CAPSULE_FOLDER}/"))
    if _MANIFEST in listed & present and report.capsule_id is not None:
        _check_capsule_id(archive, members[_MANIFEST], report, limits)


def _read_whole(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, report: VerifyReport) -> bytes | None:
    """A small member's bytes, at most `limit` (its declared size was already bounded); None on failure."""
    if info.file_size > limit:
        report.problems.append(
            Problem(info.filename, f"is {info.file_size} bytes, more than {limit} that may be read whole")
        )
        return None
    try:
        with archive.open(info) as member:
            data = member.read(limit + 1)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        report.problems.append(Problem(info.filename, f"could not be read from the zip ({exc})"))
        return None
    if len(data) > limit:
        report.problems.append(Problem(info.filename, f"holds more than {limit} bytes"))
        return None
    return data


def _member_digest(archive: zipfile.ZipFile, info: zipfile.ZipInfo, report: VerifyReport) -> str | None:
    """The SHA-256 of a member, streamed in chunks (its size bounded by its declared size); None when unreadable."""
    hasher = hashlib.sha256()
    try:
        with archive.open(info) as member:
            while chunk := member.read(_CHUNK):
                hasher.update(chunk)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        report.problems.append(Problem(info.filename, f"could not be read from the zip ({exc})"))
        return None
    return hasher.hexdigest()


def _bundle_key(archive: zipfile.ZipFile, info: zipfile.ZipInfo, report: VerifyReport) -> Ed25519PublicKey | None:
    data = _read_whole(archive, info, _KEY_FILE_LIMIT, report)
    if data is None:
        return None
    try:
        key = public_key_from_pem(data, source=info.filename)
    except KeyFileError as exc:
        report.problems.append(Problem(info.filename, str(exc)))
        return None
    if public_key_pem(key) != data:
        report.problems.append(Problem(info.filename, "is not in the exact PEM form llmtap writes (it was edited)"))
        return None
    report.key_fingerprint = fingerprint(key)
    if report.expected_fingerprint is not None and report.expected_fingerprint != report.key_fingerprint:
        report.problems.append(
            Problem(
                info.filename,
                f"the bundle is signed by key {report.key_fingerprint}, "
                f"not by the key given ({report.expected_fingerprint})",
            )
        )
    return key


def _check_sums_signature(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, sums: bytes, key: Ed25519PublicKey, report: VerifyReport
) -> None:
    signature = _read_whole(archive, info, SIGNATURE_BYTES, report)
    if signature is None:
        return
    if len(signature) != SIGNATURE_BYTES:
        report.problems.append(
            Problem(info.filename, f"is {len(signature)} bytes, not a {SIGNATURE_BYTES}-byte ed25519 signature")
        )
        return
    try:
        key.verify(signature, sums)
    except InvalidSignature:
        report.problems.append(
            Problem(info.filename, "does not verify: SHA256SUMS was not signed by the bundle's key as it is")
        )


def _check_statement(
    archive: zipfile.ZipFile,
    info: zipfile.ZipInfo,
    sums: dict[str, str],
    key: Ed25519PublicKey,
    report: VerifyReport,
    limits: BundleLimits,
) -> None:
    data = _read_whole(archive, info, limits.max_metadata_bytes, report)
    if data is None:
        return
    try:
        document = json.loads(open_envelope(data, key))
    except EnvelopeError as exc:
        report.problems.append(Problem(info.filename, str(exc)))
        return
    except ValueError:
        report.problems.append(Problem(info.filename, "the signed payload is not JSON"))
        return
    if not isinstance(document, dict) or document.get("_type") != STATEMENT_TYPE:
        report.problems.append(
            Problem(info.filename, f"the signed payload is not an in-toto Statement ({STATEMENT_TYPE})")
        )
        return
    if document.get("predicateType") != PREDICATE_TYPE:
        report.problems.append(Problem(info.filename, f"the statement's predicateType is not {PREDICATE_TYPE}"))
    predicate = document.get("predicate")
    if isinstance(predicate, dict) and isinstance(predicate.get("capsule_id"), str):
        report.capsule_id = predicate["capsule_id"]
    else:
        report.problems.append(Problem(info.filename, "the statement's predicate names no capsule_id"))
    subjects: dict[str, str] = {}
    for subject in document.get("subject") or []:
        name = subject.get("name") if isinstance(subject, dict) else None
        digest = subject.get("digest") if isinstance(subject, dict) else None
        if not isinstance(name, str) or not isinstance(digest, dict) or set(digest) != {"sha256"} or name in subjects:
            report.problems.append(
                Problem(info.filename, f"the statement has a malformed or repeated subject ({name!r})")
            )
            continue
        subjects[name] = digest["sha256"]
    if subjects != sums:
        changed = sorted(set(subjects) ^ set(sums)) or sorted(name for name in sums if subjects.get(name) != sums[name])
        report.problems.append(
            Problem(info.filename, f"the statement's subjects differ from SHA256SUMS (first: {changed[0]!r})")
        )


def _check_capsule_id(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, report: VerifyReport, limits: BundleLimits
) -> None:
    data = _read_whole(archive, info, limits.max_metadata_bytes, report)
    try:
        run_id = json.loads(data or b"null").get("run_id")
    except (ValueError, AttributeError):
        run_id = None
    if run_id != report.capsule_id:
        report.problems.append(
            Problem(info.filename, f"its run_id {run_id!r} is not the statement's capsule_id {report.capsule_id!r}")
        )
