"""Redaction that keeps files valid: secrets become `[REDACTED:<rule-id>]` inside the strings that held them.

JSON is never rewritten as a whole: each string token is decoded (so `\\"`, `\\n` and `\\u`
escapes cannot hide a key), scanned, and only a token that held a secret is re-encoded in place,
so every other byte of a line, its key order and its `call_index` stay as they were. A string
that itself holds JSON (tool-call arguments) is redacted the same way one level down, and a
string's object key gives its value context (`"password": "..."`). A recorded event stream
(`response_raw` of a streamed call) is redacted event by event, a secret split across deltas is
found in the text each field's deltas build and removed from every event that carried a piece,
and the stream is then reassembled by the call's own dialect to check that nothing is left.

Every finding goes to a `FindingSink` (the proof), never to a log or an error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from llmtap.dialects import DIALECTS
from llmtap.errors import LlmtapError
from llmtap.records import StreamTracker

from .content_digests import rederive_digests
from .secrets import Finding, marker, scan_text, scan_value

__all__ = ["FindingSink", "RedactionError", "redact_json_text", "redact_record_line", "redact_text"]

# (rule id, secret text, where: the JSON pointers or event numbers leading to the string, byte offset, byte length)
FindingSink = Callable[[str, str, list[str], int, int], None]

_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\],:]', re.DOTALL)
_MAX_DEPTH = 4  # JSON in a string in a string ...: deeper nesting is scanned as text
_LINE_SPLIT = re.compile(r"(\r\n|\r|\n)")
_RELAX = (("\\\\", "\\"), ('\\"', '"'), ("\\/", "/"), ("\\n", "\n"), ("\\r", "\r"), ("\\t", "\t"))
_UNICODE_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})")


class RedactionError(LlmtapError):
    """Raised when a file cannot be redacted safely (a link, a special file, unreadable bytes)."""


def _ignore(rule_id: str, secret: str, where: list[str], offset: int, length: int) -> None:
    return None


def _apply(value: str, findings: list[Finding], where: list[str], sink: FindingSink) -> str:
    """Replace each finding's span in `value` by its marker, reporting each to `sink`."""
    parts: list[str] = []
    last = 0
    for finding in findings:
        secret = value[finding.start : finding.end]
        offset = len(value[: finding.start].encode("utf-8", "surrogateescape"))
        sink(finding.rule_id, secret, where, offset, len(secret.encode("utf-8", "surrogateescape")))
        parts.append(value[last : finding.start])
        parts.append(marker(finding.rule_id))
        last = finding.end
    parts.append(value[last:])
    return "".join(parts)


def redact_text(text: str, sink: FindingSink = _ignore, where: list[str] | None = None) -> str:
    """Return `text` with every secret replaced by its marker (text files, damaged lines)."""
    findings = scan_text(text)
    return _apply(text, findings, where or [], sink) if findings else text


def _pointer_part(key: str | int) -> str:
    if isinstance(key, int):
        return str(key)
    return key if "~" not in key and "/" not in key else key.replace("~", "~0").replace("/", "~1")


def _walk_strings(doc: str, visit: Callable[[str, str | None, str], str | None]) -> str:
    """Call `visit(pointer, key, value)` for every string value and key of the JSON text `doc`;
    a returned string replaces that token (re-encoded), None keeps it byte for byte."""
    out: list[str] = []
    last = 0
    # Each frame: [is_object, current key or index, expecting a key, the container's own pointer]
    stack: list[list[Any]] = []
    for match in _TOKEN.finditer(doc):
        token = match.group()
        head = token[0]
        if head == '"':
            value = token[1:-1] if "\\" not in token else orjson.loads(token)
            if not stack:
                replacement = visit("", None, value)
            else:
                frame = stack[-1]
                if frame[0] and frame[2]:
                    frame[1] = value
                    replacement = visit(f"{frame[3]}/{_pointer_part(value)}#key", None, value)
                else:
                    key = frame[1] if frame[0] else None
                    replacement = visit(f"{frame[3]}/{_pointer_part(frame[1])}", key, value)
            if replacement is not None:
                out.append(doc[last : match.start()])
                out.append(orjson.dumps(replacement).decode("utf-8"))
                last = match.end()
        elif head in "{[":
            base = f"{stack[-1][3]}/{_pointer_part(stack[-1][1])}" if stack else ""
            stack.append([True, "", True, base] if head == "{" else [False, 0, False, base])
        elif head in "}]":
            if stack:
                stack.pop()
        elif head == ",":
            if stack:
                if stack[-1][0]:
                    stack[-1][2] = True
                else:
                    stack[-1][1] += 1
        elif stack:  # ":"
            stack[-1][2] = False
    if last == 0:
        return doc
    out.append(doc[last:])
    return "".join(out)


