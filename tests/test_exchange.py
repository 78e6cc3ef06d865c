"""The Exchange's helpers: credential-free headers and model call ids."""

from __future__ import annotations

import os
import uuid

from llmtap.exchange import new_model_call_id, safe_headers


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
