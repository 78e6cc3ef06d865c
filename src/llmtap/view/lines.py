"""Turning the bytes of a capture file into its calls, from any line boundary onwards.

The viewer reads capture files itself, through `files.read_bounded` (no links, no FIFOs, bounded),
so that a live page reads only the lines appended since its last look. Each line becomes a
`ModelCallRecord` through the public `ModelCallRecord.from_raw_line`, numbered the way the
store's readers number them: blank lines take no `call_index`, damaged lines take one (so they
never shift the others), and an unterminated last segment is not a line yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from ..records import ModelCallRecord
from .files import FileState, read_bounded

__all__ = ["CallLine", "LineBatch", "read_calls", "split_lines"]

READ_STEP_BYTES = 16 << 20  # bytes read per step while catching up on a file
MAX_LINE_BYTES = 256 << 20  # a longer line is counted as damaged and skipped, never buffered whole


@dataclass(frozen=True, slots=True)
class CallLine:
    """One complete non-blank line: its `call_index`, the parsed line and its record (None if damaged)."""

    call_index: int
    line: dict[str, Any] | None
    record: ModelCallRecord | None


@dataclass(frozen=True, slots=True)
class LineBatch:
    """The lines read from `offset` on, and where the next read starts."""

    lines: list[CallLine]
    next_offset: int
    next_index: int
    torn_tail: bool
    state: FileState


def split_lines(data: bytes, first_index: int) -> tuple[list[CallLine], int, int]:
    """Parse the complete lines of `data`; return them, the bytes consumed and the next call_index."""
    lines: list[CallLine] = []
    start = 0
    index = first_index
    while (end := data.find(b"\n", start)) >= 0:
        segment = data[start:end]
        start = end + 1
        if not segment.strip():
            continue
        lines.append(_parse(segment, index))
        index += 1
    return lines, start, index


def _parse(segment: bytes, index: int) -> CallLine:
    try:
        value = orjson.loads(segment)
    except orjson.JSONDecodeError:
        return CallLine(index, None, None)
    if not isinstance(value, dict):
        return CallLine(index, None, None)
    try:
        return CallLine(index, value, ModelCallRecord.from_raw_line(value, index))
    except ValueError:
        return CallLine(index, value, None)


def read_calls(path: str, *, offset: int = 0, first_index: int = 0, keep_lines: bool = True) -> LineBatch:
    """Read the lines of the capture file `path` that start at or after byte `offset`.

    `offset` must be a line boundary (0, or a `next_offset` returned earlier). Reads in bounded
    steps; a line longer than `MAX_LINE_BYTES` is counted as one damaged line and skipped.
    With `keep_lines=False` the parsed line dicts are dropped (summaries need only the records).
    """
    lines: list[CallLine] = []
    index = first_index
    position = offset  # the next line boundary not yet consumed
    carry = b""
    skip_from: int | None = None  # inside an oversized line that began here: drop bytes until its newline
    read_at = offset
    while True:
        data, state = read_bounded(path, offset=read_at, limit=READ_STEP_BYTES)
        read_at += len(data)
        if not data:
            break
        if skip_from is not None:
            newline = data.find(b"\n")
            if newline >= 0:
                position = read_at - len(data) + newline + 1
                lines.append(CallLine(index, None, None))
                index += 1
                skip_from = None
                carry = data[newline + 1 :]
                parsed, consumed, index = split_lines(carry, index)
                lines.extend(_strip(parsed, keep_lines))
                position += consumed
                carry = carry[consumed:]
        else:
            block = carry + data
            parsed, consumed, index = split_lines(block, index)
            lines.extend(_strip(parsed, keep_lines))
            position += consumed
            carry = block[consumed:]
            if len(carry) > MAX_LINE_BYTES:
                skip_from, carry = position, b""
        if len(data) < READ_STEP_BYTES:
            break
    return LineBatch(lines, position, index, state.size > position, state)


def _strip(parsed: list[CallLine], keep_lines: bool) -> list[CallLine]:
    if keep_lines:
        return parsed
    return [CallLine(line.call_index, None, line.record) for line in parsed]
