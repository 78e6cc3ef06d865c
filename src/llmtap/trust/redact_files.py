"""Redacting files on disk: a capture directory (`llmtap redact DIR`) or a run capsule.

Every file is read without following a link or blocking on a FIFO, and refused unless it is a
regular file with one link; all are checked before any is changed, so a refused directory is
left exactly as it was. A file that held a secret is replaced whole by an atomic rename (rollout
files under the store's own lock, so no append lands in between), and the proof is written last,
at the directory's root. A run that finds nothing changes no byte, not even the proof's.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from llmtap.capsule.writer import write_file_atomic
from llmtap.store import CaptureStore
from llmtap.store.durable import replace_atomically
from llmtap.store.layout import DATA_SUFFIX, LATE_SUFFIX
from llmtap.store.rollout_files import DESCRIPTORS
from llmtap.store.tool_calls import TOOL_CALLS_SUFFIX

from .proof import PROOF_NAME, ProofBuilder
from .redaction import RedactionError, redact_json_text, redact_record_line, redact_text

__all__ = [
    "CAPSULE_FILES",
    "MAX_FILE_BYTES",
    "RedactionSummary",
    "redact_capsule",
    "redact_capture_dir",
    "redact_file_bytes",
]

MAX_FILE_BYTES = 4 << 30  # a larger file is refused rather than read into memory

MANIFEST_NAME = "capsule.json"
_JSON_DOCUMENTS = (MANIFEST_NAME, "env.lock", "capture-health.json", "url_registry.json")
CAPSULE_FILES = ("model-calls.jsonl", "tool-calls.jsonl", "network_events.jsonl", "outputs/stdout.txt", "outputs/stderr.txt", *_JSON_DOCUMENTS)


class RedactionSummary(dict[str, Any]):
    """The rendered proof (a dict), plus `changed_files`: the files this run rewrote.

    `manifest` holds the redacted manifest bytes when `redact_capsule` was given one, else None.
    """

    changed_files: list[str]
    manifest: bytes | None = None


def _open_regular(path: Path, *, max_bytes: int) -> tuple[int, os.stat_result]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise RedactionError(
            f"Could not open '{path}' for redaction ({exc.strerror}); it must be a regular file, not a link."
        ) from exc
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = "it is not a regular file"
    elif info.st_nlink != 1:
        problem = f"it has {info.st_nlink} hard links (one may point outside the directory)"
    elif info.st_size > max_bytes:
        problem = f"it holds {info.st_size} bytes, more than the {max_bytes} allowed"
    if problem is not None:
        os.close(fd)
        raise RedactionError(f"Refusing to redact '{path}': {problem}; remove or replace it and run again.")
    return fd, info


def _read_regular(path: Path, *, max_bytes: int | None = None) -> tuple[bytes, os.stat_result]:
    fd, info = _open_regular(path, max_bytes=MAX_FILE_BYTES if max_bytes is None else max_bytes)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks), info
    finally:
        os.close(fd)


def _check_directory(path: Path) -> None:
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise RedactionError(f"Refusing to redact under '{path}': it is not a directory (a link is never followed).")


def redact_file_bytes(data: bytes, kind: str, proof: ProofBuilder, name: str) -> bytes:
    """Return `data` redacted as a file of `kind` (`jsonl`, `json` or `text`), findings into `proof`."""
    if kind == "json":
        text = data.decode("utf-8", "surrogateescape")
        try:
            orjson.loads(data)
        except orjson.JSONDecodeError:
            return _redact_lines(data, proof, name, json_lines=False)
        new = redact_json_text(text, proof.sink(name))
        return data if new == text else new.encode("utf-8", "surrogateescape")
    return _redact_lines(data, proof, name, json_lines=kind == "jsonl")


def _redact_lines(data: bytes, proof: ProofBuilder, name: str, *, json_lines: bool) -> bytes:
    """Redact line by line; a torn last segment (no newline) is redacted as text and stays unterminated.

    A text file (not JSON lines) is scanned whole, so a secret that spans lines (a PEM block in a
    log) is found; each finding still names its line and its offset within that line.
    """
    if not json_lines:
        return _redact_text_file(data, proof, name)
    out: list[bytes] = []
    changed = False
    for number, segment in enumerate(data.split(b"\n"), start=1):
        new = redact_record_line(segment, proof.sink(name, number))
        changed = changed or new is not segment
        out.append(new)
    return b"\n".join(out) if changed else data


def _redact_text_file(data: bytes, proof: ProofBuilder, name: str) -> bytes:
    text = data.decode("utf-8", "surrogateescape")

    def sink(rule_id: str, secret: str, where: list[str], offset: int, length: int) -> None:
        line_start = data.rfind(b"\n", 0, offset) + 1  # offsets are UTF-8 bytes, as `data` is
        proof.sink(name, data.count(b"\n", 0, offset) + 1)(rule_id, secret, where, offset - line_start, length)

    redacted = redact_text(text, sink)
    return data if redacted == text else redacted.encode("utf-8", "surrogateescape")


def _kind(name: str) -> str:
    if name.endswith(".jsonl"):
        return "jsonl"
    if name.endswith(_JSON_DOCUMENTS) or name.endswith(".json"):
        return "json"
    return "text"


def _rollout_files(store: CaptureStore) -> list[tuple[str, Path]]:
    found = []
    for rollout_id in store.rollouts():
        for suffix in (DATA_SUFFIX, LATE_SUFFIX, TOOL_CALLS_SUFFIX):
            path = store.root / f"{rollout_id}{suffix}"
            if os.path.lexists(path):
                found.append((rollout_id, path))
    return found


def _redact_rollout_file(store: CaptureStore, rollout_id: str, path: Path, proof: ProofBuilder, name: str) -> bool:
    """Rewrite one rollout file under the rollout's flock; True when it changed."""
    lock_fd = store._lock(rollout_id)  # the store's own writer lock: no append lands mid-rewrite
    try:
        data, info = _read_regular(path)
        new = redact_file_bytes(data, "jsonl", proof, name)
        proof.add_file(name, new, changed=new is not data)
        if new is data:
            return False
        now = os.lstat(path)
        if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
            raise RedactionError(f"'{path}' was replaced while it was being redacted; run again.")
        with replace_atomically(path, "redact") as writer:
            writer.write(new)
        return True
    finally:
        fcntl.flock(lock_fd, fcntl.LOCK_UN)
        DESCRIPTORS.close(lock_fd)


