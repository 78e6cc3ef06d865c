"""`llmtap export parquet`: the store as `calls` and `rollouts` Parquet tables, incrementally.

Each run appends only what is new. For every rollout the state file keeps the capture file's
device, inode and size as last read, and the first `call_index` not yet exported. A rollout whose
file has the same identity and size is not read at all; one that grew is read through the
store's reader and only calls at or after that index become rows (the index counts damaged lines
too, so it never shifts). A file with another inode but the same first call is the same file
copied or restored (`cp -r`, rsync, a backup) and goes on from the same index; one that shrank or
starts with another call was cleared and captured again, and is exported from its first call,
as the new calls they are. The size is taken before the
read, so a line appended during the read is caught by the next run, and the index keeps it from
being written twice. An unterminated last line is not a call yet: it is exported once whole.

A rollout with new calls also gets a new `rollouts` row (its metrics over all its calls), as does
one whose attached row changed: `rollouts` rows are versions, and the newest `export_run` per
`rollout_id` is the current one (`llmtap query` shows only that). Memory holds one rollout's
records, a few row batches and the state (one small entry per rollout), whatever the number of calls.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from ..store.readers import RolloutCalls
from .parquet_files import PartitionedWriter, RolloutState, export_lock, open_export_dir, save_state
from .sources import CaptureSource, ExportError, open_source
from .tables import CALLS_SCHEMA, ROLLOUTS_SCHEMA, AttachedRollout, attached_rollout, call_row, date_of, rollout_row

__all__ = ["DEFAULT_BATCH_ROWS", "ParquetReport", "export_parquet"]

DEFAULT_BATCH_ROWS = 20_000
MAX_ATTACHED_LINE_BYTES = 256 << 20  # an attached row carries its trajectory; a longer line is skipped


@dataclass
class ParquetReport:
    """What one Parquet export run did."""

    out_dir: Path
    export_run: int = 0
    rollouts: int = 0
    rollouts_read: int = 0
    rollouts_replaced: int = 0
    calls_written: int = 0
    rollout_rows_written: int = 0
    unreadable_lines: int = 0
    refused_files: list[str] = field(default_factory=list)
    attached_rows: int = 0
    attached_bad_lines: int = 0
    files: list[Path] = field(default_factory=list)


def export_parquet(
    path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    payloads: bool = False,
    rollouts_file: str | os.PathLike[str] | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    progress: Callable[[ParquetReport], None] | None = None,
) -> ParquetReport:
    """Append the calls and rollouts under `path` that `out_dir` does not hold yet.

    `payloads` adds the request and response as JSON text columns. `rollouts_file`, a rollouts
    JSONL with `ng_model_call_capture` attached (`llmtap attach`), adds each rollout's reward and
    terminal attribution. A run either commits whole or leaves `out_dir` as it was.

    Usage::

        report = export_parquet("/abs/model-calls", "/abs/export")
        # duckdb: SELECT model, count(*) FROM 'export/calls/**/*.parquet' GROUP BY model
    """
    if batch_rows < 1:
        raise ExportError(f"The batch size {batch_rows} is out of range; use at least 1 row.")
    source = open_source(path)
    target = Path(out_dir)
    attached = _read_attached(Path(rollouts_file)) if rollouts_file is not None else None
    with export_lock(target):
        return _export_locked(source, target, attached, payloads=payloads, batch_rows=batch_rows, progress=progress)


def _export_locked(
    source: CaptureSource,
    target: Path,
    attached: tuple[dict[str, AttachedRollout], int] | None,
    *,
    payloads: bool,
    batch_rows: int,
    progress: Callable[[ParquetReport], None] | None,
) -> ParquetReport:
    state = open_export_dir(target)
    run = state.committed_run + 1
    report = ParquetReport(out_dir=target, export_run=run)
    if attached is not None:
        report.attached_rows = len(attached[0])
        report.attached_bad_lines = attached[1]
    calls = PartitionedWriter(target / "calls", CALLS_SCHEMA, run, batch_rows=batch_rows)
    # A rollout row is one per ten or so calls: a smaller batch keeps its buffer as small as the calls'.
    rollouts = PartitionedWriter(target / "rollouts", ROLLOUTS_SCHEMA, run, batch_rows=max(1, batch_rows // 4))
    writers = _Writers(calls, rollouts, run, time.time(), payloads)
    try:
        for rollout_id in source.rollouts():
            report.rollouts += 1
            try:
                identity = _identity(source.store.path_for(rollout_id))
            except _NotRegularFile:
                report.refused_files.append(rollout_id)
                continue
            found = attached[0].get(rollout_id) if attached is not None else None
            previous = state.rollouts.get(rollout_id)
            if previous is not None and _unchanged(previous, identity, found):
                continue
            read = source.read(rollout_id)
            report.rollouts_read += 1
            state.rollouts[rollout_id] = _export_rollout(read, identity, previous, found, writers, report)
            if progress is not None and report.rollouts_read % 1000 == 0:
                progress(report)
        report.files = calls.finish() + rollouts.finish()
        report.calls_written = calls.rows_written
        report.rollout_rows_written = rollouts.rows_written
        state.committed_run = run
        save_state(target, state)
    except BaseException:
        calls.abort()
        rollouts.abort()
        raise
    return report


@dataclass(frozen=True)
class _Writers:
    """What every rollout of one run writes into."""

    calls: PartitionedWriter
    rollouts: PartitionedWriter
    run: int
    exported_at: float
    payloads: bool


def _export_rollout(
    read: RolloutCalls,
    identity: tuple[int, int, int] | None,
    previous: RolloutState | None,
    found: AttachedRollout | None,
    writers: _Writers,
    report: ParquetReport,
) -> RolloutState:
    """Write one read rollout's new calls and, when it changed, a new version of its row; return its state."""
    start = _first_new_index(previous, identity, read)
    if previous is not None and start == 0:
        report.rollouts_replaced += 1
    memo: dict[bytes, list[dict[str, object]]] = {}
    new_calls = 0
    for record in read.records:
        if record.call_index >= start:
            new_calls += 1
            row = call_row(record, read.rollout_id, writers.run, payloads=writers.payloads, memo=memo)
            writers.calls.add(date_of(record.started_at), row)
    new_damaged = sum(1 for index in read.unreadable_lines if index >= start)
    report.unreadable_lines += new_damaged
    kept = found if found is not None else _attached_from(previous)
    attachment_changed = found is not None and (previous is None or _attached_json(found) != previous.attached)
    # A file only copied elsewhere, with nothing new, needs no new version of its rollout row.
    if previous is None or start == 0 or new_calls or new_damaged or attachment_changed:
        writers.rollouts.add(date_of(_first_start(read)), rollout_row(read, writers.run, writers.exported_at, kept))
    return RolloutState(
        device=identity[0] if identity else None,
        inode=identity[1] if identity else None,
        size=identity[2] if identity else None,
        next_index=_next_index(read, start),
        first_call_id=_first_call_id(read),
        attached=_attached_json(kept),
    )


