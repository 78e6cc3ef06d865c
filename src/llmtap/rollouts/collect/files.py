"""The files of a collection run, and what a resume reads back from them.

Next to the output `OUT.jsonl`:

- `OUT.jsonl`: one row per rollout, in completion order. Each row is one `write`, flushed and
  fsynced before the next, so an interrupted run leaves whole rows; a torn last line is dropped
  when the run is resumed.
- `OUT.attempts.jsonl` (`attempts_path_for`): the attempt log, append-only, one JSON object per
  line with `"v": 1`, `"at"` (Unix seconds) and an `event`:
  `run` (the settings of one invocation), `dispatch` (`key`, `task_index`, `rollout_index`,
  `attempt_index`, `rollout_id`; fsynced before the request leaves, so a killed attempt is never
  forgotten) and `finish` (`key`, `attempt_index`, `rollout_id`, `status` "ok" or "error",
  `error_type`, `elapsed_s`). `key` is the rollout id without its attempt suffix.

The output is the record of what finished; the log is the record of what was tried. A row
without `ng_collect_error` is a finished rollout. The next attempt index of a rollout is the
number of its dispatches in the log (each one failed or never finished), so a retry's calls land
under `<key>-a<n>` and never mix with a killed attempt's.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from llmtap.correlation import (
    ATTEMPT_INDEX_KEY,
    ROLLOUT_ID_KEY,
    ROLLOUT_INDEX_KEY,
    TASK_INDEX_KEY,
    rollout_id_from_run_body,
)
from llmtap.store.durable import replace_atomically

__all__ = [
    "COLLECT_ERROR_KEY",
    "LOG_VERSION",
    "CollectHistory",
    "OutputSink",
    "attempts_path_for",
    "dumps_row",
    "loads_row",
    "read_history",
    "rewrite_output",
    "rollout_key",
]

COLLECT_ERROR_KEY = "ng_collect_error"
LOG_VERSION = 1


def loads_row(raw: bytes) -> tuple[Any, bool]:
    """Parse JSON with orjson, falling back to the standard library (NaN, integers beyond 64 bits).

    Returns (value, whether the standard library must write it back). Raises ValueError.
    """
    try:
        return orjson.loads(raw), False
    except orjson.JSONDecodeError:
        return json.loads(raw), True


def dumps_row(value: Any, fallback: bool = False) -> bytes:
    """Encode one row without a newline; orjson unless the row needs the standard library."""
    if not fallback:
        try:
            return orjson.dumps(value)
        except TypeError:  # an integer beyond 64 bits
            pass
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def rollout_key(row: Mapping[str, Any]) -> str | None:
    """A row's rollout id without the attempt suffix, or None when it names none."""
    try:
        return rollout_id_from_run_body({key: row.get(key) for key in (TASK_INDEX_KEY, ROLLOUT_INDEX_KEY, ROLLOUT_ID_KEY)})
    except ValueError:
        return None


def attempts_path_for(output_path: str | os.PathLike[str]) -> Path:
    """Return the attempt log beside an output file: `rollouts.jsonl` -> `rollouts.attempts.jsonl`."""
    output = Path(output_path)
    stem = output.stem if output.suffix == ".jsonl" else output.name
    return output.with_name(f"{stem}.attempts.jsonl")


@dataclass
class CollectHistory:
    """What earlier runs left, per rollout key: finished, error rows, dispatches and failures."""

    finished: set[str] = field(default_factory=set)
    error_retryable: dict[str, bool] = field(default_factory=dict)
    last_attempt: dict[str, int] = field(default_factory=dict)
    dispatches: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)

    def settled(self, key: str, max_attempts: int) -> bool:
        """True when the rollout is not sent again: it finished, or its error row stays.

        An error row stays when its error is not retryable or the rollout already failed
        `max_attempts` times; a killed attempt (dispatched, never finished) does not count.
        """
        if key in self.finished:
            return True
        if key not in self.error_retryable:
            return False
        failed = max(self.failures.get(key, 0), 1)
        return not self.error_retryable[key] or failed >= max_attempts

    def next_attempt(self, key: str) -> int:
        """The attempt index of the rollout's next dispatch: one past every earlier attempt."""
        return max(self.dispatches.get(key, 0), self.last_attempt.get(key, -1) + 1)


