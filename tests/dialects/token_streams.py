"""Holding a dialect's token templates (`llmtap.dialects.token_template`) to its general path."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from hypothesis import strategies as st

from llmtap.dialects import Dialect
from llmtap.dialects.sse import decode_sse
from llmtap.records import StreamTracker

# Token texts where a template could go wrong: JSON escapes, quotes, control characters,
# non-ASCII, texts that also occur elsewhere in the event, empty text, text that looks like JSON.
TRICKY_TOKENS = st.one_of(
    st.text(max_size=6),
    st.sampled_from(['"', "\\", "\n", "\u00e9", "chatcmpl", "0", "content", "text", "", " ", '"},"x":{"']),
)

# Tokens a model writes all the time that JSON escapes: line breaks, quotes, tabs, a backslash, and
# (with ensure_ascii) every non-ASCII letter.
ESCAPED_TOKENS = ["\n", ' "quoted"', "\t", "a\\b", "\u00e9t\u00e9", "\n\n```"]


def assert_templates_change_nothing(dialect: Dialect, chunks: list[bytes]) -> None:
    """Assemble the stream `chunks` with and without templates, each way a capture point meets it:
    decoded whole, an event a chunk (some after a comment line, read undecoded), and cut every 7
    bytes. Result, terminal state and malformed count must be the general path's every time."""
    body = b"".join(chunks)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr("llmtap.dialects.token_template.TokenTemplate.around", classmethod(lambda cls, *args: None))
        general = dialect.stream_assembler()
        for event in decode_sse(body):
            general.feed(event)
    expected = (general.result(), general.terminal, general.malformed_events)
    assembler = dialect.stream_assembler()
    for event in decode_sse(body):
        assembler.feed(event)
    assert (assembler.result(), assembler.terminal, assembler.malformed_events) == expected
    for stream_chunks in (
        [b": keep-alive\n" + chunk if number % 3 == 0 else chunk for number, chunk in enumerate(chunks)],
        [body[start : start + 7] for start in range(0, len(body), 7)],
    ):
        tracker = StreamTracker(dialect)
        seen = [tracker.feed(chunk) for chunk in stream_chunks]
        outcome = tracker.outcome()
        assert outcome is not None and (outcome.response, outcome.terminal, outcome.malformed) == expected
        if expected[1] is not None:
            # Once the answer is complete (at the latest with the terminal event) it stays complete.
            assert seen[-1] and all(seen[seen.index(True) :])


def track_counting_parses(dialect: Dialect, module: ModuleType, chunks: list[bytes]) -> tuple[Any, int]:
    """Track `chunks` as a capture point does (a chunk at a time); return the outcome and how many
    events took the general path, counted at `module`'s `parse_event_data`."""
    parsed = 0
    original = module.parse_event_data

    def counting(event: Any) -> Any:
        nonlocal parsed
        parsed += 1
        return original(event)

    tracker = StreamTracker(dialect)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(module, "parse_event_data", counting)
        for chunk in chunks:
            tracker.feed(chunk)
    return tracker.outcome(), parsed
