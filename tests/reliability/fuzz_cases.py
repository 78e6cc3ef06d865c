"""Hostile model calls for fuzzing capture, and the check every one of them must pass.

A case is one call as a capture point sees it: a request body, a status, response headers and
the response body in the chunks it arrived in. Cases come from two sources, both driven by a
`random.Random`, so hypothesis (through `st.randoms`) and `bench/fuzz.py` (through a seeded
generator) share them:

- `mutated_case`: a recorded real exchange, then truncated, with events duplicated, dropped or
  reordered, values replaced by wrong types, huge numbers, deep nesting, NaN/Infinity tokens or
  invalid UTF-8, and cut into chunks at arbitrary byte offsets;
- `generated_case`: events built from the keys and event types the dialect's recordings use, with
  values of any JSON type.

`check_case` runs a case the way `CaptureMiddleware` does (a `StreamTracker` fed chunk by chunk,
then `raw_line_from_exchange`), encodes the line as the store does, and checks that nothing
raised, that the line is one JSON object on one line which the strict reader's parse
(`ModelCallRecord.from_raw_line`) accepts and whose normalized record can be written out again,
that the stored response bytes are the bytes received, and that a stream's record is the same
whether it was tracked while passing or rebuilt from its bytes afterwards.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import random
import re
import zlib
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import orjson

from llmtap.dialects import DIALECTS
from llmtap.exchange import Exchange
from llmtap.records import ModelCallRecord, StreamTracker, raw_line_from_exchange
from tests.fixtures import RecordedExchange, fixtures_for

__all__ = ["DIALECT_NAMES", "SSE", "CallCase", "FuzzFailure", "check_case", "generated_case", "mutated_case", "vocabulary"]

DIALECT_NAMES = ("chat", "responses", "messages")
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
SSE = "text/event-stream; charset=utf-8"

# Values of the wrong type for any field: every JSON type, edge numbers and odd strings.
_ODD_VALUES: tuple[Any, ...] = (
    None, True, False, 0, -1, 2**63, -(2**63) - 1, 10**30, 1.5, -0.0, 1e308, "", " ", "\x00", "\ud800x".encode(
        "utf-8", "surrogatepass"
    ).decode("utf-8", "replace"), "é" * 3, "[DONE]", [], [None], {}, {"type": None}, [[[]]], {"index": -5},
)
# Raw JSON text orjson refuses but a sloppy server might send.
_RAW_TOKENS = (b"NaN", b"Infinity", b"-Infinity", b"1e999", b"123456789012345678901234567890123456789", b"0x10")
_INVALID_UTF8 = (b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80\x80")


class FuzzFailure(AssertionError):
    """Raised by `check_case` when capture raised or produced a line the reader would not take."""


@dataclass
class CallCase:
    """One model call as a capture point saw it."""

    dialect: str
    request_body: bytes
    status: int
    content_type: str
    chunks: list[bytes]
    content_encoding: str = ""
    cancelled: bool = False
    exception: BaseException | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


def check_case(case: CallCase) -> dict[str, Any]:
    """Capture `case` as the middleware does and return the decoded line; raises FuzzFailure on any defect."""
    dialect = DIALECTS[case.dialect]
    exchange = Exchange(method="POST", path=PATHS[case.dialect], rollout_id="fuzz", model_call_id="fuzz-call")
    exchange.add_request_bytes(case.request_body)
    exchange.status_code = case.status
    exchange.response_headers = {"content-type": case.content_type}
    if case.content_encoding:
        exchange.response_headers["content-encoding"] = case.content_encoding
    tracker = StreamTracker(dialect) if exchange.is_stream and not case.content_encoding else None
    try:
        for chunk in case.chunks:
            exchange.add_response_chunk(chunk)
            if tracker is not None:
                tracker.feed(chunk)
        exchange.cancelled = case.cancelled
        exchange.exception = case.exception
        line = raw_line_from_exchange(exchange, dialect=dialect, tracker=tracker)
        encoded = orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)  # exactly as CaptureStore encodes
    except Exception as exc:
        raise FuzzFailure(f"capture raised {type(exc).__name__}: {exc} ({', '.join(case.notes)})") from exc
    if encoded.count(b"\n") != 1:
        raise FuzzFailure("the encoded record is not exactly one line")
    decoded = orjson.loads(encoded)
    try:
        record = ModelCallRecord.from_raw_line(decoded, 0)
    except Exception as exc:
        raise FuzzFailure(f"the strict reader refused the record: {type(exc).__name__}: {exc}") from exc
    try:  # consumers (attachments, exports) write the normalized record out again, inside their own rows
        orjson.dumps({"rows": [{"calls": [record.to_dict()]}]})
    except Exception as exc:
        raise FuzzFailure(f"the normalized record cannot be written: {type(exc).__name__}: {exc}") from exc
    if not case.content_encoding and _stored_response(decoded) not in (case.body, None):
        raise FuzzFailure("the stored response bytes differ from the bytes received")
    if tracker is not None and _outcome(line) != _outcome(_rebuilt_line(case)):
        raise FuzzFailure("the record built while the stream passed differs from one rebuilt from its bytes")
    return dict(decoded)


def _outcome(line: dict[str, Any]) -> tuple[Any, ...]:
    return line.get("response"), line["error_category"], line.get("stream_truncated")


def _rebuilt_line(case: CallCase) -> dict[str, Any]:
    """The line built from the stored chunks alone, as when a capture point had no tracker."""
    exchange = Exchange(method="POST", path=PATHS[case.dialect], rollout_id="fuzz", model_call_id="fuzz-call")
    exchange.add_request_bytes(case.request_body)
    exchange.status_code = case.status
    exchange.response_headers = {"content-type": case.content_type}
    for chunk in case.chunks:
        exchange.add_response_chunk(chunk)
    exchange.cancelled = case.cancelled
    exchange.exception = case.exception
    return raw_line_from_exchange(exchange, dialect=DIALECTS[case.dialect])


def _stored_response(line: dict[str, Any]) -> bytes | None:
    if isinstance(line.get("response_raw"), str):
        return str(line["response_raw"]).encode("utf-8")
    if isinstance(line.get("response_raw_base64"), str):
        return base64.b64decode(line["response_raw_base64"])
    return None  # a JSON object body is stored parsed, which orjson round-trips by value


# --- recorded material ------------------------------------------------------------------------


@cache
def _recordings(dialect: str) -> tuple[RecordedExchange, ...]:
    return tuple(fixtures_for(dialect))


@cache
def vocabulary(dialect: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[str | None, dict[str, Any]], ...]]:
    """(keys, event type values, (event name, event data) samples) found in the dialect's recordings."""
    keys: set[str] = set()
    types: set[str] = set()
    samples: list[tuple[str | None, dict[str, Any]]] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                keys.add(key)
                if key == "type" and isinstance(item, str):
                    types.add(item)
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for recorded in _recordings(dialect):
        walk(recorded.request_json)
        if recorded.is_stream:
            for name, data in _parsed_events(recorded.body_bytes):
                walk(data)
                if isinstance(data, dict):
                    samples.append((name, data))
        else:
            try:
                walk(json.loads(recorded.body_bytes))
            except ValueError:
                pass
    return tuple(sorted(keys)), tuple(sorted(types)), tuple(samples)