def _looks_like_json(value: str) -> bool:
    stripped = value.strip()
    return len(stripped) >= 2 and stripped[0] in "{[" and stripped[-1] in "}]"


def redact_json_text(
    doc: str,
    sink: FindingSink = _ignore,
    where: list[str] | None = None,
    *,
    depth: int = 0,
    stream_dialect: str | None = None,
) -> str:
    """Return the JSON text `doc` with every secret in its strings replaced in place.

    `stream_dialect` names the dialect of a streamed call whose `/response_raw` holds its raw
    event stream (redacted with `redact_stream`).
    """
    where = where or []

    def visit(pointer: str, key: str | None, value: str) -> str | None:
        here = [*where, pointer]
        if stream_dialect is not None and pointer == "/response_raw" and depth == 0:
            new = redact_stream(value, stream_dialect, sink, here)
            return new if new != value else None
        if depth < _MAX_DEPTH and _looks_like_json(value):
            try:
                orjson.loads(value)
            except orjson.JSONDecodeError:
                pass
            else:
                new = redact_json_text(value, sink, here, depth=depth + 1)
                return new if new != value else None
        findings = scan_value(value, key)
        return _apply(value, findings, here, sink) if findings else None

    return _walk_strings(doc, visit)


def _relaxed(text: str) -> str:
    """`text` with JSON escapes undone a few levels deep, roughly: the prefilter's view of a line."""
    if "\\u" in text:
        text = _UNICODE_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text)
    for _ in range(3):
        if "\\" not in text:
            break
        for old, new in _RELAX:
            text = text.replace(old, new)
    return text


def _stream_dialect(record: Any) -> str | None:
    if isinstance(record, dict) and record.get("stream") is True and isinstance(record.get("response_raw"), str):
        name = record.get("dialect")
        return name if isinstance(name, str) and name in DIALECTS else None
    return None


def redact_record_line(line: bytes, sink: FindingSink = _ignore, where: list[str] | None = None) -> bytes:
    """Return one JSONL line (a capture record, a GenAI record, a tool call) with its secrets redacted.

    Bytes in, bytes out, for inline use before a record is written. A line with no secret comes
    back as the same object; a line that is not JSON is redacted as text, so it stays what it was.
    The line ending, if any, is kept.
    """
    body, ending = (line[:-1], line[-1:]) if line.endswith(b"\n") else (line, b"")
    text = body.decode("utf-8", "surrogateescape")
    if not scan_text(_relaxed(text)):
        if b'"stream":true' not in body.replace(b" ", b""):
            return line  # the fast path: no keyword, no secret, at any escape depth
        try:
            record = orjson.loads(body)
        except orjson.JSONDecodeError:
            return line
        dialect = _stream_dialect(record)
        if dialect is None or not _has_split_secret(record["response_raw"]):
            return line
    try:
        record = orjson.loads(body)
    except orjson.JSONDecodeError:
        new_text = redact_text(text, sink, where)
    else:
        new_text = redact_json_text(text, sink, where, stream_dialect=_stream_dialect(record))
        if new_text != text and isinstance(record, dict):
            new_text = rederive_digests(record, new_text)
    if new_text == text:
        return line
    return new_text.encode("utf-8", "surrogateescape") + ending


# ---------------------------------------------------------------------------------------------
# Recorded event streams


class _Event:
    """One SSE event block of a recorded stream: its lines, and which of them are `data:` lines."""

    __slots__ = ("data", "data_lines", "lines", "name")

    def __init__(self, lines: list[list[str]]) -> None:
        self.lines = lines  # [text, line ending]
        self.data_lines = [i for i, (text, _) in enumerate(lines) if text.startswith("data:")]
        self.name = next((t[6:].strip() for t, _ in lines if t.startswith("event:")), "")
        self.data = "\n".join(self._value(lines[i][0]) for i in self.data_lines)

    @staticmethod
    def _value(text: str) -> str:
        value = text[5:]
        return value.removeprefix(" ")

    def set_data(self, data: str) -> None:
        """Write `data` back into the same `data:` lines (redaction never adds or removes a newline)."""
        values = data.split("\n")
        if len(values) != len(self.data_lines):
            values = [data.replace("\n", "")] + [""] * (len(self.data_lines) - 1)
        for index, value in zip(self.data_lines, values):
            prefix = "data: " if self.lines[index][0].startswith("data: ") else "data:"
            self.lines[index][0] = prefix + value
        self.data = data


