"""Token templates: reading a stream's plain token events without parsing their JSON.

A model server writes every token of a stream as the same event but for the token's text:

    data: {"id":"chatcmpl-1",...,"choices":[{"index":0,"delta":{"content":" the"},...}]}
    event: content_block_delta
    data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" the"}}

An assembler that has just applied such an event the general way learns its template: the event
name, and the text before and after the token. A later event that is the same name and text around
a token parses to the learnt event with only the token changed; the assembler appends its token and
skips parsing and walking the JSON. A literal token (no quote, escape or control character) is its
own text; one with escapes (a newline, a quote) is decoded alone, as the JSON string it must be.
Values that change from event to event but mean nothing to the assembler (a Responses event's
`sequence_number` and `obfuscation`) may be named as varying: the template then accepts any plain
string or integer in their place. `take_raw` does the same for a whole chunk of the stream that is
one such event, before SSE decoding. Anything else is left to the general path, which stays the
reference: the dialects' property tests hold the two to the same result.
"""

from __future__ import annotations

import functools
import re
from typing import Any, AnyStr, Generic, Protocol

import orjson

from .sse import SSEEvent

__all__ = ["TokenTemplate"]

# What a token may not hold to be read straight from the event's text: JSON's escapes and control
# characters (which make the event malformed), and the quote that would end the string.
_NOT_LITERAL = re.compile(r'[\x00-\x1f"\\]')
_NOT_LITERAL_BYTES = re.compile(rb'[\x00-\x1f"\\]')


def _string_body(token: str | bytes) -> str | None:
    """The text of `token` read as the inside of a JSON string, or None when it is not one whole,
    valid string (an unescaped quote or control character, a bad escape, bytes that are not UTF-8)."""
    try:
        text = orjson.loads(b'"' + token + b'"' if isinstance(token, bytes) else f'"{token}"')
    except orjson.JSONDecodeError:
        return None
    return text if type(text) is str else None


# What a varying value may be in a later event: a string without escapes, or any JSON integer.
_ANY_STRING = (re.compile(r'"[^"\\\x00-\x1f]*"'), re.compile(rb'"[^"\\\x00-\x1f]*"'))
_ANY_INTEGER = (re.compile(r"-?(?:0|[1-9][0-9]*)"), re.compile(rb"-?(?:0|[1-9][0-9]*)"))


@functools.cache
def _keyed_values(varying: tuple[str, ...]) -> re.Pattern[str]:
    """`"key": value` for any of the `varying` keys, its value a plain string or an integer. In
    an event that parsed, such text is always a key and its value: inside a string, its quotes
    would be escaped."""
    keys = "|".join(re.escape(key) for key in varying)
    return re.compile(rf'"(?:{keys})"[ \t]*:[ \t]*("[^"\\\x00-\x1f]*"|-?(?:0|[1-9][0-9]*))')


def _open_pieces(text: str, varying: tuple[str, ...]) -> tuple[list[str], list[bool]]:
    """`text` cut around the values of its `varying` keys: the pieces between them, and for each
    value whether it is a string (else an integer)."""
    pieces: list[str] = []
    strings: list[bool] = []
    done = 0
    for pair in _keyed_values(varying).finditer(text):
        pieces.append(text[done : pair.start(1)])
        strings.append(pair.group(1)[0] == '"')
        done = pair.end(1)
    pieces.append(text[done:])
    return pieces, strings


def _value_patterns(strings: list[bool], raw: bool) -> list[re.Pattern[Any]]:
    return [(_ANY_STRING if string else _ANY_INTEGER)[raw] for string in strings]


def _match_pieces(data: AnyStr, start: int, pieces: list[AnyStr], values: list[re.Pattern[AnyStr]]) -> int:
    """Where `pieces`, with a value matching each of `values` between them, end in `data` read
    from `start`; -1 when they do not match there."""
    position = start
    for index, piece in enumerate(pieces):
        if not data.startswith(piece, position):
            return -1
        position += len(piece)
        if index < len(values):
            value = values[index].match(data, position)
            if value is None:
                return -1
            position = value.end()
    return position