def _parsed_events(body: bytes) -> list[tuple[str | None, Any]]:
    events: list[tuple[str | None, Any]] = []
    for block in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        name: str | None = None
        data: list[str] = []
        for raw in block.split(b"\n"):
            text = raw.decode("utf-8", "replace")
            if text.startswith("event:"):
                name = text[6:].strip()
            elif text.startswith("data:"):
                data.append(text[5:].lstrip(" "))
        if data:
            joined = "\n".join(data)
            try:
                events.append((name, json.loads(joined)))
            except ValueError:
                events.append((name, joined))
    return events


# --- building blocks ---------------------------------------------------------------------------


def _odd_value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if roll < 0.6 or depth > 3:
        return copy.deepcopy(rng.choice(_ODD_VALUES))
    if roll < 0.8:
        return [_odd_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(("type", "index", "delta", "text", "id", "x")): _odd_value(rng, depth + 1) for _ in range(2)}


# Deep nesting is spliced in as text after serializing: neither orjson nor the stdlib encodes it.
_DEEP_MARK = re.compile(rb'"\\u0000deep:(\d+)"')


def _deep(levels: int) -> str:
    return f"\x00deep:{levels}"


def _splice_deep(text: bytes) -> bytes:
    return _DEEP_MARK.sub(lambda found: b'{"a":[' * int(found[1]) + b"1" + b"]}" * int(found[1]), text)


