"""Exporting a run capsule as a signed evidence bundle (a zip a third party checks offline).

The capsule is checked first (`capsule_export_problems`, plus any validator the caller plugs in,
such as the full `llmtap validate`), and a capsule with any problem is refused. Each file is then
read once, through descriptors that never follow a link, and its bytes are hashed as they are
written into the zip, so the digests describe exactly the bytes the bundle holds. The layout is in
`bundle_format`; the same capsule and key always give a byte-identical bundle (fixed member times
and modes, ed25519's deterministic signatures, and a statement time taken from the capsule).
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .. import __version__
from ..errors import LlmtapError
from .bundle_format import (
    CAPSULE_FOLDER,
    KEY_NAME,
    README_NAME,
    SIG_NAME,
    STATEMENT_NAME,
    SUMS_NAME,
    TOP_FOLDER,
    BundleLimits,
    format_sums,
    readme_text,
    zip_info,
)
from .capsule_files import CapsuleChangedError, CapsuleFile, CapsuleReader
from .dsse import canonical_json, sign_envelope, statement
from .keys import fingerprint, public_key_pem

__all__ = [
    "CapsuleRefusedError",
    "EvidenceError",
    "ExportResult",
    "capsule_export_problems",
    "export_evidence",
]

MANIFEST_NAME = "capsule.json"
MANIFEST_KIND = "llmtap.run-capsule"
ENV_LOCK_NAME = "env.lock"  # a JSON document despite its name (the store's *.capture.lock files are empty)
_CHUNK = 1 << 20

Validator = Callable[[Path], Sequence[str]]


class EvidenceError(LlmtapError):
    """Raised when an evidence bundle cannot be written."""


class CapsuleRefusedError(EvidenceError):
    """Raised when a capsule fails the checks an export requires; `problems` lists each one."""

    def __init__(self, capsule: Path, problems: Sequence[str]) -> None:
        self.capsule = capsule
        self.problems = list(problems)
        super().__init__(
            f"The capsule '{capsule}' was not exported: {len(self.problems)} problem(s) found "
            f"(first: {self.problems[0]}); fix them or export another capsule."
        )


@dataclass(frozen=True)
class ExportResult:
    """What `export_evidence` wrote."""

    bundle: Path
    run_id: str
    key_fingerprint: str
    files: int
    sha256: str
    digests: dict[str, str] = field(repr=False)


def capsule_export_problems(capsule: Path, *, limits: BundleLimits | None = None) -> list[str]:
    """The reasons `capsule` may not be exported (empty when it may): the checks the bundle itself needs.

    Every entry is a regular file or a folder (checked with lstat: no link, FIFO, socket, device
    or hard link); the manifest `capsule.json` parses, says it is a finished llmtap capsule and
    records no tampering; every line of every `.jsonl` file, every `.json` file and `env.lock` parse
    as JSON; sizes and counts fit the bundle's bounds. The full `llmtap validate` goes further and
    is plugged into `export_evidence` as `extra_validator`.
    """
    limits = limits or BundleLimits()
    try:
        with CapsuleReader(capsule) as reader:
            files, problems = reader.walk(limits)
            return problems + _content_problems(reader, files, limits)
    except OSError as exc:
        return [f"the capsule folder could not be read ({exc.strerror or exc})"]


def _content_problems(reader: CapsuleReader, files: Sequence[CapsuleFile], limits: BundleLimits) -> list[str]:
    problems: list[str] = []
    by_path = {file.path: file for file in files}
    manifest = by_path.get(MANIFEST_NAME)
    if manifest is None:
        problems.append(f"{MANIFEST_NAME}: missing, so this is not a run capsule")
    for file in files:
        try:
            if file.path.endswith(".jsonl"):
                problems.extend(_jsonl_problems(reader, file, limits.max_metadata_bytes))
            elif file.path.endswith(".json") or file.path == ENV_LOCK_NAME:
                document = orjson.loads(reader.read_all(file, limits.max_metadata_bytes))
                if file is manifest:
                    problems.extend(_manifest_problems(document))
        except orjson.JSONDecodeError:
            problems.append(f"{file.path}: is not valid JSON")
        except CapsuleChangedError as exc:
            problems.append(str(exc))
    return problems


def _manifest_problems(manifest: Any) -> list[str]:
    if not isinstance(manifest, dict):
        return [f"{MANIFEST_NAME}: does not hold a JSON object"]
    problems = []
    if manifest.get("kind") != MANIFEST_KIND:
        problems.append(f"{MANIFEST_NAME}: kind is {manifest.get('kind')!r}, not {MANIFEST_KIND!r}")
    if not isinstance(manifest.get("run_id"), str) or not manifest["run_id"]:
        problems.append(f"{MANIFEST_NAME}: has no run_id")
    if manifest.get("status") in (None, "running"):
        problems.append(f"{MANIFEST_NAME}: status is {manifest.get('status')!r}: the capture has not been finalised")
    if manifest.get("capture_tampered"):
        problems.append(
            f"{MANIFEST_NAME}: capture recorded tampering by the workload (capture_tampered); see capture-health.json"
        )
    return problems


def _jsonl_problems(reader: CapsuleReader, file: CapsuleFile, max_line: int) -> list[str]:
    """Parse every line of a JSONL file, streaming, each line bounded by `max_line` bytes."""
    bad: list[int] = []
    with reader.open(file) as fd, os.fdopen(os.dup(fd), "rb") as stream:
        number = 0
        while line := stream.readline(max_line + 1):
            number += 1
            if len(line) > max_line:
                return [f"{file.path}: line {number} is longer than {max_line} bytes"]
            try:
                orjson.loads(line)
            except orjson.JSONDecodeError:
                bad.append(number)
    if not bad:
        return []
    return [f"{file.path}: {len(bad)} line(s) are not valid JSON (first: line {bad[0]})"]


def export_evidence(
    capsule: Path,
    bundle: Path,
    key: Ed25519PrivateKey,
    *,
    extra_validator: Validator | None = None,
    limits: BundleLimits | None = None,
) -> ExportResult:
    """Write `capsule` as a signed evidence bundle at `bundle` (which must not exist yet).

    Refuses (CapsuleRefusedError) a capsule with any problem from `capsule_export_problems` or
    from `extra_validator(capsule)`. The zip is written to a temp file next to `bundle`, synced,
    and linked into place, so `bundle` is either absent or whole, and never overwritten.

        result = export_evidence(Path(".llmtap/runs/01J..."), Path("bundle.zip"), load_private_key(path))
    """
    limits = limits or BundleLimits()
    if os.path.lexists(bundle):
        raise EvidenceError(f"'{bundle}' already exists; remove it or choose another -o.")
    try:
        with CapsuleReader(capsule) as reader:
            files, problems = reader.walk(limits)
            problems += _content_problems(reader, files, limits)
            if extra_validator is not None:
                problems += list(extra_validator(capsule))
            if problems:
                raise CapsuleRefusedError(capsule, problems)
            manifest = orjson.loads(
                reader.read_all(next(f for f in files if f.path == MANIFEST_NAME), limits.max_metadata_bytes)
            )
            return _write_bundle(reader, files, manifest, bundle, key)
    except CapsuleChangedError as exc:
        raise EvidenceError(
            f"The capsule '{capsule}' changed during the export ({exc}); export it again once nothing writes to it."
        ) from None
    except FileNotFoundError:
        raise EvidenceError(f"There is no capsule folder '{capsule}'; give a capsule path or run id.") from None
    except NotADirectoryError:
        raise EvidenceError(f"'{capsule}' is not a folder; give a capsule path or run id.") from None


def _write_bundle(
    reader: CapsuleReader, files: Sequence[CapsuleFile], manifest: dict[str, Any], bundle: Path, key: Ed25519PrivateKey
) -> ExportResult:
    run_id = str(manifest["run_id"])
    key_fingerprint = fingerprint(key.public_key())
    temporary = bundle.parent / f".{bundle.name}.{os.getpid()}.tmp"
    try:
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise EvidenceError(
            f"Could not create the bundle next to '{bundle}' ({exc.strerror}); choose another -o."
        ) from None
    try:
        with os.fdopen(fd, "w+b") as raw:
            with zipfile.ZipFile(raw, "w", allowZip64=True) as archive:
                digests = _write_members(archive, reader, files, run_id, key_fingerprint)
                sums = format_sums(digests)
                archive.writestr(zip_info(f"{TOP_FOLDER}/{SUMS_NAME}", len(sums)), sums)
                signature = key.sign(sums)
                archive.writestr(zip_info(f"{TOP_FOLDER}/{SIG_NAME}", len(signature)), signature)
                pem = public_key_pem(key.public_key())
                archive.writestr(zip_info(f"{TOP_FOLDER}/{KEY_NAME}", len(pem)), pem)
                envelope = sign_envelope(_statement_bytes(digests, manifest), key)
                archive.writestr(zip_info(f"{TOP_FOLDER}/{STATEMENT_NAME}", len(envelope)), envelope)
            raw.flush()
            os.fsync(raw.fileno())
            raw.seek(0)
            bundle_digest = hashlib.file_digest(raw, "sha256").hexdigest()
        os.link(temporary, bundle)  # unlike a rename, never replaces a file that appeared meanwhile
    except CapsuleChangedError:
        raise
    except FileExistsError:
        raise EvidenceError(
            f"'{bundle}' appeared while the bundle was being written; remove it or choose another -o."
        ) from None
    except OSError as exc:
        raise EvidenceError(
            f"Could not write the bundle '{bundle}' ({exc.strerror or exc}); nothing was kept."
        ) from None
    finally:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
    return ExportResult(bundle, run_id, key_fingerprint, len(files), bundle_digest, digests)


def _write_members(
    archive: zipfile.ZipFile, reader: CapsuleReader, files: Sequence[CapsuleFile], run_id: str, key_fingerprint: str
) -> dict[str, str]:
    """Write README.txt and every capsule file into the zip; return each listed path's sha256."""
    readme = readme_text(run_id=run_id, key_fingerprint=key_fingerprint, file_count=len(files)).encode("utf-8")
    archive.writestr(zip_info(f"{TOP_FOLDER}/{README_NAME}", len(readme)), readme)
    digests = {README_NAME: hashlib.sha256(readme).hexdigest()}
    for file in files:
        name = f"{CAPSULE_FOLDER}/{file.path}"
        hasher = hashlib.sha256()
        copied = 0
        with reader.open(file) as fd, archive.open(zip_info(f"{TOP_FOLDER}/{name}", file.size), "w") as member:
            while copied < file.size and (chunk := os.read(fd, min(_CHUNK, file.size - copied))):
                hasher.update(chunk)
                member.write(chunk)
                copied += len(chunk)
        if copied != file.size:
            raise CapsuleChangedError(f"'{file.path}' shrank while it was being read")
        digests[name] = hasher.hexdigest()
    return digests


def _statement_bytes(digests: dict[str, str], manifest: dict[str, Any]) -> bytes:
    """The in-toto statement: every listed path bound to its digest, and a small llmtap predicate.

    `created_at` is when the capsule was finalised (its `ended_at`), not when the bundle was made,
    so exporting one capsule twice gives the same bytes.
    """
    subjects = sorted(digests.items(), key=lambda item: item[0].encode("utf-8"))
    predicate = {
        "llmtap_version": __version__,
        "capsule_id": manifest["run_id"],
        "capsule_status": manifest.get("status"),
        "created_at": manifest.get("ended_at") or manifest.get("started_at"),
    }
    return canonical_json(statement(subjects, predicate))