class _OpenEvent(Generic[AnyStr]):
    """A token event with varying values: the pieces before and after the token, and the patterns
    of the values between them, as text (for decoded events) or bytes (for whole chunks)."""

    __slots__ = ("before", "before_values", "after", "after_values")

    def __init__(self, before: list[AnyStr], before_values: list[re.Pattern[AnyStr]],
                 after: list[AnyStr], after_values: list[re.Pattern[AnyStr]]) -> None:
        self.before: list[AnyStr] = before
        self.before_values: list[re.Pattern[AnyStr]] = before_values
        self.after: list[AnyStr] = after
        self.after_values: list[re.Pattern[AnyStr]] = after_values

    def token_of(self, data: AnyStr) -> AnyStr | None:
        """The token of `data` when it is this event with other values and token; else None.

        The token ends where the text after it first starts: its opening quote is the token's
        closing one, and a quote inside a valid token is escaped. A token that is not valid is
        refused when it is decoded."""
        start = _match_pieces(data, 0, self.before, self.before_values)
        if start < 0:
            return None
        end = data.find(self.after[0], start)
        if end <= start or _match_pieces(data, end, self.after, self.after_values) != len(data):
            return None
        return data[start:end]


class TokenSink(Protocol):
    """Where a template's tokens go: a list of texts, or an assembler's growing text."""

    def append(self, text: str, /) -> None: ...


# JSON's whitespace, to drop from the text after a token (and nothing else: a form feed there
# would make the event malformed, so it must not compare equal).
_JSON_SPACE = str.maketrans("", "", " \t\n\r")