class _NotRegularFile(Exception):
    """A capture file that is a link or a special file: not read (a FIFO would block the export)."""


def _identity(path: Path) -> tuple[int, int, int] | None:
    """(device, inode, size) of a capture file; None when there is none; _NotRegularFile for a link or FIFO."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        raise _NotRegularFile(path)
    return info.st_dev, info.st_ino, info.st_size


def _unchanged(previous: RolloutState, identity: tuple[int, int, int] | None, found: AttachedRollout | None) -> bool:
    same_file = (previous.device, previous.inode, previous.size) == (identity or (None, None, None))
    same_attachment = found is None or _attached_json(found) == previous.attached
    return same_file and same_attachment


def _first_new_index(
    previous: RolloutState | None, identity: tuple[int, int, int] | None, read: RolloutCalls
) -> int:
    """The first call_index to export: after the last export when the file only grew, else 0.

    The same file is the same device and inode, or (copied, restored, moved to another disk) the
    same first call; a file that shrank, or starts with another call, was cleared and captured anew.
    """
    if previous is None or identity is None or previous.size is None or identity[2] < previous.size:
        return 0
    same_inode = (previous.device, previous.inode) == identity[:2]
    same_start = previous.first_call_id is not None and previous.first_call_id == _first_call_id(read)
    return previous.next_index if same_inode or same_start else 0


def _next_index(read: RolloutCalls, start: int) -> int:
    indexes = [record.call_index for record in read.records] + list(read.unreadable_lines)
    return max(start, max(indexes) + 1) if indexes else start


def _first_call_id(read: RolloutCalls) -> str | None:
    first = read.records[0] if read.records else None
    return first.model_call_id if first is not None and first.call_index == 0 else None


def _first_start(read: RolloutCalls) -> float | None:
    starts = [record.started_at for record in read.records if record.started_at is not None]
    return min(starts) if starts else None


def _attached_json(found: AttachedRollout | None) -> list[object] | None:
    if found is None:
        return None
    return [getattr(found, name) for name in AttachedRollout.__slots__]


def _attached_from(previous: RolloutState | None) -> AttachedRollout | None:
    if previous is None or previous.attached is None or len(previous.attached) != len(AttachedRollout.__slots__):
        return None
    try:
        return AttachedRollout(*previous.attached)
    except TypeError:
        return None


def _read_attached(path: Path) -> tuple[dict[str, AttachedRollout], int]:
    """Read reward and attribution per rollout from an attached rollouts file; (by rollout id, bad lines)."""
    found: dict[str, AttachedRollout] = {}
    bad = 0
    for line in _lines(path):
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            bad += 1
            continue
        attached = attached_rollout(row) if isinstance(row, dict) else None
        if attached is None:
            bad += 1
            continue
        found[attached[0]] = attached[1]
    return found, bad


def _lines(path: Path) -> Iterator[bytes]:
    """The non-blank lines of a regular file (never a link or FIFO); a line over the bound is skipped whole."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ExportError(f"Could not open the rollouts file '{path}' ({exc.strerror}); is it a link?") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ExportError(f"The rollouts file '{path}' is not a regular file.")
    with os.fdopen(fd, "rb") as handle:
        while line := handle.readline(MAX_ATTACHED_LINE_BYTES + 1):
            if len(line) > MAX_ATTACHED_LINE_BYTES and not line.endswith(b"\n"):
                while (rest := handle.readline(1 << 20)) and not rest.endswith(b"\n"):
                    pass
                yield b"{"  # counted as a bad line by the caller
                continue
            if line.strip():
                yield line
