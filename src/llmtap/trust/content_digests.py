"""The digests a capture line keeps of its own content, recomputed once redaction has changed it.

`redaction` replaces secrets inside a line's strings. Two fields are functions of those strings:
`continuation_fingerprint` (a SHA-256 over the model's turns, `records.fingerprint`) and
`response_body_crc32` (a CRC of the response's bytes, `records.json_layout`). Either, left as
computed before redaction, would let anyone holding the file test guesses of a redacted secret
against it; this module recomputes both from the redacted record.
"""

from __future__ import annotations

from typing import Any

import orjson

from llmtap.records.fingerprint import continuation_fingerprint
from llmtap.records.json_layout import check_in_layout, layout_matching

__all__ = ["rederive_digests"]


def rederive_digests(original: dict[str, Any], text: str) -> str:
    """Recompute, from the redacted record, the digests its line keeps of its content.

    A capture line keeps `continuation_fingerprint` (SHA-256 of the model's turns) and
    `response_body_crc32` (of the response's bytes). Left as computed before redaction, either
    would let anyone holding the file test guesses of a redacted secret against it. So both are
    recomputed from the redacted request and response (the CRC in the layout the server wrote,
    so a replay still sends the redacted body in it) or, when that cannot be done, set to null.
    Each is replaced in its own token, as `redaction` replaces secrets; a line not written compactly
    by llmtap is re-encoded whole instead.
    """
    if "continuation_fingerprint" not in original and "response_body_crc32" not in original:
        return text
    try:
        redacted = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
    if not isinstance(redacted, dict):
        return text
    updated: dict[str, Any] = {}
    if "continuation_fingerprint" in original:
        dialect = redacted.get("dialect")
        updated["continuation_fingerprint"] = continuation_fingerprint(
            redacted.get("request"), redacted.get("response"), dialect=dialect if isinstance(dialect, str) else None
        )
    if "response_body_crc32" in original:
        layout = layout_matching(original.get("response"), original.get("response_body_crc32"))
        updated["response_body_crc32"] = None if layout is None else check_in_layout(redacted.get("response"), layout)
    for key, value in updated.items():
        old_token = f'"{key}":{orjson.dumps(original[key]).decode()}'
        if text.count(old_token) != 1:
            break
        text = text.replace(old_token, f'"{key}":{orjson.dumps(value).decode()}')
    else:
        return text
    redacted.update(updated)  # not llmtap's compact form: write the record again
    return orjson.dumps(redacted).decode()