def _previous_proof(root: Path) -> tuple[str | None, dict[str, Any] | None]:
    path = root / PROOF_NAME
    if not os.path.lexists(path):
        return None, None
    data, _ = _read_regular(path, max_bytes=256 << 20)
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        parsed = None
    return hashlib.sha256(data).hexdigest(), parsed if isinstance(parsed, dict) else None


def _finish(
    root: Path,
    proof: ProofBuilder,
    changed: list[str],
    previous_proof: tuple[str | None, dict[str, Any] | None],
    *,
    atomic_writer: str,
    sync: bool = True,
) -> RedactionSummary:
    """Write the proof unless nothing changed and the last proof already covers these exact files."""
    previous_digest, previous = previous_proof
    rendered = proof.render(previous_proof_sha256=previous_digest)
    unchanged = (
        not changed
        and previous is not None
        and {name: entry.get("sha256") for name, entry in previous.get("files", {}).items()}
        == {name: entry["sha256"] for name, entry in rendered["files"].items()}
    )
    if not unchanged:
        content = orjson.dumps(rendered, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
        if atomic_writer == "store":
            with replace_atomically(root / PROOF_NAME, "redact") as writer:
                writer.write(content)
        else:
            write_file_atomic(root / PROOF_NAME, content, sync=sync)
    summary = RedactionSummary(rendered)
    summary.changed_files = changed
    return summary


def redact_capture_dir(path: str | os.PathLike[str]) -> RedactionSummary:
    """Redact every rollout file of a capture directory and write `redaction-proof.json` at its root.

    Raises RedactionError, changing nothing, when any rollout file is a link, a special file or
    hard-linked. Idempotent: a second run finds nothing and changes no byte.

        summary = redact_capture_dir("/data/model-calls")
        print(summary["findings_count"], summary.changed_files)
    """
    root = Path(os.path.abspath(os.fspath(path)))
    _check_directory(root)
    store = CaptureStore(root, create=False, sync_process=False)
    try:
        files = _rollout_files(store)
        for _, file_path in files:
            os.close(_open_regular(file_path, max_bytes=MAX_FILE_BYTES)[0])
        previous = _previous_proof(root)  # a linked or special proof is refused before anything changes
        proof = ProofBuilder()
        changed: list[str] = []
        for rollout_id, file_path in files:
            if _redact_rollout_file(store, rollout_id, file_path, proof, file_path.name):
                changed.append(file_path.name)
        return _finish(root, proof, changed, previous, atomic_writer="store")
    finally:
        store.close()


def redact_capsule(
    path: str | os.PathLike[str],
    *,
    manifest: bytes | None = None,
    tampered_entries: Sequence[Mapping[str, Any]] = (),
    sync: bool = True,
) -> RedactionSummary:
    """Redact every file of a run capsule and write its `redaction-proof.json`.

    Covers calls/*.capture.jsonl and *.tool-calls.jsonl (under the store's lock), model-calls.jsonl,
    tool-calls.jsonl, network_events.jsonl,
    outputs/stdout.txt and stderr.txt, env.lock, capsule.json, capture-health.json and
    url_registry.json; missing ones are skipped. Refuses (RedactionError, nothing changed) links,
    special files and hard-linked files.

    Finalisation passes the manifest it is about to write as `manifest` (bytes): it is redacted in
    memory, its digest goes into the proof, and the redacted bytes come back as
    `summary.manifest`, for the caller to write last; capsule.json on disk is then left alone.
    `tampered_entries` are what finalisation found tampered with (the proof's `stream_tampered`);
    `sync=False` leaves the fsyncs of the plain files and the proof to the caller.
    """
    root = Path(os.path.abspath(os.fspath(path)))
    _check_directory(root)
    calls = root / "calls"
    names = [name for name in CAPSULE_FILES if not (manifest is not None and name == MANIFEST_NAME)]
    others = [name for name in names if os.path.lexists(root / name)]
    if os.path.lexists(root / "outputs"):
        _check_directory(root / "outputs")
    store = None
    if os.path.lexists(calls):
        _check_directory(calls)
        store = CaptureStore(calls, create=False, sync_process=False)
    try:
        rollout_files = _rollout_files(store) if store is not None else []
        for file_path in [p for _, p in rollout_files] + [root / name for name in others]:
            os.close(_open_regular(file_path, max_bytes=MAX_FILE_BYTES)[0])
        previous = _previous_proof(root)
        proof = ProofBuilder()
        proof.tampered_entries = [dict(entry) for entry in tampered_entries]
        changed: list[str] = []
        for rollout_id, file_path in rollout_files:
            name = f"calls/{file_path.name}"
            if store is not None and _redact_rollout_file(store, rollout_id, file_path, proof, name):
                changed.append(name)
        for name in others:
            changed.extend(_redact_plain_file(root, name, proof, sync=sync))
        redacted_manifest = None
        if manifest is not None:
            redacted_manifest = redact_file_bytes(manifest, "json", proof, MANIFEST_NAME)
            proof.add_file(MANIFEST_NAME, redacted_manifest, changed=redacted_manifest is not manifest)
            if redacted_manifest is not manifest:
                changed.append(MANIFEST_NAME)
        summary = _finish(root, proof, changed, previous, atomic_writer="capsule", sync=sync)
        summary.manifest = redacted_manifest
        return summary
    finally:
        if store is not None:
            store.close()


def _redact_plain_file(root: Path, name: str, proof: ProofBuilder, *, sync: bool = True) -> Iterable[str]:
    file_path = root / name
    data, info = _read_regular(file_path)
    new = redact_file_bytes(data, _kind(name), proof, name)
    proof.add_file(name, new, changed=new is not data)
    if new is data:
        return []
    now = os.lstat(file_path)
    if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
        raise RedactionError(f"'{file_path}' was replaced while it was being redacted; run again.")
    write_file_atomic(file_path, new, sync=sync)
    return [name]
