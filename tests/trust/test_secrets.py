"""The scanner finds every credential shape of the pack, in every place one turns up, and nothing benign."""

from __future__ import annotations

import os
import random
import re
import string
import subprocess
import sys
import uuid

import pytest

from llmtap.trust.rules import RULE_PACK_VERSION, RULES, Rule, rule_pack_digest
from llmtap.trust.secrets import RULE_PACK_DIGEST, is_benign, scan_text, scan_value
from tests.trust.corpus import BENIGN, SECRETS, Sample, embeddings


def test_the_pack_has_at_least_35_formats_and_every_rule_has_a_sample() -> None:
    assert len(RULES) >= 35
    assert len({rule.id for rule in RULES}) == len(RULES)
    assert {rule.id for rule in RULES} == {sample.rule_id for sample in SECRETS}


@pytest.mark.parametrize("sample", SECRETS, ids=lambda s: s.rule_id)
@pytest.mark.parametrize("place", ["bare", "prompt", "env_file", "log_line", "url_query"])
def test_every_sample_is_found_whole_by_its_own_rule(sample: Sample, place: str) -> None:
    text = sample.in_context() if place == "bare" else embeddings(sample.in_context())[place]
    found = [(f.rule_id, text[f.start : f.end]) for f in scan_text(text)]
    assert (sample.rule_id, sample.secret) in found


@pytest.mark.parametrize("value", BENIGN, ids=lambda v: v[:24])
@pytest.mark.parametrize("place", ["bare", "prompt", "env_file", "log_line", "url_query"])
def test_benign_ids_are_never_found(value: str, place: str) -> None:
    text = value if place == "bare" else embeddings(value)[place]
    assert scan_text(text) == []


def test_benign_ids_as_secret_named_values_are_left_alone() -> None:
    for value in BENIGN[:20]:
        assert scan_value(value, "api_key") == [], value
        assert scan_text(f"password={value}") == [], value


def test_no_rule_matches_bare_hex_alphanumerics_or_uuids() -> None:
    generator = random.Random(5)
    for _ in range(200):
        candidates = [
            "".join(generator.choice("0123456789abcdef") for _ in range(40)),
            "".join(generator.choice("0123456789abcdef") for _ in range(64)),
            "".join(generator.choice(string.ascii_letters + string.digits) for _ in range(40)),
            "".join(generator.choice(string.ascii_letters + string.digits) for _ in range(32)),
            str(uuid.UUID(int=generator.getrandbits(128))),
        ]
        for value in candidates:
            assert scan_text(f"id: {value} and ({value})") == [], value


def test_a_value_is_a_secret_when_its_key_names_one() -> None:
    value = "Xk29fLq0ZpR7wTn4"
    assert [f.rule_id for f in scan_value(value, "password")] == ["generic-secret-assignment"]
    assert [f.rule_id for f in scan_value("a" * 40, "aws_secret_access_key")] == []  # no entropy, no shape
    aws_secret = SECRETS[[s.rule_id for s in SECRETS].index("aws-secret-access-key")].secret
    assert [f.rule_id for f in scan_value(aws_secret, "aws_secret_access_key")] == ["aws-secret-access-key"]
    assert scan_value(value, "model") == []
    assert scan_value("hunter", "password") == []  # too short to tell from a word
    assert scan_value("implementation", "token") == []  # a logprobs token, not a credential
    assert scan_value("Understanding", "token") == []


def test_low_entropy_assignments_and_placeholders_are_not_secrets() -> None:
    for text in (
        "password=aaaaaaaaaaaa",
        "api_key: ${OPENAI_API_KEY}",
        "token: {{ secrets.GITHUB_TOKEN }}",
        "password = <your-password>",
        "secret: [REDACTED:openai-project-key]",
        '"max_tokens": 1024',
        '"prompt_tokens": 37, "completion_tokens": 12',
        "Authorization: Bearer ${TOKEN}",
        "postgres://user:${DB_PASSWORD}@db/app",
    ):
        assert scan_text(text) == [], text


def test_the_pack_digest_covers_patterns_not_only_ids() -> None:
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", RULE_PACK_DIGEST)
    assert re.fullmatch(r"\d{4}\.\d{1,2}\.\d+", RULE_PACK_VERSION)
    # Proofs from different runs compare digests: another interpreter, other hash seed, the same digest.
    code = "from llmtap.trust.secrets import RULE_PACK_DIGEST; print(RULE_PACK_DIGEST)"
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert fresh.stdout.strip() == RULE_PACK_DIGEST
    changed = (*RULES[:-1], Rule(RULES[-1].id, RULES[-1].description, re.compile("x"), ("x",), 1))
    assert rule_pack_digest(changed) != RULE_PACK_DIGEST


def test_a_long_text_finds_a_key_anywhere_in_it() -> None:
    filler = "The quick brown fox jumps over the lazy dog; token counts: prompt_tokens=12. " * 20000
    key = SECRETS[0].secret
    for position in (0, len(filler) // 2, len(filler)):
        text = filler[:position] + f" key={key} " + filler[position:]
        assert [text[f.start : f.end] for f in scan_text(text)] == [key]
    assert scan_text(filler) == []


def test_findings_never_overlap_and_prefer_the_specific_rule() -> None:
    key = SECRETS[0].secret
    found = scan_text(f"OPENAI_API_KEY={key}")
    assert [f.rule_id for f in found] == ["openai-project-key"]
    jwt = SECRETS[[s.rule_id for s in SECRETS].index("jwt")].secret
    assert [f.rule_id for f in scan_text(f"Authorization: Bearer {jwt}")] == ["jwt"]


def test_is_benign_knows_the_id_shapes() -> None:
    for value in BENIGN[:18]:
        assert is_benign(value), value
    assert not is_benign(SECRETS[0].secret)