def _json_lines(path: Path) -> Iterator[tuple[bytes, Any]]:
    """Yield (raw line, parsed value or None) for every line of a file that may not exist."""
    try:
        reader = path.open("rb")
    except FileNotFoundError:
        return
    with reader:
        for raw in reader:
            try:
                value = loads_row(raw)[0] if raw.endswith(b"\n") else None
            except (ValueError, RecursionError):
                value = None
            yield raw, value


def read_history(output_path: Path, attempts_path: Path) -> CollectHistory:
    """Read the output and the attempt log of earlier runs; damaged lines are skipped."""
    history = CollectHistory()
    for _, event in _json_lines(attempts_path):
        if not isinstance(event, dict) or not isinstance(event.get("key"), str):
            continue
        key = event["key"]
        if event.get("event") == "dispatch":
            history.dispatches[key] = history.dispatches.get(key, 0) + 1
        elif event.get("event") == "finish" and event.get("status") == "error":
            history.failures[key] = history.failures.get(key, 0) + 1
    for _, row in _json_lines(output_path):
        key = rollout_key(row) if isinstance(row, dict) else None
        if key is None:
            continue
        attempt = row.get(ATTEMPT_INDEX_KEY)
        attempt = attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else 0
        history.last_attempt[key] = max(history.last_attempt.get(key, -1), attempt)
        error = row.get(COLLECT_ERROR_KEY)
        if error is None:
            history.finished.add(key)
        elif key not in history.finished:
            history.error_retryable[key] = bool(error.get("retryable", True)) if isinstance(error, dict) else True
    return history


def rewrite_output(output_path: Path, redispatched: set[str]) -> int:
    """Rewrite the output without torn, unreadable, duplicate and re-dispatched rows, atomically.

    The kept lines are copied byte for byte into a synced temporary file renamed over the
    output. Returns how many non-blank lines were dropped.
    """
    if not output_path.exists():
        return 0
    dropped = 0
    seen: set[str] = set()
    with replace_atomically(output_path, "resume") as writer:
        for raw, row in _json_lines(output_path):
            key = rollout_key(row) if isinstance(row, dict) else None
            if key is None or key in seen or key in redispatched:
                dropped += 1 if raw.strip() else 0
                continue
            seen.add(key)
            writer.write(raw)
    return dropped


class OutputSink:
    """The output and the attempt log of one run, appended from worker threads under one lock.

    `fresh` truncates both files first; otherwise rows and events are appended.
    """

    def __init__(self, output_path: Path, attempts_path: Path, *, fresh: bool) -> None:
        mode = "wb" if fresh else "ab"
        output_path.parent.mkdir(parents=True, exist_ok=True)
        self._output = output_path.open(mode)
        try:
            self._log = attempts_path.open(mode)
        except BaseException:
            self._output.close()
            raise
        self._lock = threading.Lock()

    def event(self, event: Mapping[str, Any], durable: bool = False) -> None:
        """Append one attempt-log event; `durable` fsyncs it before returning."""
        line = orjson.dumps({"v": LOG_VERSION, "at": time.time(), **event}, option=orjson.OPT_APPEND_NEWLINE)
        with self._lock:
            self._log.write(line)
            self._log.flush()
            if durable:
                os.fsync(self._log.fileno())

    def row(self, line: bytes) -> None:
        """Append one encoded output row (ending in a newline), durably."""
        with self._lock:
            self._output.write(line)
            self._output.flush()
            os.fsync(self._output.fileno())

    def close(self) -> None:
        """Close both files."""
        with self._lock:
            self._output.close()
            self._log.close()
