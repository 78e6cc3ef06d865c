"""The rows of a rollouts file (`llmtap collect` / `llmtap attach` output), indexed by rollout id.

Each row is parsed once for what the home table shows (its reward, the terminal attribution,
a collection error, the attachment's metrics and gaps) and remembered by byte offset, so the
rollout page reads back only its own row. The file is append-only while a collection runs, so a
refresh reads only the rows appended since; a file replaced (a resume rewrites it atomically) or
cut shorter is indexed again from the start.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import orjson

from ..store import ROLLOUT_ID_PATTERN
from .files import FileState, file_state, read_bounded
from .summary import RolloutSummary

__all__ = ["RowInfo", "RowsIndex", "rollout_id_of_row"]

CAPTURE_KEY = "ng_model_call_capture"  # the spec's attachment
COLLECT_ERROR_KEY = "ng_collect_error"
READ_STEP_BYTES = 16 << 20
MAX_ROW_BYTES = 256 << 20


@dataclass(slots=True)
class RowInfo:
    """What the home table needs from one row, and where the row is in the file."""

    offset: int
    length: int
    reward: float | None
    attributed: bool | None  # None: the row has no attribution
    attribution_method: str
    attribution_reason: str
    collect_error: str | None
    gaps: tuple[str, ...]
    summary: RolloutSummary | None  # from the attachment's metrics, for rows whose capture is not at hand


def rollout_id_of_row(row: dict[str, Any]) -> str | None:
    """The rollout id a row names: its attachment's, else `_ng_rollout_id`; None if neither is a string."""
    capture = row.get(CAPTURE_KEY)
    if isinstance(capture, dict) and isinstance(capture.get("rollout_id"), str):
        return str(capture["rollout_id"])
    value = row.get("_ng_rollout_id")
    return value if isinstance(value, str) else None


def _row_info(row: dict[str, Any], rollout_id: str, offset: int, length: int) -> RowInfo:
    found = row.get(CAPTURE_KEY)
    capture: dict[str, Any] = found if isinstance(found, dict) else {}
    attribution = capture.get("attribution")
    attribution = attribution if isinstance(attribution, dict) else None
    reward = row.get("reward")
    error = row.get(COLLECT_ERROR_KEY)
    gaps = tuple(str(gap.get("code")) for gap in capture.get("gaps") or [] if isinstance(gap, dict))
    return RowInfo(
        offset=offset,
        length=length,
        reward=float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None,
        attributed=bool(attribution.get("attributed")) if attribution is not None else None,
        attribution_method=str(attribution.get("method") or "") if attribution else "",
        attribution_reason=str(attribution.get("reason") or "") if attribution else "",
        collect_error=str(error.get("type")) if isinstance(error, dict) else None,
        gaps=gaps,
        summary=_summary_from_attachment(rollout_id, capture),
    )


def _summary_from_attachment(rollout_id: str, capture: dict[str, Any]) -> RolloutSummary | None:
    """A summary built from the attached calls (normalized records without payloads)."""
    from ..records import ModelCallRecord

    calls = capture.get("calls")
    if not isinstance(calls, list):
        return None
    summary = RolloutSummary(rollout_id)
    from .lines import CallLine

    lines = []
    for position, call in enumerate(calls):
        if not isinstance(call, dict):
            continue
        index = call["call_index"] if isinstance(call.get("call_index"), int) else position
        record = _record_from_dict(ModelCallRecord, call, index)
        lines.append(CallLine(index, None, record))
    summary.update(lines)
    return summary


def _record_from_dict(cls: Any, call: dict[str, Any], index: int) -> Any:
    """A ModelCallRecord from an attached call (the record's own field names); None if it has no id."""
    from dataclasses import fields

    if not isinstance(call.get("model_call_id"), str):
        return None
    values = {f.name: call[f.name] for f in fields(cls) if f.name in call}
    values["call_index"] = index
    for name in ("tool_calls", "served_item_ids"):
        if not isinstance(values.get(name, []), list):
            values.pop(name)
    try:
        return cls(**values)
    except TypeError:
        return None


class RowsIndex:
    """The rows of one rollouts file by rollout id (the last row wins: a retried rollout's final row)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.rows: dict[str, RowInfo] = {}
        self.order: list[str] = []
        self.unreadable = 0
        self.version = 0
        self.error: str | None = None
        self._state: FileState | None = None
        self._offset = 0
        self._lock = threading.Lock()

    def refresh(self) -> None:
        """Read the rows appended since the last refresh (all of them after a rewrite)."""
        with self._lock:
            state = file_state(self.path)
            if state == self._state:
                return
            if state is None:
                self.error = f"'{self.path}' is missing or not a regular file."
                return
            if self._state is None or state.inode != self._state.inode or state.size < self._offset:
                self.rows, self.order, self.unreadable, self._offset = {}, [], 0, 0
            self._read_from(self._offset)
            self._state = state
            self.version += 1

    def _read_from(self, offset: int) -> None:
        carry = b""
        position = offset
        while True:
            try:
                data, _ = read_bounded(self.path, offset=position + len(carry), limit=READ_STEP_BYTES)
            except OSError as exc:
                self.error = f"Could not read '{self.path}' ({exc}); the viewer reads regular files only."
                return
            block = carry + data
            start = 0
            while (end := block.find(b"\n", start)) >= 0:
                self._take(block[start:end], position + start)
                start = end + 1
            position += start
            carry = block[start:]
            if len(carry) > MAX_ROW_BYTES:
                self.unreadable += 1
                position += len(carry)
                carry = b""
            if len(data) < READ_STEP_BYTES:
                break
        self._offset = position

    def _take(self, line: bytes, offset: int) -> None:
        if not line.strip():
            return
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            self.unreadable += 1
            return
        rollout_id = rollout_id_of_row(row) if isinstance(row, dict) else None
        if rollout_id is None or len(rollout_id) > 200 or ROLLOUT_ID_PATTERN.fullmatch(rollout_id) is None:
            self.unreadable += 1
            return
        if rollout_id not in self.rows:
            self.order.append(rollout_id)
        self.rows[rollout_id] = _row_info(row, rollout_id, offset, len(line))

    def row(self, rollout_id: str) -> dict[str, Any] | None:
        """Read one row back from the file by its offset; None when it is gone or changed."""
        info = self.rows.get(rollout_id)
        if info is None:
            return None
        try:
            data, _ = read_bounded(self.path, offset=info.offset, limit=info.length)
            row = orjson.loads(data)
        except (OSError, orjson.JSONDecodeError):
            return None
        return row if isinstance(row, dict) and rollout_id_of_row(row) == rollout_id else None