def _mutate_json(rng: random.Random, value: Any) -> Any:
    """Replace one value somewhere in `value` (in place where possible) with something hostile."""
    paths: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key in node:
                paths.append((node, key))
                walk(node[key])
        elif isinstance(node, list):
            for index in range(len(node)):
                paths.append((node, index))
                walk(node[index])

    walk(value)
    if not paths:
        return _odd_value(rng)
    container, key = rng.choice(paths)
    roll = rng.random()
    if roll < 0.7:
        container[key] = _odd_value(rng)
    elif roll < 0.8:
        container[key] = _deep(rng.choice((50, 200, 600, 5000)))
    elif roll < 0.9 and isinstance(container, dict):
        del container[key]
    else:
        container[key] = rng.choice((10**40, -(10**40), 1e300, 2**64, -1))
    return value


def _dumps(value: Any, rng: random.Random) -> bytes:
    """Serialize like a server would; ints beyond 64 bits go through the stdlib, which writes them whole."""
    try:
        text = orjson.dumps(value)
    except (TypeError, ValueError):  # an int beyond 64 bits
        text = json.dumps(value, ensure_ascii=False).encode("utf-8")
    return _splice_deep(text)


def _raw_damage(rng: random.Random, data: bytes) -> bytes:
    """Byte-level damage to serialized JSON: a raw token, invalid UTF-8, or a cut."""
    if not data:
        return data
    roll = rng.random()
    cut = rng.randrange(len(data) + 1)
    if roll < 0.35:
        digits = [i for i, byte in enumerate(data) if 0x30 <= byte <= 0x39]
        if digits:
            at = rng.choice(digits)
            end = at
            while end < len(data) and (0x30 <= data[end] <= 0x39 or data[end] in b".eE+-"):
                end += 1
            return data[:at] + rng.choice(_RAW_TOKENS) + data[end:]
        return data[:cut] + rng.choice(_RAW_TOKENS) + data[cut:]
    if roll < 0.7:
        return data[:cut] + rng.choice(_INVALID_UTF8) + data[cut:]
    return data[:cut]


def _sse(name: str | None, data: bytes, rng: random.Random) -> bytes:
    newline = rng.choice((b"\n", b"\n", b"\r\n", b"\r"))
    head = b"event: " + name.encode("utf-8", "replace") + newline if name is not None else b""
    return head + b"data: " + data + newline + newline


def _chunked(rng: random.Random, body: bytes) -> list[bytes]:
    """Cut `body` at arbitrary byte offsets, mid-line and mid-character included."""
    if len(body) < 2 or rng.random() < 0.1:
        return [body] if body else []
    cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randint(1, 24))))
    edges = [0, *cuts, len(body)]
    return [body[a:b] for a, b in itertools.pairwise(edges)]


def _request(rng: random.Random, dialect: str, *, stream: bool) -> bytes:
    recorded = rng.choice(_recordings(dialect))
    request = copy.deepcopy(recorded.request_json)
    if isinstance(request, dict):
        request["stream"] = stream
    for _ in range(rng.choice((0, 0, 1, 3))):
        request = _mutate_json(rng, request)
    body = _dumps(request, rng)
    if rng.random() < 0.1:
        body = _raw_damage(rng, body)
    return body


def _finish(rng: random.Random, case: CallCase) -> CallCase:
    """Sometimes the call also failed the ways real calls fail."""
    roll = rng.random()
    if roll < 0.05:
        case.cancelled = True
    elif roll < 0.1:
        case.exception = ConnectionResetError("peer reset")
    elif roll < 0.13:
        case.content_encoding = rng.choice(("gzip", "deflate", "identity, gzip", "compress"))
        if rng.random() < 0.5:
            case.chunks = [zlib.compress(case.body)]
    return case


