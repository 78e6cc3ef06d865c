"""Trust: what makes a capsule worth sharing without trusting the person who shares it.

scan_text(text)            the credentials in a text (`secrets`, rule pack in `rules`)
redact_record_line(line)   one JSONL record, redacted in place, still valid (`redaction`)
redact_capture_dir(path)   every rollout file of a capture directory, plus its proof (`redact_files`)
redact_capsule(path)       every file of a run capsule, plus its proof
validate_path(path)        `llmtap validate`: proof digests, a re-scan, tampering, counts (`validate`)
keys, evidence, verify     ed25519 keys, signed evidence bundles, offline verification

The names below load on first use: `llmtap verify` never loads the scanner, nor redaction the
signing code.
"""

from __future__ import annotations

from llmtap._lazy import lazy_exports

_EXPORTS = {
    "PROOF_NAME": "proof",
    "ProofBuilder": "proof",
    "RedactionSummary": "redact_files",
    "redact_capsule": "redact_files",
    "redact_capture_dir": "redact_files",
    "RedactionError": "redaction",
    "redact_json_text": "redaction",
    "redact_record_line": "redaction",
    "redact_stream": "redaction",
    "redact_text": "redaction",
    "RULE_PACK_VERSION": "rules",
    "RULES": "rules",
    "Rule": "rules",
    "rule_pack_digest": "rules",
    "RULE_PACK_DIGEST": "secrets",
    "SCANNER_VERSION": "secrets",
    "Finding": "secrets",
    "scan_text": "secrets",
    "scan_value": "secrets",
    "ValidationReport": "validate",
    "validate_path": "validate",
    "validation_problems": "validate",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports("llmtap.trust", _EXPORTS, globals())
