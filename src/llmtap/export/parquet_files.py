"""The files of a Parquet export directory: its state, its partitioned part files, and their commit.

    DIR/
      llmtap-export.json                     the state: last committed run, what each rollout file held
      llmtap-export.lock                     what a run flocks, so two runs never write at once
      calls/date=YYYY-MM-DD/part-RRRRRR-SSSS.parquet
      rollouts/date=YYYY-MM-DD/part-RRRRRR-SSSS.parquet

A run writes its part files under temporary names, renames them once every row is written, and
then replaces the state file: that replacement is the commit. A run that dies before it leaves
part files numbered above the committed run, and the next run deletes them first, so a crash
never leaves a row twice or half a file. Nothing here follows a link: directories are created by
the export or checked to be real directories, part files are created exclusively (`O_EXCL`,
`O_NOFOLLOW`), and the state file is read without following a link and with a size bound.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from ..store.durable import replace_atomically, sync_directory
from .sources import ExportError

__all__ = [
    "STATE_NAME",
    "ExportState",
    "PartitionedWriter",
    "RolloutState",
    "export_lock",
    "open_export_dir",
    "save_state",
]

STATE_NAME = "llmtap-export.json"
LOCK_NAME = "llmtap-export.lock"
STATE_VERSION = 1
MAX_STATE_BYTES = 1 << 30
_PART = re.compile(r"^part-(\d{6})-(\d{4})\.parquet(\.tmp)?$")
_DATE = re.compile(r"^date=(\d{4}-\d{2}-\d{2}|unknown)$")
_MAX_OPEN_WRITERS = 32  # one open file per date partition written in this run, at most
_COMPRESSION = "zstd"


@dataclass(slots=True)
class RolloutState:
    """What the last committed run read of one rollout's capture file.

    `device`/`inode`/`size` identify the file and how much of it was there (None when it had no
    data file); `next_index` is the first `call_index` not yet exported; `first_call_id` the
    `model_call_id` at index 0, which recognises the same file copied or restored elsewhere;
    `attached` the attached row's values last seen (kept so later versions of the rollout row
    carry them).
    """

    device: int | None
    inode: int | None
    size: int | None
    next_index: int
    first_call_id: str | None = None
    attached: list[Any] | None = None

    def to_json(self) -> list[Any]:
        return [self.device, self.inode, self.size, self.next_index, self.first_call_id, self.attached]

    @classmethod
    def from_json(cls, value: Any) -> RolloutState:
        if not isinstance(value, list) or len(value) != 6:
            raise ValueError("a rollout entry is not a list of six values")
        device, inode, size, next_index, first_call_id, attached = value
        if first_call_id is not None and not isinstance(first_call_id, str):
            raise ValueError("first_call_id is not a string")
        for number in (device, inode, size):
            if number is not None and (not isinstance(number, int) or number < 0):
                raise ValueError("a file identity is not a non-negative integer")
        if not isinstance(next_index, int) or next_index < 0:
            raise ValueError("next_index is not a non-negative integer")
        if attached is not None and not isinstance(attached, list):
            raise ValueError("attached is not a list")
        return cls(device, inode, size, next_index, first_call_id, attached)


@dataclass
class ExportState:
    """The committed state of an export directory."""

    committed_run: int = 0
    rollouts: dict[str, RolloutState] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        document = {
            "version": STATE_VERSION,
            "committed_run": self.committed_run,
            "rollouts": {rollout_id: entry.to_json() for rollout_id, entry in self.rollouts.items()},
        }
        return orjson.dumps(document)


@contextlib.contextmanager
def export_lock(out_dir: Path) -> Iterator[None]:
    """Create or check the export directory and hold its lock: a second run waits for the first.

    Raises ExportError when the path is a link or not a directory, or the lock cannot be taken.
    """
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"Could not create the export directory '{out_dir}' ({exc.strerror}).") from exc
    _require_directory(out_dir)
    try:
        fd = os.open(out_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise ExportError(f"Could not open the lock of '{out_dir}' ({exc.strerror}); is {LOCK_NAME} a link?") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ExportError(f"The lock '{out_dir / LOCK_NAME}' is not a regular file; remove it.")
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def open_export_dir(out_dir: Path) -> ExportState:
    """Check the (locked) export directory, delete what an unfinished run left, return the state.

    Raises ExportError when a non-empty directory holds no export state (so an export never
    writes into someone else's files), or when the state file is damaged.
    """
    _require_directory(out_dir)
    state_path = out_dir / STATE_NAME
    data = _read_state_bytes(state_path)
    if data is None:
        extra = [name for name in os.listdir(out_dir) if name not in ("calls", "rollouts", LOCK_NAME)]
        if extra:
            raise ExportError(
                f"'{out_dir}' is not empty and holds no {STATE_NAME}; export into a new or empty directory."
            )
        state = ExportState()
    else:
        state = _parse_state(state_path, data)
    for table in ("calls", "rollouts"):
        _remove_uncommitted(out_dir / table, state.committed_run)
    return state


def save_state(out_dir: Path, state: ExportState) -> None:
    """Replace the state file durably: the commit of a run."""
    with replace_atomically(out_dir / STATE_NAME, "export-state") as writer:
        writer.write(state.to_bytes())


def _require_directory(path: Path) -> None:
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        raise ExportError(f"Could not open '{path}' ({exc.strerror}).") from exc
    if not stat.S_ISDIR(mode):
        raise ExportError(f"'{path}' is a link or not a directory; give the export a real directory.")


def _read_state_bytes(path: Path) -> bytes | None:
    from ..capsule.writer import FileTooLargeError, NotRegularFileError, read_regular_file

    try:
        return read_regular_file(path, limit=MAX_STATE_BYTES)
    except FileNotFoundError:
        return None
    except (NotRegularFileError, FileTooLargeError) as exc:
        raise ExportError(f"The export state '{path}' is not a regular file under 1 GiB; remove it to start over.") from exc
    except OSError as exc:
        raise ExportError(f"Could not read the export state '{path}' ({exc.strerror}); is it a link?") from exc


def _parse_state(path: Path, data: bytes) -> ExportState:
    try:
        document = orjson.loads(data)
        if not isinstance(document, dict) or document.get("version") != STATE_VERSION:
            raise ValueError(f"it is not a version {STATE_VERSION} export state")
        committed = document.get("committed_run")
        rollouts = document.get("rollouts")
        if not isinstance(committed, int) or committed < 0 or not isinstance(rollouts, dict):
            raise ValueError("committed_run or rollouts is missing")
        entries = {str(key): RolloutState.from_json(value) for key, value in rollouts.items()}
    except (orjson.JSONDecodeError, ValueError) as exc:
        raise ExportError(
            f"The export state '{path}' is damaged ({exc}); export into a new directory, or remove the directory to start over."
        ) from exc
    return ExportState(committed, entries)


def _remove_uncommitted(table_dir: Path, committed_run: int) -> None:
    """Delete part files of runs after `committed_run`, and temporary files: an unfinished run's."""
    for partition in _partitions(table_dir):
        for entry in os.scandir(partition):
            match = _PART.match(entry.name)
            if match and (match.group(3) or int(match.group(1)) > committed_run) and entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)


