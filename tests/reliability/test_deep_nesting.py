"""Bodies nested deeper than orjson can write: the record keeps them as raw text and is still stored.

Found by fuzzing: orjson reads JSON nested up to 1,024 levels but writes at most 254, so a
request or response nested 255 to 1,024 deep was parsed into the line, the store could not encode
the line, and the call's record was lost (`record_write_failed`).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from llmtap.dialects import DIALECTS
from llmtap.exchange import Exchange
from llmtap.records import StreamTracker, raw_line_from_exchange
from llmtap.store import CaptureStore
from llmtap.store.readers import read_rollout_calls


def nested(levels: int) -> bytes:
    return b"[" * levels + b"1" + b"]" * levels


def chat_exchange(request: bytes, response: bytes, *, content_type: str = "application/json") -> Exchange:
    exchange = Exchange(method="POST", path="/v1/chat/completions", rollout_id="deep", model_call_id="deep-1")
    exchange.add_request_bytes(request)
    exchange.status_code = 200
    exchange.response_headers = {"content-type": content_type}
    exchange.add_response_chunk(response)
    return exchange


def store_and_read(tmp_path: Path, line: dict[str, object]) -> dict[str, object]:
    with CaptureStore(tmp_path) as store:
        store.append("deep", line)
        [record] = read_rollout_calls(store, "deep", strict=True).records
    return record.to_dict()


@pytest.mark.parametrize("levels", [260, 600, 1000])
def test_a_response_nested_too_deep_to_write_is_kept_raw_and_the_record_is_stored(tmp_path: Path, levels: int) -> None:
    body = b'{"id":"x","deep":' + nested(levels) + b"}"
    line = raw_line_from_exchange(chat_exchange(b'{"model":"m"}', body))

    assert line["response"] is None and line["response_raw"] == body.decode()
    assert line["error_category"] == "capture_parse_error"
    assert store_and_read(tmp_path, line)["response_raw"] == body.decode()


def test_a_request_nested_too_deep_to_write_is_kept_raw(tmp_path: Path) -> None:
    request = b'{"model":"m","messages":' + nested(300) + b"}"
    line = raw_line_from_exchange(chat_exchange(request, b'{"id":"x","choices":[]}'))

    assert line["request"] is None and line["request_raw"] == request.decode()
    assert store_and_read(tmp_path, line)["request_raw"] == request.decode()


STREAMS_CARRYING_A_DEEP_VALUE = {
    "chat": b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}],"usage":{"x":' + nested(300) + b"}}\n\n",
    "messages": b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","content":[],'
    b'"usage":{"input_tokens":1,"x":' + nested(300) + b"}}}\n\n",
    "responses": b'event: response.created\ndata: {"type":"response.created","response":{"id":"r","output":[],'
    b'"metadata":' + nested(300) + b"}}\n\n",
}


@pytest.mark.parametrize("dialect", sorted(STREAMS_CARRYING_A_DEEP_VALUE))
def test_a_stream_whose_reassembly_is_too_deep_keeps_its_bytes_and_is_stored(tmp_path: Path, dialect: str) -> None:
    stream = STREAMS_CARRYING_A_DEEP_VALUE[dialect]
    exchange = chat_exchange(b'{"model":"m","stream":true}', stream, content_type="text/event-stream")
    tracker = StreamTracker(DIALECTS[dialect])
    tracker.feed(stream)

    line = raw_line_from_exchange(exchange, dialect=DIALECTS[dialect], tracker=tracker)

    assert line["response"] is None and line["response_raw"] == stream.decode()
    assert line["error_category"] == "stream_truncated"  # the stream's own fault comes first: it has no end
    assert store_and_read(tmp_path, line)["response_raw"] == stream.decode()


def test_tool_arguments_nested_too_deep_read_back_raw_so_the_record_can_be_written() -> None:
    arguments = (b'{"a":' + nested(300) + b"}").decode()
    body = orjson.dumps(
        {
            "id": "x",
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "tool_calls": [{"id": "t", "type": "function", "function": {"name": "f", "arguments": arguments}}],
                    },
                }
            ],
        }
    )
    normalized = DIALECTS["chat"].normalize(orjson.loads(body))

    assert normalized.tool_calls[0].arguments == {"_raw": arguments}


def test_ordinary_nesting_is_still_parsed() -> None:
    body = b'{"id":"x","deep":' + nested(150) + b"}"  # 150 levels: more than any real body, and writable
    line = raw_line_from_exchange(chat_exchange(b'{"model":"m"}', body))

    assert line["response"] == orjson.loads(body) and "response_raw" not in line


@pytest.mark.parametrize(("where", "levels"), [("response", 240), ("response", 600), ("request", 230), ("request", 900)])
async def test_serve_builds_lines_unchecked_and_rebuilds_the_one_too_deep_to_write(
    tmp_path: Path, where: str, levels: int
) -> None:
    """`llmtap serve` skips the bracket counts (`check_depth=False`): encoding the line checks its
    depth, and a line that fails is built again with the checks, so the record is still stored,
    the deep body kept as its exact text. 230 and 240 levels are writable alone but not with the
    headroom rows need; 600 and 900 are not writable at all."""
    from llmtap.health import CaptureHealth
    from llmtap.server.middleware import CaptureMiddleware
    from tests.server.asgi_harness import call_app, http_scope

    deep = b'{"model":"m","deep":' + nested(levels) + b"}"
    request, response = (deep, b'{"id":"x","choices":[]}') if where == "request" else (b'{"model":"m"}', deep)

    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": response})

    health = CaptureHealth()
    with CaptureStore(tmp_path / "calls") as store:
        capture = CaptureMiddleware(app, store=store, health=health)
        sent = await call_app(capture, http_scope("/ng-rollout/deep/v1/chat/completions"), request)
        assert sent.status == 200 and sent.body == response
        [record] = read_rollout_calls(store, "deep", strict=True).records
    assert getattr(record, where) is None and getattr(record, f"{where}_raw") == deep.decode()
    assert health.failures() == {}  # nothing lost: no record_write_failed
