"""In-toto Statement v1 in a DSSE envelope: building, signing and checking one.

DSSE signs the pre-authentication encoding (PAE) of the payload, never the payload alone, so a
signature cannot be replayed under another payload type:

    PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body

where LEN is the byte length in ASCII decimal without leading zeros and SP one space (0x20).
The envelope is written as compact JSON with sorted keys, and a reader insists on exactly those
bytes, so no byte of it can change without the check noticing.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..errors import LlmtapError
from .keys import fingerprint

__all__ = [
    "INTOTO_PAYLOAD_TYPE",
    "PREDICATE_TYPE",
    "STATEMENT_TYPE",
    "EnvelopeError",
    "canonical_json",
    "open_envelope",
    "pae",
    "sign_envelope",
    "statement",
]

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
INTOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
# llmtap's own predicate type for capture evidence; a URN, so it claims no web domain.
PREDICATE_TYPE = "urn:llmtap:predicate:capture-evidence:v1"


class EnvelopeError(LlmtapError, ValueError):
    """Raised by `open_envelope` when an envelope is malformed or its signature does not verify."""


def pae(payload_type: str, body: bytes) -> bytes:
    """The DSSE v1 pre-authentication encoding of `body` under `payload_type`."""
    type_bytes = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(type_bytes), type_bytes, len(body), body)


def canonical_json(value: Any) -> bytes:
    """Compact, key-sorted, ASCII-only JSON: the one byte form llmtap writes and accepts."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


def statement(subjects: Sequence[tuple[str, str]], predicate: Mapping[str, Any]) -> dict[str, Any]:
    """An in-toto Statement v1 binding each `(name, sha256 hex)` subject, with llmtap's predicate."""
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": digest}} for name, digest in subjects],
        "predicateType": PREDICATE_TYPE,
        "predicate": dict(predicate),
    }


def sign_envelope(payload: bytes, key: Ed25519PrivateKey, *, payload_type: str = INTOTO_PAYLOAD_TYPE) -> bytes:
    """A DSSE envelope (canonical JSON bytes) over `payload`, signed by `key`, its keyid the key's fingerprint."""
    signature = key.sign(pae(payload_type, payload))
    envelope = {
        "payload": base64.b64encode(payload).decode("ascii"),
        "payloadType": payload_type,
        "signatures": [{"keyid": fingerprint(key.public_key()), "sig": base64.b64encode(signature).decode("ascii")}],
    }
    return canonical_json(envelope)


def _strict_b64(text: object, what: str) -> bytes:
    """Decode standard padded base64, refusing any other spelling of the same bytes."""
    if not isinstance(text, str):
        raise EnvelopeError(f"the envelope's {what} is not a string")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise EnvelopeError(f"the envelope's {what} is not valid base64") from None
    if base64.b64encode(data).decode("ascii") != text:
        raise EnvelopeError(f"the envelope's {what} is not canonical base64")
    return data


def open_envelope(data: bytes, key: Ed25519PublicKey, *, payload_type: str = INTOTO_PAYLOAD_TYPE) -> bytes:
    """Check a DSSE envelope signed by `key` and return its payload bytes; EnvelopeError otherwise.

    The envelope must be exactly the canonical JSON `sign_envelope` writes, carry the expected
    payload type, and hold one signature whose keyid is `key`'s fingerprint and which verifies
    over the PAE of the payload.
    """
    try:
        envelope = json.loads(data)
    except ValueError:
        raise EnvelopeError("the envelope is not JSON") from None
    if not isinstance(envelope, dict) or set(envelope) != {"payload", "payloadType", "signatures"}:
        raise EnvelopeError("the envelope does not have exactly the fields payload, payloadType and signatures")
    try:
        canonical = canonical_json(envelope)
    except ValueError:
        raise EnvelopeError("the envelope holds values JSON cannot write back") from None
    if canonical != data:
        raise EnvelopeError("the envelope is not in llmtap's canonical JSON form (it was edited)")
    if envelope["payloadType"] != payload_type:
        raise EnvelopeError(f"the envelope's payloadType is {envelope['payloadType']!r}, not {payload_type!r}")
    payload = _strict_b64(envelope["payload"], "payload")
    signatures = envelope["signatures"]
    if not isinstance(signatures, list) or len(signatures) != 1 or not isinstance(signatures[0], dict):
        raise EnvelopeError("the envelope does not hold exactly one signature")
    entry = signatures[0]
    if set(entry) != {"keyid", "sig"}:
        raise EnvelopeError("the envelope's signature does not have exactly the fields keyid and sig")
    if entry["keyid"] != fingerprint(key):
        raise EnvelopeError("the envelope's signature names another key than the bundle's key.pem")
    signature = _strict_b64(entry["sig"], "signature")
    try:
        key.verify(signature, pae(payload_type, payload))
    except InvalidSignature:
        raise EnvelopeError("the envelope's signature does not verify with the bundle's key") from None
    return payload
