"""Redaction recomputes the digests a line keeps of its content, so none of them can confirm a guessed secret."""

from __future__ import annotations

import json

import orjson
import pytest

from llmtap.records.fingerprint import continuation_fingerprint
from llmtap.records.json_layout import encode_as_recorded
from llmtap.replay.answers import answer_from_line
from llmtap.trust import redact_record_line
from tests.fixtures import fixture
from tests.trust.corpus import SECRETS
from tests.trust.streams import capture_line, plant_split


def _redacted(line: bytes) -> tuple[bytes, list[str]]:
    found: list[str] = []
    return redact_record_line(line, lambda rule, secret, where, offset, length: found.append(rule)), found


@pytest.mark.parametrize("name", ["chat/text-basic-gpt4o", "messages/text-basic-sonnet4", "chat/text-stream-include-usage-gpt4"])
def test_the_digests_a_line_keeps_of_its_content_are_recomputed_from_the_redacted_content(name: str) -> None:
    """A fingerprint or CRC of the unredacted answer would let anyone test guesses of the secret."""
    recorded = fixture(name)
    key = SECRETS[0].secret
    if recorded.is_stream:
        planted = plant_split(recorded, f" {key} ", pieces=4)
    elif "Oi!" in recorded.body_text:
        planted = recorded.body_text.replace("Oi!", f"Oi! {key}")
    else:  # plant the key in the first text the answer holds
        text = json.loads(recorded.body_text)["content"][0]["text"]
        planted = recorded.body_text.replace(text, f"{text} {key}", 1)
    line = capture_line(recorded, body=planted)
    before = (line.get("continuation_fingerprint"), line.get("response_body_crc32"))
    out, found = _redacted(orjson.dumps(line) + b"\n")
    assert found and key.encode() not in out
    redacted = orjson.loads(out)
    assert redacted["continuation_fingerprint"] == continuation_fingerprint(redacted["request"], redacted["response"], dialect=redacted["dialect"])
    assert redacted["continuation_fingerprint"] not in (None, before[0])
    if recorded.is_stream:
        assert "response_body_crc32" not in redacted
        return
    assert redacted["response_body_crc32"] != before[1]
    # A replay still sends the redacted answer in the server's own layout, and says it is exact.
    body, exact = encode_as_recorded(redacted["response"], redacted["response_body_crc32"])
    assert exact and body == planted.replace(key, "[REDACTED:openai-project-key]").encode()
    assert answer_from_line(redacted).body == body
    # Everything else in the line is the same bytes: the digests were replaced in their own tokens.
    expected = orjson.dumps(line).decode().replace(key, "[REDACTED:openai-project-key]")
    for field, old in zip(("continuation_fingerprint", "response_body_crc32"), before):
        expected = expected.replace(f'"{field}":{orjson.dumps(old).decode()}', f'"{field}":{orjson.dumps(redacted[field]).decode()}')
    assert out == expected.encode() + b"\n"
