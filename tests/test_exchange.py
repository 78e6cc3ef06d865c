"""The Exchange's helpers: credential-free headers and model call ids."""

from __future__ import annotations

import os
import uuid

from hypothesis import given
from hypothesis import strategies as st

from llmtap.exchange import SECRET_HEADERS, header_name, new_model_call_id, safe_headers


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
        credential = text in SECRET_HEADERS or "token" in text or text.endswith("-key")
        assert header_name(raw_name) == (None if credential else text)
        if isinstance(raw_name, bytes):  # unhashable, so never cached: decided the same way
            assert header_name(bytearray(raw_name)) == header_name(raw_name)