def _split_events(raw: str) -> list[_Event | str]:
    """The stream as event blocks, with the blank lines between them kept as plain strings."""
    parts = _LINE_SPLIT.split(raw)
    items: list[_Event | str] = []
    block: list[list[str]] = []
    for index in range(0, len(parts), 2):
        text = parts[index]
        ending = parts[index + 1] if index + 1 < len(parts) else ""
        if text == "" and index + 1 < len(parts):
            if block:
                items.append(_Event(block))
                block = []
            items.append(ending)
        elif text != "" or ending:
            block.append([text, ending])
    if block:
        items.append(_Event(block))
    return items


def _join_events(items: list[_Event | str]) -> str:
    return "".join(item if isinstance(item, str) else "".join(t + e for t, e in item.lines) for item in items)


def _reassembled_strings(raw: str, dialect_name: str) -> list[tuple[str | None, str]]:
    """Every (key, string) of the response the dialect reassembles from `raw` (empty when it cannot)."""
    tracker = StreamTracker(DIALECTS[dialect_name])
    tracker.feed(raw.encode("utf-8", "surrogateescape"))
    outcome = tracker.outcome()
    if outcome is None or outcome.response is None:
        return []
    found: list[tuple[str | None, str]] = []

    def visit(pointer: str, key: str | None, value: str) -> None:
        found.append((key, value))
        if _looks_like_json(value):
            try:
                _walk_strings(value, visit)
            except orjson.JSONDecodeError:
                pass

    _walk_strings(orjson.dumps(outcome.response).decode("utf-8"), visit)
    return found


def _has_split_secret(raw: str) -> bool:
    """True when the text some field's deltas build holds a secret no single event holds whole."""
    found = False

    def report(rule_id: str, secret: str, where: list[str], offset: int, length: int) -> None:
        nonlocal found
        found = True

    events = [item for item in _split_events(raw) if isinstance(item, _Event)]
    _redact_split(events, _stream_leaves(events), report, [])
    return found


def _stream_leaves(events: list[_Event]) -> dict[tuple[str, str], list[tuple[int, str]]]:
    """Every string value of every JSON event, grouped by (event type, JSON pointer), in stream order."""
    leaves: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for number, event in enumerate(events):
        if not _looks_like_json(event.data):
            continue

        def collect(pointer: str, key: str | None, value: str, number: int = number, name: str = event.name) -> None:
            if not pointer.endswith("#key"):
                leaves.setdefault((name, pointer), []).append((number, value))

        try:
            _walk_strings(event.data, collect)
        except orjson.JSONDecodeError:
            continue
    return leaves


def redact_stream(raw: str, dialect_name: str, sink: FindingSink = _ignore, where: list[str] | None = None) -> str:
    """Return a recorded SSE stream with every secret removed from every event that carried it.

    First, per event type and field, the deltas' texts are joined and scanned: a secret spanning
    several deltas becomes the marker in the first and is cut from the others, so the dialect
    reassembles the marker exactly where the secret was. Then whole secrets are redacted inside
    each event's JSON. Last, the dialect reassembles the result; a secret still readable there
    (pieces interleaved with another choice's or block's deltas) is looked for as a sequence of
    values in successive events and cut from them, and should it still be readable after that,
    the whole stream is replaced by a marker.
    """
    where = where or []
    items = _split_events(raw)
    events = [item for item in items if isinstance(item, _Event)]
    # Split secrets first, on the deltas as recorded: once a long enough first piece is redacted
    # on its own, the pieces after it no longer join into anything a rule recognises.
    _redact_split(events, _stream_leaves(events), sink, where)
    for number, event in enumerate(events):
        here = [*where, f"event {number}"]
        is_json = _looks_like_json(event.data)
        if is_json:
            try:
                orjson.loads(event.data)
            except orjson.JSONDecodeError:
                is_json = False
        new = redact_json_text(event.data, sink, here, depth=1) if is_json else redact_text(event.data, sink, here)
        if new != event.data:
            event.set_data(new)
    redacted = _join_events(items)
    leftover = _leftover(redacted, dialect_name)
    if leftover and all(_cut_chain(events, rule_id, secret, sink, where) for rule_id, secret in leftover):
        redacted = _join_events(items)
        leftover = _leftover(redacted, dialect_name)
    if leftover:
        sink(leftover[0][0], "", [*where, "stream"], 0, len(raw.encode("utf-8", "surrogateescape")))
        return marker("stream-unverified")
    return redacted


def _leftover(raw: str, dialect_name: str) -> list[tuple[str, str]]:
    """(rule id, secret) of every secret still readable in what the dialect reassembles from `raw`."""
    return [
        (finding.rule_id, value[finding.start : finding.end])
        for key, value in _reassembled_strings(raw, dialect_name)
        for finding in scan_value(value, key)
    ]


