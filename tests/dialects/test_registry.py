"""The dialect registry: which dialect owns a path."""

from __future__ import annotations

from llmtap.dialects import get_dialect


def test_dialect_registry_finds_paths() -> None:
    from llmtap.dialects import dialect_for_path

    assert dialect_for_path("/v1/chat/completions") is get_dialect("chat")
    assert dialect_for_path("/v1/responses?x=1") is get_dialect("responses")
    assert dialect_for_path("/openai/deployments/gpt/chat/completions") is None
    assert dialect_for_path("/openai/deployments/gpt/chat/completions", exact=False) is get_dialect("chat")
    assert dialect_for_path("/v1/models") is None
