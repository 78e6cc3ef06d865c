"""The Exchange's helpers: credential-free headers and model call ids."""

from __future__ import annotations

import os
import uuid

from hypothesis import assume, given
from hypothesis import strategies as st

from llmtap.exchange import (
    header_name,
    is_credential_header,
    new_model_call_id,
    safe_headers,
)


def test_model_call_ids_are_uuid4_hex_and_do_not_repeat() -> None:
    ids = [new_model_call_id() for _ in range(5000)]
    assert len(set(ids)) == len(ids)
    for value in ids[:200]:
        parsed = uuid.UUID(hex=value)
        assert (len(value), parsed.version, parsed.variant, parsed.hex) == (32, 4, uuid.RFC_4122, value)


def test_a_forked_child_draws_other_model_call_ids_than_its_parent() -> None:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            os.write(write_end, " ".join(new_model_call_id() for _ in range(50)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    parent = {new_model_call_id() for _ in range(50)}
    child_ids = b""
    while chunk := os.read(read_end, 65536):
        child_ids += chunk
    os.close(read_end)
    os.waitpid(pid, 0)
    assert len(child_ids.split()) == 50 and not parent & set(child_ids.decode().split())


def test_safe_headers_drop_credentials_from_asgi_lists_and_mappings_alike() -> None:
    raw = [(b"Authorization", b"Bearer sk-1"), (b"X-Api-Key", b"k"), (b"Content-Type", b"application/json"),
           (b"x-goog-api-key", b"g"), (b"X-Session-Token", b"t"), (b"OpenAI-Organization", b"org")]
    expected = {"content-type": "application/json"}
    assert safe_headers(raw) == expected
    assert safe_headers({name.decode(): value.decode() for name, value in raw}) == expected
    assert safe_headers(None) == {} and safe_headers([]) == {}


@given(st.lists(st.tuples(st.one_of(st.binary(max_size=30), st.text(max_size=30)), st.binary(max_size=20)), max_size=8))
def test_header_filtering_decides_a_name_the_same_way_the_first_time_and_every_time_after(
    headers: list[tuple[bytes | str, bytes]],
) -> None:
    """The name cache must never change a decision: credentials stay out, whatever was seen before."""
    first, again = safe_headers(list(headers)), safe_headers(list(headers))
    assert first == again
    for raw_name, _ in headers:
        text = (raw_name.decode("latin-1") if isinstance(raw_name, bytes) else raw_name).lower()
        credential = is_credential_header(text)
        assert header_name(raw_name) == (None if credential else text)
        if isinstance(raw_name, bytes):  # unhashable, so never cached: decided the same way
            assert header_name(bytearray(raw_name)) == header_name(raw_name)


def test_headers_shaped_like_credentials_never_reach_the_record_whatever_their_exact_name() -> None:
    raw = [
        (b"apikey", b"k1"), (b"X-Auth", b"k2"), (b"x-amz-security-token", b"k3"), (b"X-Client-Secret", b"k4"),
        (b"x-db-password", b"k5"), (b"x-session-id", b"k6"), (b"Cookie2", b"k7"), (b"x-my-credential", b"k8"),
        (b"Proxy-Authenticate", b"k9"), (b"X-Subscription-Key", b"k10"),
        (b"x-ratelimit-remaining-tokens", b"99"), (b"anthropic-ratelimit-output-tokens-remaining", b"7"),
        (b"anthropic-version", b"2023-06-01"), (b"openai-processing-ms", b"12"), (b"x-request-id", b"r"),
    ]
    assert safe_headers(raw) == {
        "x-ratelimit-remaining-tokens": "99",
        "anthropic-ratelimit-output-tokens-remaining": "7",
        "anthropic-version": "2023-06-01",
        "openai-processing-ms": "12",
        "x-request-id": "r",
    }


_NAME_CHARS = st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789-_")

# The documented vocabulary, written out here so that a word dropped from (or a safe name added to) the
# module's own lists fails these properties instead of moving their expected values along with it.
DOCUMENTED_CREDENTIAL_WORDS = ("key", "token", "auth", "secret", "password", "passwd", "cookie", "session", "credential")
DOCUMENTED_SAFE_NAMES = frozenset({"anthropic-version", "openai-version", "openai-processing-ms"})
DOCUMENTED_SAFE_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-", "ratelimit-")
DOCUMENTED_SECRET_NAMES_WITHOUT_A_WORD = frozenset({"openai-organization", "openai-project"})


@given(
    before=st.text(_NAME_CHARS, max_size=12),
    word=st.sampled_from(DOCUMENTED_CREDENTIAL_WORDS),
    after=st.text(_NAME_CHARS, max_size=12),
    upper=st.booleans(),
)
def test_any_name_holding_a_credential_word_is_dropped_unless_it_is_a_known_safe_one(
    before: str, word: str, after: str, upper: bool
) -> None:
    name = before + word + after
    wire = name.upper() if upper else name
    safe = name in DOCUMENTED_SAFE_NAMES or name.startswith(DOCUMENTED_SAFE_PREFIXES)
    assert (safe_headers([(wire.encode(), b"secret-value")]) == {name: "secret-value"}) is safe
    assert header_name(wire.encode()) == (name if safe else None)


@given(st.text(_NAME_CHARS, min_size=1, max_size=24))
def test_a_name_without_a_credential_word_is_kept_with_its_value(name: str) -> None:
    assume(not any(word in name for word in DOCUMENTED_CREDENTIAL_WORDS))
    assume(name not in DOCUMENTED_SECRET_NAMES_WITHOUT_A_WORD)
    assert safe_headers([(name.encode(), b"v")]) == {name: "v"}
    assert header_name(name.upper().encode()) == name


def test_the_secret_names_without_a_credential_word_are_dropped_by_name() -> None:
    assert safe_headers([(name.encode(), b"v") for name in sorted(DOCUMENTED_SECRET_NAMES_WITHOUT_A_WORD)]) == {}