class TokenTemplate:
    """The text around the token of one kind of token event; tokens that fit go to `sink`."""

    __slots__ = (
        "event_name", "prefix", "suffix", "least_length", "sink", "raw_prefix", "raw_suffix", "bare_suffix",
        "raw_bare_suffix", "open_event", "raw_open_event",
    )

    def __init__(
        self, event_name: str | None, prefix: str, suffix: str, sink: TokenSink, varying: tuple[str, ...] = ()
    ) -> None:
        self.event_name = event_name
        self.prefix = prefix
        self.suffix = suffix
        self.least_length = len(prefix) + len(suffix)
        self.sink = sink
        # With varying values in it, the event is matched piece by piece instead.
        before, before_strings = _open_pieces(prefix, varying) if varying else ([prefix], [])
        after, after_strings = _open_pieces(suffix, varying) if varying else ([suffix], [])
        opened = bool(before_strings or after_strings)
        self.open_event: _OpenEvent[str] | None = None
        self.raw_open_event: _OpenEvent[bytes] | None = None
        if opened:
            self.open_event = _OpenEvent(before, _value_patterns(before_strings, False),
                                         after, _value_patterns(after_strings, False))
        # Anthropic pads each event with a varying run of spaces before its last brace. When the
        # text after the token is only its closing quote and closing brackets, whitespace there
        # means nothing to JSON, and the suffix is also matched without it.
        bare = "" if suffix.strip('"}] \t\n\r') else suffix.translate(_JSON_SPACE)  # translate is slow
        self.bare_suffix = bare if bare[:1] == '"' and not bare[1:].strip("}]") and not opened else None
        # The same event as a whole chunk of the stream (an optional `event:` line, one `data:`
        # line, the blank line), when it can be one: data of several lines cannot.
        self.raw_prefix: bytes | None = None
        self.raw_suffix = b""
        self.raw_bare_suffix = bare.encode() if self.bare_suffix is not None else None
        text = f"{event_name or ''}{prefix}{suffix}"
        if "\n" not in text and "\r" not in text:
            name_line = b"event: " + event_name.encode() + b"\n" if event_name is not None else b""
            self.raw_prefix = name_line + b"data: " + prefix.encode()
            self.raw_suffix = suffix.encode() + b"\n\n"
            if opened:
                raw_before = [piece.encode() for piece in before]
                raw_before[0] = name_line + b"data: " + raw_before[0]
                raw_after = [piece.encode() for piece in after]
                raw_after[-1] += b"\n\n"
                self.raw_open_event = _OpenEvent(raw_before, _value_patterns(before_strings, True),
                                                 raw_after, _value_patterns(after_strings, True))

    @classmethod
    def around(
        cls, event: SSEEvent, key: str, token: str, sink: TokenSink, varying: tuple[str, ...] = ()
    ) -> TokenTemplate | None:
        """The template of `event`, an event just applied whose JSON holds `token` as the string
        value of `key`; None unless the token is literal and occurs nowhere else in the event.
        The values of `varying` keys may be any plain string or integer in later events."""
        data = event.data
        if not token or _NOT_LITERAL.search(token) or data.find(token) != data.rfind(token):
            return None
        for opening in (f'"{key}":"', f'"{key}": "'):
            start = data.find(opening + token + '"')
            if start >= 0:
                start += len(opening)
                return cls(event.event, data[:start], data[start + len(token) :], sink, varying)
        return None

    def take(self, event: SSEEvent) -> bool:
        """Append the token of an event that fits; False to apply it the general way."""
        data = event.data
        token: str | None
        if event.event != self.event_name:
            return False
        if self.open_event is not None:
            token = self.open_event.token_of(data)
            if token is None:
                return False
        elif not data.startswith(self.prefix):
            return False
        elif data.endswith(self.suffix) and len(data) > self.least_length:
            token = data[len(self.prefix) : len(data) - len(self.suffix)]
        else:
            closing = data.rfind('"', len(self.prefix))  # the suffix's quote: its brackets hold none
            if self.bare_suffix is None or closing <= len(self.prefix):
                return False
            if data[closing:].translate(_JSON_SPACE) != self.bare_suffix:
                return False
            token = data[len(self.prefix) : closing]
        return self._take_token(token)

    def take_raw(self, chunk: bytes) -> bool:
        """`take` for a whole chunk of the stream that is one such event, before SSE decoding.
        The caller has checked that the decoder is at an event boundary."""
        raw_prefix = self.raw_prefix
        if raw_prefix is None:
            return False
        while chunk.startswith(b":"):  # comment lines before the event carry nothing
            chunk = chunk.partition(b"\n")[2]
        start, raw_suffix = len(raw_prefix), self.raw_suffix
        token: bytes | None
        if self.raw_open_event is not None:
            token = self.raw_open_event.token_of(chunk)
            if token is None:
                return False
        elif not chunk.startswith(raw_prefix) or not chunk.endswith(b"\n\n"):
            return False
        elif chunk.endswith(raw_suffix) and len(chunk) > start + len(raw_suffix):
            token = chunk[start : len(chunk) - len(raw_suffix)]
        else:
            closing = chunk.rfind(b'"', start)  # the suffix's quote: its brackets hold none
            if self.raw_bare_suffix is None or closing <= start:
                return False
            # The rest of the line, spaces and tabs dropped, must be the bare suffix exactly: a CR
            # or LF left in it (which would end the data line) or any other byte fails the test.
            if chunk[closing:-2].translate(None, b" \t") != self.raw_bare_suffix:
                return False
            token = chunk[start:closing]
        return self._take_token(token)

    def _take_token(self, token: str | bytes) -> bool:
        """Append the text `token` stands for: a literal token is that text (bytes as UTF-8), one
        with escapes is decoded as the inside of a JSON string. False when it cannot be read so:
        the general path decides (and replaces bytes that are not UTF-8)."""
        text: str | None
        if isinstance(token, bytes):
            if _NOT_LITERAL_BYTES.search(token):
                text = _string_body(token)
            else:
                try:
                    text = token.decode("utf-8")
                except UnicodeDecodeError:
                    return False
        else:
            text = _string_body(token) if _NOT_LITERAL.search(token) else token
        if text is None:
            return False
        self.sink.append(text)
        return True