_MAX_HYPOTHESES = 256


def _cut_chain(events: list[_Event], rule_id: str, secret: str, sink: FindingSink, where: list[str]) -> bool:
    """Find `secret` spelled by string values of successive events, in any fields, skipping the
    values in between (deltas of another choice or block), and cut it from them; False if no
    sequence of values spells it."""
    flat: list[tuple[int, str, str]] = []
    for number, event in enumerate(events):
        if _looks_like_json(event.data):

            def collect(pointer: str, key: str | None, value: str, number: int = number) -> None:
                if not pointer.endswith("#key") and value:
                    flat.append((number, pointer, value))

            try:
                _walk_strings(event.data, collect)
            except orjson.JSONDecodeError:
                continue
    # A hypothesis: how much of `secret` is spelled so far, by which (leaf, start, end) pieces.
    hypotheses: list[tuple[int, list[tuple[int, int, int]]]] = []
    chain: list[tuple[int, int, int]] | None = None
    for index, (_, _, value) in enumerate(flat):
        grown: list[tuple[int, list[tuple[int, int, int]]]] = []
        for matched, parts in hypotheses:
            rest = secret[matched:]
            if value.startswith(rest):
                chain = [*parts, (index, 0, len(rest))]
                break
            if rest.startswith(value):
                grown.append((matched + len(value), [*parts, (index, 0, len(value))]))
        if chain is not None:
            break
        for length in range(min(len(value), len(secret) - 1), 0, -1):
            if value.endswith(secret[:length]):
                grown.append((length, [(index, len(value) - length, len(value))]))
        hypotheses = (hypotheses + grown)[-_MAX_HYPOTHESES:]
    if chain is None or len(chain) < 2:
        return False
    first_event = flat[chain[0][0]][0]
    sink(
        rule_id, secret, [*where, f"event {first_event}", flat[chain[0][0]][1], "split"], 0, len(secret.encode("utf-8"))
    )
    changes: dict[int, dict[str, str]] = {}
    for order, (index, start, end) in enumerate(chain):
        number, pointer, value = flat[index]
        current = changes.setdefault(number, {}).get(pointer, value)
        changes[number][pointer] = current[:start] + (marker(rule_id) if order == 0 else "") + current[end:]
    for number, replaced in changes.items():

        def replace(pointer: str, key: str | None, value: str, replaced: dict[str, str] = replaced) -> str | None:
            return replaced.get(pointer)

        events[number].set_data(_walk_strings(events[number].data, replace))
    return True


def _redact_split(
    events: list[_Event], leaves: dict[tuple[str, str], list[tuple[int, str]]], sink: FindingSink, where: list[str]
) -> None:
    """Find secrets in the text each (event type, field) builds across events, and cut them from the pieces."""
    edits: dict[int, dict[str, str]] = {}  # event number -> pointer -> new value
    for (_, pointer), pieces in leaves.items():
        if len(pieces) < 2:
            continue
        joined = "".join(value for _, value in pieces)
        findings = scan_text(joined)
        if not findings:
            continue
        starts: list[int] = []
        position = 0
        for _, value in pieces:
            starts.append(position)
            position += len(value)
        cuts: dict[int, list[tuple[int, int, str]]] = {}  # piece -> (start, end, replacement)
        for finding in findings:
            touched = [
                i for i, start in enumerate(starts) if start < finding.end and finding.start < start + len(pieces[i][1])
            ]
            if len(touched) < 2:
                continue  # whole inside one event: already redacted there
            secret = joined[finding.start : finding.end]
            first = pieces[touched[0]][0]
            sink(finding.rule_id, secret, [*where, f"event {first}", pointer, "split"], 0, len(secret.encode("utf-8")))
            for order, i in enumerate(touched):
                local_start = max(0, finding.start - starts[i])
                local_end = min(len(pieces[i][1]), finding.end - starts[i])
                cuts.setdefault(i, []).append((local_start, local_end, marker(finding.rule_id) if order == 0 else ""))
        values = [value for _, value in pieces]
        for i, piece_cuts in cuts.items():
            value = values[i]
            for local_start, local_end, replacement in sorted(piece_cuts, reverse=True):
                value = value[:local_start] + replacement + value[local_end:]
            values[i] = value
        for i, (number, value) in enumerate(pieces):
            if values[i] != value:
                edits.setdefault(number, {})[pointer] = values[i]
    for number, changes in edits.items():
        event = events[number]

        def replace(pointer: str, key: str | None, value: str, changes: dict[str, str] = changes) -> str | None:
            return changes.get(pointer)

        event.set_data(_walk_strings(event.data, replace))
