"""A rollout's MCP tool-call records beside its model calls: `<rollout_id>.tool-calls.jsonl` in the capture directory.

A capture directory (`CaptureStore`'s root) holds `<rollout_id>.capture.jsonl` for the model
calls; tool calls recorded for the same rollout (by `llmtap mcp-proxy --capture-dir`, or the
HTTP mode's `/ng-rollout/<id>/` prefix) go to `<rollout_id>.tool-calls.jsonl` next to it. Every
append takes the rollout's own lock file (`<rollout_id>.capture.lock`, the one model-call writers
and `clear()` flock), writes whole lines with one `write()`, and fdatasyncs before returning, so a
tool call is as durable as a model call and a clear of the rollout never interleaves with it.
The directory is opened once without following a link, and every file in it is opened with
`O_NOFOLLOW | O_NONBLOCK` and checked to be a regular file with one name.

Reading is tolerant: a line that is not a record (a torn tail, a newer writer's kind) is counted
and skipped, never raised.

Usage::

    sink = RolloutToolCallSink("/abs/model-calls")
    sink.write(records)                       # grouped by each record's rollout_id
    read_tool_calls("/abs/model-calls", "task-3").records
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from llmtap.correlation.ids import validate_rollout_id
from llmtap.errors import StoreError
from llmtap.store.durable import SAFE_FLAGS, append_lines_durably, open_regular

if TYPE_CHECKING:
    from llmtap.mcp.records import ToolCallRecord

__all__ = [
    "DEFAULT_ROLLOUT_ID",
    "TOOL_CALLS_SUFFIX",
    "RolloutToolCallSink",
    "ToolCallRead",
    "append_tool_calls",
    "read_tool_calls",
    "tool_calls_path",
]

TOOL_CALLS_SUFFIX = ".tool-calls.jsonl"
LOCK_SUFFIX = ".capture.lock"  # the store's own lock file for the rollout (store.capture_store)
DEFAULT_ROLLOUT_ID = "default"
MAX_READ_BYTES = 256 << 20  # a tool-call file larger than this is read only up to it (and says so)


@dataclass
class ToolCallRead:
    """What `read_tool_calls` found: records in file order, lines it could not read, and whether it stopped early."""

    records: list[ToolCallRecord] = field(default_factory=list)
    unreadable_lines: int = 0
    truncated: bool = False


def tool_calls_path(root: str | os.PathLike[str], rollout_id: str) -> Path:
    """Where a rollout's tool calls live under a capture directory; InvalidRolloutIdError for a bad id."""
    return Path(root) / f"{validate_rollout_id(rollout_id)}{TOOL_CALLS_SUFFIX}"


def _open_directory(root: str | os.PathLike[str], *, create: bool) -> int:
    if create:
        os.makedirs(root, exist_ok=True)
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _append_in(dir_fd: int, rollout_id: str, lines: list[bytes]) -> None:
    lock_fd = open_regular(rollout_id + LOCK_SUFFIX, os.O_RDWR | os.O_CREAT, dir_fd=dir_fd, single_link=True)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        append_lines_durably(rollout_id + TOOL_CALLS_SUFFIX, dir_fd, lines)
    finally:
        os.close(lock_fd)  # releases the flock


def append_tool_calls(root: str | os.PathLike[str], rollout_id: str, records: Sequence[ToolCallRecord]) -> None:
    """Append `records` to the rollout's tool-call file durably, under the rollout's lock.

    Raises InvalidRolloutIdError for a bad id, UnsafeCaptureFileError when a file there is a link
    or not a regular file, StoreError when the directory is a link, OSError for a full disk.
    """
    validate_rollout_id(rollout_id)
    if not records:
        return
    try:
        dir_fd = _open_directory(root, create=True)
    except NotADirectoryError as exc:
        raise StoreError(f"The capture directory '{root}' is not a directory (or is a link); give a real directory.") from exc
    except OSError as exc:
        if os.path.islink(root):
            raise StoreError(f"The capture directory '{root}' is a symbolic link; give the real directory.") from exc
        raise
    try:
        _append_in(dir_fd, rollout_id, [record.to_line() for record in records])
    finally:
        os.close(dir_fd)


def read_tool_calls(root: str | os.PathLike[str], rollout_id: str) -> ToolCallRead:
    """Read a rollout's tool-call records; a missing file or directory reads as none. Never follows a link.

    Raises InvalidRolloutIdError for a bad id and UnsafeCaptureFileError for a planted link or FIFO.
    """
    from llmtap.mcp.records import ToolCallRecordError, parse_tool_call_line

    validate_rollout_id(rollout_id)
    read = ToolCallRead()
    try:
        dir_fd = _open_directory(root, create=False)
    except (FileNotFoundError, NotADirectoryError):
        return read
    try:
        try:
            fd = open_regular(rollout_id + TOOL_CALLS_SUFFIX, os.O_RDONLY | SAFE_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            return read
        try:
            chunks: list[bytes] = []
            total = 0
            while total < MAX_READ_BYTES and (chunk := os.read(fd, min(1 << 20, MAX_READ_BYTES - total))):
                chunks.append(chunk)
                total += len(chunk)
            read.truncated = total >= MAX_READ_BYTES and bool(os.read(fd, 1))
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)
    data = b"".join(chunks)
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for line in lines:
        if not line.strip():
            continue
        try:
            read.records.append(parse_tool_call_line(line))
        except ToolCallRecordError:
            read.unreadable_lines += 1
    return read


class RolloutToolCallSink:
    """A `ToolCallSink` that files each record under its rollout in a capture directory.

    A record without a rollout id goes under `default_rollout_id`. Opening the directory is
    checked at `open()`, so a bad `--capture-dir` is reported before a session starts.
    """

    def __init__(self, root: str | os.PathLike[str], *, default_rollout_id: str = DEFAULT_ROLLOUT_ID) -> None:
        self.root = Path(root)
        self.default_rollout_id = validate_rollout_id(default_rollout_id)
        self.count = 0
        self._lock = threading.Lock()

    def open(self) -> None:
        """Create the directory if needed and check that it is a real one (not a link)."""
        try:
            os.close(_open_directory(self.root, create=True))
        except OSError as exc:
            raise StoreError(
                f"Could not open the capture directory '{self.root}' for tool calls ({type(exc).__name__}): "
                "give a real directory, not a link or a file."
            ) from exc

    def write(self, records: Sequence[ToolCallRecord]) -> None:
        """Append the records, grouped by rollout; durable on return, or raises."""
        groups: dict[str, list[ToolCallRecord]] = {}
        for record in records:
            groups.setdefault(record.rollout_id or self.default_rollout_id, []).append(record)
        with self._lock:
            for rollout_id, group in groups.items():
                append_tool_calls(self.root, rollout_id, group)
                self.count += len(group)

    def close(self) -> None:
        return None
