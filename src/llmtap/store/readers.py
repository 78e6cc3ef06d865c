"""Reading a rollout's captured calls back as `ModelCallRecord`s, and summing them.

Consumers read through these functions, never by parsing capture files themselves. Strict and
tolerant reads share one parse path (`scan.scan_lines`); so does `json_objects`, for the other
JSON-lines files llmtap writes beside a capture (a capsule's `model-calls.jsonl`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from ..errors import CaptureRecordError
from ..records import ModelCallRecord, aggregate_metrics
from . import CaptureStore
from .scan import scan_lines

__all__ = [
    "RolloutCalls",
    "aggregate_model_call_metrics",
    "json_objects",
    "read_model_call_records",
    "read_rollout_calls",
    "read_rollout_calls_with_lines",
]


@dataclass(frozen=True)
class RolloutCalls:
    """A rollout's readable calls, and what could not be read: the input of attachments and gaps."""

    rollout_id: str
    exists: bool
    records: list[ModelCallRecord]
    unreadable_lines: list[int]
    incomplete: bool
    late_writes: int
    torn_tail: bool
    capture_failures: int = 0  # failed appends counted in the rollout's incomplete marker


def read_rollout_calls(store: CaptureStore, rollout_id: str, *, strict: bool = False) -> RolloutCalls:
    """Read every call of a rollout, keeping each line's `call_index` stable around damaged lines.

    With `strict=True` the first damaged line raises `CaptureRecordError`; otherwise damaged
    lines (bad JSON, not an object, not a capture record) are skipped and listed.
    """
    return _read_calls(store, rollout_id, strict=strict)[0]


def _read_calls(store: CaptureStore, rollout_id: str, *, strict: bool) -> tuple[RolloutCalls, list[dict[str, Any]]]:
    """The one read behind both readers: the rollout's calls, and each record's raw line in the same order."""
    result = store.read(rollout_id, strict=strict)
    records: list[ModelCallRecord] = []
    lines: list[dict[str, Any]] = []
    unreadable = list(result.invalid_lines)
    for call_index, line in result.entries:
        try:
            records.append(ModelCallRecord.from_raw_line(line, call_index))
        except ValueError as exc:
            if strict:
                raise CaptureRecordError(store.path_for(rollout_id), None, str(exc), call_index=call_index) from exc
            unreadable.append(call_index)
            continue
        lines.append(line)
    calls = RolloutCalls(
        rollout_id=result.rollout_id,
        exists=result.exists,
        records=records,
        unreadable_lines=sorted(unreadable),
        incomplete=result.incomplete,
        late_writes=result.late_writes,
        torn_tail=result.torn_tail,
        capture_failures=result.capture_failures,
    )
    return calls, lines


def read_model_call_records(store: CaptureStore, rollout_id: str, *, strict: bool = True) -> list[ModelCallRecord]:
    """Return a rollout's calls as `ModelCallRecord`s, in file order.

    Strict by default, like the spec's reader: a damaged line raises `CaptureRecordError` naming
    the file and line. Pass `strict=False` to skip damaged lines (their `call_index` stays used).

    Usage::

        store = CaptureStore("/abs/model-calls")
        for call in read_model_call_records(store, "0-0"):
            print(call.call_index, call.model, call.tokens_out)
    """
    return read_rollout_calls(store, rollout_id, strict=strict).records


def aggregate_model_call_metrics(
    source: CaptureStore | Iterable[ModelCallRecord], rollout_id: str | None = None
) -> dict[str, Any]:
    """Sum a rollout's calls into metrics; null means unknown, never zero.

    Accepts a store and rollout id (read tolerantly: one damaged line never hides the others'
    totals) or records already read.
    """
    if isinstance(source, CaptureStore):
        if rollout_id is None:
            raise TypeError("aggregate_model_call_metrics(store, rollout_id) needs the rollout id.")
        return aggregate_metrics(read_rollout_calls(source, rollout_id).records)
    return aggregate_metrics(source)


def read_rollout_calls_with_lines(store: CaptureStore, rollout_id: str) -> tuple[RolloutCalls, list[dict[str, Any]]]:
    """Read a rollout tolerantly, as `read_rollout_calls`, plus each record's raw line (same order).

    For consumers that project a call from both its stored line and its normalized record
    (a capsule's `model-calls.jsonl`).
    """
    return _read_calls(store, rollout_id, strict=False)


def json_objects(data: bytes) -> list[dict[str, Any]]:
    """Return the JSON objects of a JSON-lines file's bytes, in order, skipping damaged and blank lines.

    Tolerant, with the capture reader's rules: a last line without its newline counts when it is
    a whole object, and a cut-off one does not.
    """
    return [record for _, _, record, _ in scan_lines(data) if record is not None]