# --- the two sources ---------------------------------------------------------------------------


def mutated_case(rng: random.Random, dialect: str) -> CallCase:
    """A recorded exchange of `dialect`, damaged in one or more of the ways the module docstring lists."""
    recorded = rng.choice(_recordings(dialect))
    notes = [recorded.id]
    if not recorded.is_stream:
        body = recorded.body_bytes
        if rng.random() < 0.8:
            try:
                body = _dumps(_mutate_json(rng, json.loads(body)), rng)
                notes.append("json-mutated")
            except ValueError:
                pass
        if rng.random() < 0.4:
            body = _raw_damage(rng, body)
            notes.append("raw-damage")
        case = CallCase(dialect, _request(rng, dialect, stream=False), recorded.status,
                        recorded.content_type or "application/json", _chunked(rng, body), notes=notes)
        return _finish(rng, case)
    events: list[tuple[str | None, bytes]] = [
        (name, _dumps(data, rng) if not isinstance(data, str) else data.encode("utf-8"))
        for name, data in _parsed_events(recorded.body_bytes)
    ]
    for _ in range(rng.randint(1, 4)):
        roll = rng.random()
        if not events:
            break
        at = rng.randrange(len(events))
        if roll < 0.15:
            events.insert(at, events[at])
            notes.append("duplicated")
        elif roll < 0.3:
            other = rng.randrange(len(events))
            events[at], events[other] = events[other], events[at]
            notes.append("reordered")
        elif roll < 0.4:
            del events[at]
            notes.append("dropped")
        elif roll < 0.75:
            try:
                events[at] = (events[at][0], _dumps(_mutate_json(rng, json.loads(events[at][1])), rng))
                notes.append("value")
            except (ValueError, RecursionError):  # already damaged or deepened by an earlier step
                pass
        elif roll < 0.9:
            events[at] = (events[at][0], _raw_damage(rng, events[at][1]))
            notes.append("raw-damage")
        else:
            events[at] = (rng.choice((None, "error", "message_stop", "response.completed", "\x00", "")), events[at][1])
            notes.append("renamed")
    body = b"".join(_sse(name, data, rng) for name, data in events)
    if rng.random() < 0.3:
        body = body[: rng.randrange(len(body) + 1)]
        notes.append("truncated")
    case = CallCase(dialect, _request(rng, dialect, stream=True), recorded.status, SSE, _chunked(rng, body), notes=notes)
    return _finish(rng, case)


def generated_case(rng: random.Random, dialect: str) -> CallCase:
    """A stream of events made up from the dialect's vocabulary, values of any type."""
    keys, types, samples = vocabulary(dialect)
    events: list[bytes] = []
    for _ in range(rng.randint(0, 12)):
        if samples and rng.random() < 0.5:
            name, data = rng.choice(samples)
            event: Any = _mutate_json(rng, copy.deepcopy(data))
        else:
            name = rng.choice(types) if rng.random() < 0.5 else None
            event = {rng.choice(keys): _generated_value(rng, keys, types, 0) for _ in range(rng.randint(0, 6))}
            if rng.random() < 0.8:
                event["type"] = rng.choice(types)
        if rng.random() < 0.1:
            events.append(_sse(name, b"[DONE]", rng))
        events.append(_sse(name, _dumps(event, rng), rng))
    body = b"".join(events)
    if rng.random() < 0.2:
        body = _raw_damage(rng, body)
    case = CallCase(dialect, _request(rng, dialect, stream=True), rng.choice((200, 200, 200, 400, 500)), SSE,
                    _chunked(rng, body), notes=["generated"])
    return _finish(rng, case)


def _generated_value(rng: random.Random, keys: tuple[str, ...], types: tuple[str, ...], depth: int) -> Any:
    roll = rng.random()
    if depth > 3 or roll < 0.35:
        return _odd_value(rng)
    if roll < 0.5:
        return rng.choice(types)
    if roll < 0.65:
        return rng.randint(0, 5)
    if roll < 0.8:
        return [_generated_value(rng, keys, types, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(keys): _generated_value(rng, keys, types, depth + 1) for _ in range(rng.randint(0, 4))}
