"""Trust: secret scanning and redaction with proof (and, alongside, evidence and verification).

scan_text(text)            the credentials in a text (`secrets`, rule pack in `rules`)
redact_record_line(line)   one JSONL record, redacted in place, still valid (`redaction`)
redact_capture_dir(path)   every rollout file of a capture directory, plus its proof (`redact_files`)
redact_capsule(path)       every file of a run capsule, plus its proof
"""

from __future__ import annotations

from .proof import PROOF_NAME, ProofBuilder
from .redact_files import RedactionSummary, redact_capsule, redact_capture_dir
from .redaction import RedactionError, redact_json_text, redact_record_line, redact_stream, redact_text
from .rules import RULE_PACK_VERSION, RULES, Rule, rule_pack_digest
from .secrets import RULE_PACK_DIGEST, SCANNER_VERSION, Finding, scan_text, scan_value

__all__ = [
    "PROOF_NAME",
    "RULES",
    "RULE_PACK_DIGEST",
    "RULE_PACK_VERSION",
    "SCANNER_VERSION",
    "Finding",
    "ProofBuilder",
    "RedactionError",
    "RedactionSummary",
    "Rule",
    "redact_capsule",
    "redact_capture_dir",
    "redact_json_text",
    "redact_record_line",
    "redact_stream",
    "redact_text",
    "rule_pack_digest",
    "scan_text",
    "scan_value",
]
