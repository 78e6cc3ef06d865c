"""What the store hands back: where an append landed, and everything a read found.

Kept apart from CaptureStore so the group-commit machinery can name these types without
importing the store that drives it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["AppendResult", "ReadResult", "append_result"]


@dataclass(frozen=True)
class AppendResult:
    """Where a durable record landed; `late` when a clear() fence diverted it to the late file."""

    path: Path
    late: bool


@functools.lru_cache(maxsize=4096)
def append_result(path: str, late: bool) -> AppendResult:
    """Results are immutable, so appends to a busy rollout share one instead of building Paths."""
    return AppendResult(Path(path), late)


@dataclass(frozen=True)
class ReadResult:
    """Everything one read of a rollout's capture found, damage included.

    `entries` pairs each valid record with its `call_index` (0-based position among non-blank
    complete lines); `invalid_lines` holds the positions of damaged lines. `torn_tail` means the
    file ends in an unterminated segment that is not a whole JSON object, so not a line yet (a
    whole object there lost only its newline and is an entry).
    """

    rollout_id: str
    exists: bool
    entries: list[tuple[int, dict[str, Any]]]
    invalid_lines: list[int]
    torn_tail: bool
    incomplete: bool
    late_writes: int
    capture_failures: int = 0  # failed appends the incomplete marker counts (at least 1 when marked)

    @property
    def invalid_count(self) -> int:
        """Number of damaged lines skipped."""
        return len(self.invalid_lines)

