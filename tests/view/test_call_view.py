"""The call page's stream events: each with the arrival of the chunk that completed it."""

from __future__ import annotations

import json

from llmtap.exchange import Exchange
from llmtap.records import raw_line_from_exchange
from llmtap.view.call_view import _events
from tests.fixtures import fixture


def _streamed_line(cuts: list[int], offsets_s: list[float]) -> tuple[dict[str, object], bytes]:
    recorded = fixture("chat/text-stream-include-usage-gpt4")
    body = recorded.body_bytes
    exchange = Exchange(
        method="POST",
        path="/v1/chat/completions",
        request_body=json.dumps(recorded.request_json).encode(),
        status_code=200,
        response_headers={"content-type": "text/event-stream"},
    )
    exchange.started_mono = 0.0
    bounds = [0, *cuts, len(body)]
    for (start, end), offset in zip(zip(bounds, bounds[1:]), offsets_s, strict=True):
        exchange.response_chunks.append((offset, body[start:end]))
    exchange.first_byte_mono = offsets_s[0]
    exchange.completed_mono = offsets_s[-1]
    return raw_line_from_exchange(exchange), body


def test_each_event_shows_when_the_chunk_that_completed_it_arrived() -> None:
    recorded_body = fixture("chat/text-stream-include-usage-gpt4").body_bytes
    first_event_end = recorded_body.index(b"\n\n") + 2
    # Chunk 1 ends inside the second event; chunk 2 completes it and holds the rest but the last byte.
    line, _ = _streamed_line([first_event_end + 5, len(recorded_body) - 1], [0.010, 0.250, 0.900])
    events, total = _events(line)
    times = [at for _, _, at in events]
    assert total == len(events) and total >= 3
    assert times[0] == 10.0  # the first event was whole in the first chunk
    assert times[1] == 250.0  # the second ended in the second chunk
    assert times[-1] == 900.0  # the last event's final byte came with the last chunk


def test_a_chunk_list_that_does_not_cut_the_bytes_shows_no_times_rather_than_wrong_ones() -> None:
    line, body = _streamed_line([100], [0.01, 0.02])
    line["response_chunks"] = [[1000, 100], [2000, len(body)]]  # lengths no longer sum to the body
    events, _ = _events(line)
    assert events and all(at is None for _, _, at in events)
    del line["response_chunks"]  # a line written before llmtap kept chunk times
    assert all(at is None for _, _, at in _events(line)[0])
