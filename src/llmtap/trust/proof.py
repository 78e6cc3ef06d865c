"""`redaction-proof.json`: what the scanner found and where, without a single secret in it.

Each finding names its file, line, location (JSON pointers, stream event numbers) or byte offset,
length and rule, and `hmac_sha256(salt, secret)`. The salt is random per proof and never kept,
only its SHA-256: two findings of one proof with the same HMAC are the same secret, but nobody
holding the proof can confirm a guessed key against it. Each file's SHA-256 after redaction lets
`validate` recompute and compare. `stream_tampered` says whether capsule finalisation found a
managed file or folder replaced by the workload (`tampered_entries` lists them).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from typing import Any

from .redaction import FindingSink
from .rules import RULES
from .secrets import RULE_PACK_DIGEST, RULE_PACK_VERSION, SCANNER_VERSION

__all__ = ["PROOF_NAME", "PROOF_SCHEMA_VERSION", "ProofBuilder"]

PROOF_NAME = "redaction-proof.json"
PROOF_SCHEMA_VERSION = 1


class ProofBuilder:
    """Collects findings and file digests for one redaction run, then renders the proof once.

    The salt lives only in this object and is dropped by `render()`; findings reported after
    that raise, so no finding can be hashed with a salt that is no longer secret.
    """

    def __init__(self) -> None:
        self._salt: bytes | None = secrets.token_bytes(32)
        self.salt_sha256 = hashlib.sha256(self._salt).hexdigest()
        self.findings: list[dict[str, Any]] = []
        self.files: dict[str, dict[str, Any]] = {}
        self.notes: list[dict[str, Any]] = []
        self.tampered_entries: list[dict[str, Any]] = []  # what capsule finalisation found tampered with

    def sink(self, file: str, line: int | None = None) -> FindingSink:
        """Return the sink that records findings of `file` (at 1-based `line`, for line files)."""

        def record(rule_id: str, secret: str, where: list[str], offset: int, length: int) -> None:
            if self._salt is None:
                raise RuntimeError("the proof was already rendered; its salt is gone")
            entry: dict[str, Any] = {"file": file, "line": line, "rule_id": rule_id}
            if where:
                entry["location"] = list(where)
            entry["offset"] = offset
            entry["length"] = length
            if secret:
                entry["hmac_sha256"] = hmac.new(
                    self._salt, secret.encode("utf-8", "surrogateescape"), "sha256"
                ).hexdigest()
            else:  # a stream the dialect still read a secret from: replaced whole, nothing to hash
                entry["stream_replaced"] = True
            self.findings.append(entry)

        return record

    def add_file(self, file: str, content: bytes, *, changed: bool) -> None:
        """Record a scanned file's digest and size after redaction."""
        self.files[file] = {
            "sha256": hashlib.sha256(content).hexdigest(),
            "size": len(content),
            "redacted": changed,
        }

    def render(self, *, previous_proof_sha256: str | None = None) -> dict[str, Any]:
        """Return the proof as a JSON-ready dict and forget the salt."""
        self._salt = None
        by_rule: dict[str, int] = {}
        for finding in self.findings:
            by_rule[finding["rule_id"]] = by_rule.get(finding["rule_id"], 0) + 1
        proof: dict[str, Any] = {
            "schema_version": PROOF_SCHEMA_VERSION,
            "created_at": time.time(),
            "scanner": {"name": "llmtap.trust.secrets", "version": SCANNER_VERSION},
            "rule_pack": {"version": RULE_PACK_VERSION, "digest": RULE_PACK_DIGEST, "rules": len(RULES)},
            "salt_sha256": self.salt_sha256,
            "findings_count": len(self.findings),
            "findings_by_rule": dict(sorted(by_rule.items())),
            "findings": self.findings,
            "files": dict(sorted(self.files.items())),
            "stream_tampered": bool(self.tampered_entries),
        }
        if self.tampered_entries:
            proof["tampered_entries"] = self.tampered_entries
        if previous_proof_sha256 is not None:
            proof["previous_proof_sha256"] = previous_proof_sha256
        if self.notes:
            proof["notes"] = self.notes
        return proof