def _partitions(table_dir: Path) -> Iterator[Path]:
    try:
        entries = list(os.scandir(table_dir))
    except FileNotFoundError:
        return
    for entry in entries:
        if _DATE.match(entry.name) and entry.is_dir(follow_symlinks=False):
            yield Path(entry.path)


class _Part:
    """One part file being written: created exclusively under a temporary name."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.final = path
        self.temporary = path.with_name(path.name + ".tmp")
        fd = os.open(self.temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        self.handle: BinaryIO = os.fdopen(fd, "wb")
        self.writer = pq.ParquetWriter(self.handle, schema, compression=_COMPRESSION)

    def close(self) -> None:
        self.writer.close()
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()


class PartitionedWriter:
    """Writes one table's rows of one run into date partitions, in bounded batches.

    Rows are buffered column by column per date; a date's buffer becomes a row group once it
    holds `batch_rows` rows, and every buffer is flushed when all of them together hold twice
    that, so memory stays within a few batches whatever the number of calls.
    """

    def __init__(self, table_dir: Path, schema: pa.Schema, run: int, *, batch_rows: int) -> None:
        self.table_dir = table_dir
        self.schema = schema
        self.run = run
        self.batch_rows = batch_rows
        self.rows_written = 0
        self._buffers: dict[str, dict[str, list[Any]]] = {}
        self._buffered = 0
        self._open: dict[str, _Part] = {}
        self._closed: list[_Part] = []
        self._sequence = 0
        self._names = schema.names

    def add(self, date: str, row: dict[str, Any]) -> None:
        """Buffer one row for the partition `date` (`YYYY-MM-DD` or `unknown`)."""
        buffer = self._buffers.get(date)
        if buffer is None:
            buffer = self._buffers[date] = {name: [] for name in self._names}
        for name in self._names:
            buffer[name].append(row[name])
        self._buffered += 1
        if len(buffer["rollout_id"]) >= self.batch_rows:
            self._flush(date)
        elif self._buffered >= 2 * self.batch_rows:
            self.flush()

    def flush(self) -> None:
        """Write every buffered row."""
        for date in list(self._buffers):
            self._flush(date)

    def _flush(self, date: str) -> None:
        buffer = self._buffers.pop(date, None)
        if not buffer or not buffer["rollout_id"]:
            return
        count = len(buffer["rollout_id"])
        table = pa.Table.from_pydict(buffer, schema=self.schema)
        self._part(date).writer.write_table(table)
        self._buffered -= count
        self.rows_written += count

    def _part(self, date: str) -> _Part:
        part = self._open.get(date)
        if part is None:
            if len(self._open) >= _MAX_OPEN_WRITERS:
                for other in self._open.values():
                    other.close()
                    self._closed.append(other)
                self._open.clear()
            self.table_dir.mkdir(exist_ok=True)
            _require_directory(self.table_dir)
            partition = self.table_dir / f"date={date}"
            partition.mkdir(exist_ok=True)
            _require_directory(partition)
            self._sequence += 1
            part = self._open[date] = _Part(partition / f"part-{self.run:06d}-{self._sequence:04d}.parquet", self.schema)
        return part

    def finish(self) -> list[Path]:
        """Flush and close every part file, give them their final names; return them."""
        self.flush()
        for part in self._open.values():
            part.close()
            self._closed.append(part)
        self._open.clear()
        directories = set()
        for part in self._closed:
            os.replace(part.temporary, part.final)
            directories.add(part.final.parent)
        for directory in directories:
            sync_directory(directory)
        if directories:
            sync_directory(self.table_dir)
        return [part.final for part in self._closed]

    def abort(self) -> None:
        """Close and delete whatever this run wrote (the state is left as it was)."""
        for part in [*self._open.values(), *self._closed]:
            with contextlib.suppress(Exception):  # already closed, or the disk failed: the files go either way
                part.writer.close()
                part.handle.close()
            for path in (part.temporary, part.final):
                path.unlink(missing_ok=True)
        self._open.clear()
        self._closed.clear()
