"""Token templates: reading a stream's plain token events without parsing their JSON.

A model server writes every token of a stream as the same event but for the token's text:

    data: {"id":"chatcmpl-1",...,"choices":[{"index":0,"delta":{"content":" the"},...}]}
    event: content_block_delta
    data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" the"}}

An assembler that has just applied such an event the general way learns its template: the event
name, and the text before and after the token. A later event that is the same name and text around
a token parses to the learnt event with only the token changed; the assembler appends its token and
skips parsing and walking the JSON. A literal token (no quote, escape or control character) is its
own text; one with escapes (a newline, a quote) is decoded alone, as the JSON string it must be. `take_raw` does the same for a whole chunk of the stream that is one
such event, before SSE decoding. Anything else is left to the general path, which stays the
reference: the dialects' property tests hold the two to the same result.
"""

from __future__ import annotations

import re

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


# JSON's whitespace, to drop from the text after a token (and nothing else: a form feed there
# would make the event malformed, so it must not compare equal).
_JSON_SPACE = str.maketrans("", "", " \t\n\r")


class TokenTemplate:
    """The text around the token of one kind of token event; tokens that fit go to `sink`."""

    __slots__ = (
        "event_name", "prefix", "suffix", "least_length", "sink", "raw_prefix", "raw_suffix", "bare_suffix",
        "raw_bare_suffix",
    )

    def __init__(self, event_name: str | None, prefix: str, suffix: str, sink: list[str]) -> None:
        self.event_name = event_name
        self.prefix = prefix
        self.suffix = suffix
        self.least_length = len(prefix) + len(suffix)
        self.sink = sink
        # Anthropic pads each event with a varying run of spaces before its last brace. When the
        # text after the token is only its closing quote and closing brackets, whitespace there
        # means nothing to JSON, and the suffix is also matched without it.
        bare = suffix.translate(_JSON_SPACE)
        self.bare_suffix = bare if bare[:1] == '"' and not bare[1:].strip("}]") else None
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

    @classmethod
    def around(cls, event: SSEEvent, key: str, token: str, sink: list[str]) -> TokenTemplate | None:
        """The template of `event`, an event just applied whose JSON holds `token` as the string
        value of `key`; None unless the token is literal and occurs nowhere else in the event."""
        data = event.data
        if not token or _NOT_LITERAL.search(token) or data.find(token) != data.rfind(token):
            return None
        for opening in (f'"{key}":"', f'"{key}": "'):
            start = data.find(opening + token + '"')
            if start >= 0:
                start += len(opening)
                return cls(event.event, data[:start], data[start + len(token) :], sink)
        return None

    def take(self, event: SSEEvent) -> bool:
        """Append the token of an event that fits; False to apply it the general way."""
        data = event.data
        if event.event != self.event_name or not data.startswith(self.prefix):
            return False
        if data.endswith(self.suffix) and len(data) > self.least_length:
            token: str | None = data[len(self.prefix) : len(data) - len(self.suffix)]
        else:
            closing = data.rfind('"', len(self.prefix))  # the suffix's quote: its brackets hold none
            if self.bare_suffix is None or closing <= len(self.prefix):
                return False
            if data[closing:].translate(_JSON_SPACE) != self.bare_suffix:
                return False
            token = data[len(self.prefix) : closing]
        if _NOT_LITERAL.search(token):
            token = _string_body(token)
            if token is None:
                return False
        self.sink.append(token)
        return True

    def take_raw(self, chunk: bytes) -> bool:
        """`take` for a whole chunk of the stream that is one such event, before SSE decoding.
        The caller has checked that the decoder is at an event boundary."""
        raw_prefix = self.raw_prefix
        if raw_prefix is None:
            return False
        while chunk.startswith(b":"):  # comment lines before the event carry nothing
            chunk = chunk.partition(b"\n")[2]
        if not chunk.startswith(raw_prefix) or not chunk.endswith(b"\n\n"):
            return False
        start, raw_suffix = len(raw_prefix), self.raw_suffix
        if chunk.endswith(raw_suffix) and len(chunk) > start + len(raw_suffix):
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
        if _NOT_LITERAL_BYTES.search(token):
            text = _string_body(token)
            if text is None:
                return False
            self.sink.append(text)
            return True
        try:
            self.sink.append(token.decode("utf-8"))
        except UnicodeDecodeError:
            return False  # the general path replaces what does not decode
        return True
