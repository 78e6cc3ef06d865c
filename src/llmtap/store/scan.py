"""Splitting a capture file's bytes into lines: the one parse path behind strict and tolerant reads.

A last segment without its newline is a record when it parses as a whole JSON object (a writer,
or the reference system's store, lost only the newline; the reference's reader counts it too);
anything else there is a torn tail: a write in progress or a crashed writer's partial line, not
counted. The next committer ends the segment with a newline, so neither case shifts a record.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

__all__ = ["is_torn", "scan_lines"]

_JSON_TYPE_NAMES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


def scan_lines(data: bytes) -> Iterator[tuple[int, int, dict[str, Any] | None, str]]:
    """Yield (1-based line number, call_index, record or None, problem) per complete non-blank line.

    The one parse path behind strict and tolerant reads. A last segment without its newline is
    yielded only when it is a whole JSON object (see `is_torn`).
    """
    start = line_number = call_index = 0
    while (end := data.find(b"\n", start)) >= 0:
        segment = data[start:end]
        start = end + 1
        line_number += 1
        if not segment.strip():
            continue
        try:
            value = orjson.loads(segment)
        except orjson.JSONDecodeError as exc:
            yield line_number, call_index, None, f"it is not valid JSON ({exc})"
        else:
            kind = "object" if isinstance(value, dict) else _JSON_TYPE_NAMES.get(type(value), "null")
            yield line_number, call_index, value if kind == "object" else None, f"it holds a JSON {kind}, not an object"
        call_index += 1
    if (record := _whole_record(data[start:])) is not None:
        yield line_number + 1, call_index, record, ""


def is_torn(data: bytes) -> bool:
    """True when `data` ends in a segment without its newline that is not a whole JSON object."""
    if not data or data.endswith(b"\n"):
        return False
    return _whole_record(data[data.rfind(b"\n") + 1 :]) is None


def _whole_record(segment: bytes) -> dict[str, Any] | None:
    """The segment as a JSON object, or None when it is empty, blank, cut short or not an object."""
    if not segment.strip():
        return None
    try:
        value = orjson.loads(segment)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
