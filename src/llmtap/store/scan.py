"""Splitting a capture file's bytes into lines: the one parse path behind strict and tolerant reads."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

__all__ = ["scan_lines"]

_JSON_TYPE_NAMES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


def scan_lines(data: bytes) -> Iterator[tuple[int, int, dict[str, Any] | None, str]]:
    """Yield (1-based line number, call_index, record or None, problem) per complete non-blank line.

    The one parse path behind strict and tolerant reads.
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
