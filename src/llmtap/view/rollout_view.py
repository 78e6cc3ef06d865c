"""A rollout's calls, metrics, timeline and (for attached rows) trajectory and terminal attribution."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..records import ModelCallRecord
from ..store.readers import aggregate_model_call_metrics
from .files import FileState, file_state
from .lines import CallLine, read_calls
from .rows import CAPTURE_KEY, _record_from_dict
from .sources import Source
from .timeline import Timeline, layout_timeline

__all__ = ["RolloutView", "load_rollout", "read_rollout_lines"]

TRAJECTORY_KEY = "ng_trajectory"
_CACHE_SIZE = 8


@dataclass
class RolloutView:
    """Everything the rollout page and its live fragment draw."""

    rollout_id: str
    lines: list[CallLine]
    records: list[ModelCallRecord]
    unreadable: list[int]
    torn_tail: bool
    incomplete: bool
    has_payloads: bool
    metrics: dict[str, Any]
    timeline: Timeline
    row: dict[str, Any] | None = None
    attribution: dict[str, Any] | None = None
    terminal_id: str | None = None
    terminal_witnesses: list[str] = field(default_factory=list)
    trajectory: dict[str, Any] | None = None
    gaps: list[dict[str, Any]] = field(default_factory=list)
    state: FileState | None = None


class _LineCache:
    """The last few rollouts read, keyed by file state, so j/k through one rollout reads it once."""

    def __init__(self) -> None:
        self._entries: OrderedDict[str, tuple[FileState, list[CallLine], bool]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: str) -> tuple[list[CallLine], bool, FileState | None]:
        state = file_state(path)
        if state is None:
            return [], False, None
        with self._lock:
            cached = self._entries.get(path)
            if cached is not None and cached[0] == state:
                self._entries.move_to_end(path)
                return cached[1], cached[2], state
        batch = read_calls(path)
        with self._lock:
            self._entries[path] = (batch.state, batch.lines, batch.torn_tail)
            while len(self._entries) > _CACHE_SIZE:
                self._entries.popitem(last=False)
        return batch.lines, batch.torn_tail, batch.state


_CACHE = _LineCache()


def read_rollout_lines(source: Source, rollout_id: str) -> tuple[list[CallLine], bool, bool, FileState | None]:
    """(lines, torn tail, has payloads, file state) of a rollout: from its capture file, else its row."""
    if source.captures is not None:
        lines, torn, state = _CACHE.get(source.captures.path_for(rollout_id))
        if state is not None:
            return lines, torn, True, state
    row = source.rows.row(rollout_id) if source.rows is not None else None
    capture = row.get(CAPTURE_KEY) if row is not None else None
    calls = capture.get("calls") if isinstance(capture, dict) else None
    lines = []
    for position, call in enumerate(calls if isinstance(calls, list) else []):
        if isinstance(call, dict):
            index = call["call_index"] if isinstance(call.get("call_index"), int) else position
            lines.append(CallLine(index, call, _record_from_dict(ModelCallRecord, call, index)))
    return lines, False, False, None


def load_rollout(source: Source, rollout_id: str) -> RolloutView | None:
    """Read a rollout for its page; None when the source holds neither a capture file nor a row for it."""
    lines, torn, has_payloads, state = read_rollout_lines(source, rollout_id)
    row = source.rows.row(rollout_id) if source.rows is not None else None
    entry = source.captures.entry(rollout_id) if source.captures is not None else None
    if state is None and row is None and entry is None:
        return None
    records = [line.record for line in lines if line.record is not None]
    trajectory = row.get(TRAJECTORY_KEY) if row is not None and isinstance(row.get(TRAJECTORY_KEY), dict) else None
    tool_spans = [span for span in (trajectory or {}).get("tool_calls") or [] if isinstance(span, dict)]
    view = RolloutView(
        rollout_id=rollout_id,
        lines=lines,
        records=records,
        unreadable=[line.call_index for line in lines if line.record is None],
        torn_tail=torn,
        incomplete=bool(entry and entry.incomplete),
        has_payloads=has_payloads,
        metrics=aggregate_model_call_metrics(records),
        timeline=layout_timeline(records, tool_spans),
        row=row,
        trajectory=trajectory,
        state=state,
    )
    capture = row.get(CAPTURE_KEY) if row is not None else None
    if isinstance(capture, dict):
        view.gaps = [gap for gap in capture.get("gaps") or [] if isinstance(gap, dict)]
        attribution = capture.get("attribution")
        if isinstance(attribution, dict):
            view.attribution = attribution
            view.terminal_id = (
                attribution.get("model_call_id") if isinstance(attribution.get("model_call_id"), str) else None
            )
            found = attribution.get("witnesses")
            witnesses: dict[str, Any] = found if isinstance(found, dict) else {}
            view.terminal_witnesses = [
                str(name) for name, finding in witnesses.items()
                if isinstance(finding, dict) and view.terminal_id and finding.get("model_call_id") == view.terminal_id
            ]  # fmt: skip
    return view


def neighbours(lines: list[CallLine], call_index: int) -> tuple[int | None, int | None]:
    """The call_index before and after `call_index` among the rollout's lines."""
    indexes = [line.call_index for line in lines]
    if call_index not in indexes:
        return None, None
    position = indexes.index(call_index)
    before = indexes[position - 1] if position > 0 else None
    after = indexes[position + 1] if position + 1 < len(indexes) else None
    return before, after
