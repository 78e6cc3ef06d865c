"""One side of a diff: a run capsule, a capture directory, or collect/attach output rows, read per rollout.

Each source lists its rollouts by an alignment key (the rollout id, or the values of declared row
keys) and loads one rollout at a time, so a diff of two large runs holds two rollouts in memory,
not two runs. Capture files are read only through the store's public readers. Rows files are
untrusted input: opened without following a link, regular files only, each row bounded in size.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Self

import orjson

from ..errors import LlmtapError

__all__ = [
    "ATTACHMENT_KEY",
    "MAX_ROW_BYTES",
    "DiffInputError",
    "RolloutSide",
    "RowsSource",
    "Source",
    "StoreSource",
    "open_source",
]

ATTACHMENT_KEY = "ng_model_call_capture"
# A collect/attach row carrying payloads can be large, but not without bound.
MAX_ROW_BYTES = 64 * 1024 * 1024

# A --key value is an id or an index, not a document.
MAX_KEY_CHARS = 512

SourceKind = Literal["capsule", "capture_dir", "rows"]


class DiffInputError(LlmtapError):
    """Raised when the two inputs of a diff cannot be read or compared; the message says why."""


@dataclass
class RolloutSide:
    """One rollout of one side: its calls (`ModelCallRecord`s, in call order), reward, and reading problems."""

    key: str
    rollout_id: str | None
    records: list[Any]
    reward: float | None = None
    unreadable_lines: int = 0
    incomplete: bool = False
    file: str | None = None
    # Line of `file` each call is on (1-based): capture lines for stores, the row's line for rows.
    lines: list[int] = field(default_factory=list)


class Source:
    """A run to compare: its rollouts by alignment key, loaded one at a time."""

    kind: SourceKind
    path: Path

    def keys(self) -> list[str]:
        raise NotImplementedError

    def load(self, key: str) -> RolloutSide:
        raise NotImplementedError

    @property
    def has_payloads(self) -> bool:
        """True when calls carry their request and response (stores always do; rows only when attached with payloads)."""
        return True

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.path), "kind": self.kind, "rollouts": len(self.keys())}

    def close(self) -> None:
        """Release what the source holds open (nothing for rows)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StoreSource(Source):
    """A capture directory (`<rollout_id>.capture.jsonl` files) or a capsule's `calls/`."""

    def __init__(self, path: Path, calls_dir: Path, kind: SourceKind) -> None:
        from ..store import CaptureStore

        self.path = path
        self.kind = kind
        self._store = CaptureStore(calls_dir, create=False)
        self._keys = self._store.rollouts()

    def keys(self) -> list[str]:
        return self._keys

    def close(self) -> None:
        self._store.close()

    def load(self, key: str) -> RolloutSide:
        import llmtap  # the public reader, by its stable name

        calls = llmtap.read_rollout_calls(self._store, key)
        return RolloutSide(
            key=key,
            rollout_id=key,
            records=calls.records,
            unreadable_lines=len(calls.unreadable_lines),
            incomplete=calls.incomplete or calls.torn_tail,
            file=str(self._store.path_for(key)),
            lines=[record.call_index + 1 for record in calls.records],
        )


def _open_regular(path: Path) -> int:
    """Open a file for reading without following a link or blocking on a FIFO; refuse anything not regular."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise DiffInputError(
            f"Could not open '{path}' ({exc.strerror}); pass a readable rows file, not a link."
        ) from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise DiffInputError(f"Could not read '{path}': it is not a regular file; pass a rows file (.jsonl).")
    return fd


def _record_from_call(call: dict[str, Any]) -> Any:
    """Rebuild a `ModelCallRecord` from an attachment's call entry (its `to_dict` shape); unknown keys are ignored."""
    from ..records import ModelCallRecord

    names = _RECORD_FIELD_NAMES or _record_field_names()
    values = {name: call[name] for name in names if name in call}
    if not isinstance(values.get("model_call_id"), str) or not isinstance(values.get("call_index"), int):
        return None
    try:
        return ModelCallRecord(**values)
    except TypeError:
        return None


_RECORD_FIELD_NAMES: tuple[str, ...] = ()


def _record_field_names() -> tuple[str, ...]:
    global _RECORD_FIELD_NAMES
    from ..records import ModelCallRecord

    _RECORD_FIELD_NAMES = tuple(item.name for item in fields(ModelCallRecord))
    return _RECORD_FIELD_NAMES


def _reward_of(row: dict[str, Any]) -> float | None:
    reward = row.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        return None
    return float(reward)


class RowsSource(Source):
    """Collect/attach output: JSONL rows, each with an `ng_model_call_capture` attachment.

    The file is scanned once for each row's key and byte offset; a rollout is parsed again only
    when loaded. Rollouts are keyed by the attachment's `rollout_id`, or by the values of
    `key_fields` (`--key`), which must be present and unique on every row.
    """

    kind: SourceKind = "rows"

    def __init__(self, path: Path, key_fields: Sequence[str] = ()) -> None:
        self.path = path
        self._key_fields = tuple(key_fields)
        self._offsets: dict[str, tuple[int, int]] = {}
        self._payloads = False
        self.unreadable_rows = 0
        self._scan()

    @property
    def has_payloads(self) -> bool:
        return self._payloads

    def keys(self) -> list[str]:
        return sorted(self._offsets)

    def _rows(self, start: int = 0) -> Any:
        fd = _open_regular(self.path)
        with os.fdopen(fd, "rb") as handle:
            handle.seek(start)
            offset = start
            line_number = 0
            while True:
                raw = handle.readline(MAX_ROW_BYTES + 1)
                if not raw:
                    return
                line_number += 1
                if len(raw) > MAX_ROW_BYTES and not raw.endswith(b"\n"):
                    raise DiffInputError(
                        f"Row {line_number} of '{self.path}' is longer than {MAX_ROW_BYTES} bytes; "
                        "a collect/attach row should not be: check the file."
                    )
                yield offset, line_number, raw
                offset += len(raw)

    def _scan(self) -> None:
        attached = 0
        for offset, line_number, raw in self._rows():
            if not raw.strip():
                continue
            row = _parse_row(raw)
            if row is None:
                self.unreadable_rows += 1
                continue
            attachment = row.get(ATTACHMENT_KEY)
            if isinstance(attachment, dict):
                attached += 1
                calls = attachment.get("calls")
                if isinstance(calls, list) and any(isinstance(c, dict) and c.get("request") is not None for c in calls):
                    self._payloads = True
            key = self._key_of(row, attachment, line_number)
            if key in self._offsets:
                raise DiffInputError(
                    f"Rows {self._offsets[key][1]} and {line_number} of '{self.path}' share the key {key!r}; "
                    "pass --key with the row keys that tell rollouts apart."
                )
            self._offsets[key] = (offset, line_number)
        if self._offsets and not attached:
            raise DiffInputError(
                f"No row of '{self.path}' has an {ATTACHMENT_KEY!r} attachment; "
                "pass the output of 'llmtap collect' or 'llmtap attach', a capsule, or a capture directory."
            )

    def _key_of(self, row: dict[str, Any], attachment: Any, line_number: int) -> str:
        if self._key_fields:
            missing = [name for name in self._key_fields if name not in row]
            if missing:
                raise DiffInputError(
                    f"Row {line_number} of '{self.path}' has no {missing[0]!r}; --key must name keys every row carries."
                )
            key = "|".join(orjson.dumps(row[name]).decode() for name in self._key_fields)
            if len(key) > MAX_KEY_CHARS:
                raise DiffInputError(
                    f"Row {line_number} of '{self.path}' has a --key value of {len(key)} characters; "
                    f"align by keys of at most {MAX_KEY_CHARS} (an id, an index)."
                )
            return key
        rollout_id = attachment.get("rollout_id") if isinstance(attachment, dict) else None
        if isinstance(rollout_id, str) and rollout_id:
            return rollout_id
        raise DiffInputError(
            f"Row {line_number} of '{self.path}' has no rollout id in its {ATTACHMENT_KEY!r}; "
            "pass --key with a row key to align rollouts by."
        )

    def load(self, key: str) -> RolloutSide:
        offset, line_number = self._offsets[key]
        raw = next(iter(self._rows(offset)))[2]
        row = _parse_row(raw) or {}
        found = row.get(ATTACHMENT_KEY)
        attachment: dict[str, Any] = found if isinstance(found, dict) else {}
        listed = attachment.get("calls")
        calls: list[Any] = listed if isinstance(listed, list) else []
        records = [
            record for record in (_record_from_call(c) for c in calls if isinstance(c, dict)) if record is not None
        ]
        records.sort(key=lambda record: record.call_index)
        listed_gaps = attachment.get("gaps")
        gaps: list[Any] = listed_gaps if isinstance(listed_gaps, list) else []
        rollout_id = attachment.get("rollout_id")
        return RolloutSide(
            key=key,
            rollout_id=rollout_id if isinstance(rollout_id, str) else None,
            records=records,
            reward=_reward_of(row),
            unreadable_lines=len(calls) - len(records),
            incomplete=any(
                isinstance(gap, dict) and gap.get("code") == "model_call_capture_incomplete" for gap in gaps
            ),
            file=str(self.path),
            lines=[line_number] * len(records),
        )


def _parse_row(raw: bytes) -> dict[str, Any] | None:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _is_real_directory(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def open_source(reference: str, *, key_fields: Sequence[str] = (), runs_dir: Path | None = None) -> Source:
    """Open one side of a diff: a capsule, a capture directory, a rows file, or a run id / `latest` under the runs directory.

    Links are refused (a capsule is untrusted input). Raises `DiffInputError` saying what was
    found and what to pass instead.
    """
    path = Path(reference).expanduser()
    if not os.path.lexists(path):
        path = _find_run(reference, runs_dir)
    if os.path.islink(path):
        raise DiffInputError(f"'{path}' is a symbolic link; pass the capsule, capture directory or rows file itself.")
    if path.is_file() or not path.is_dir():
        return RowsSource(path, key_fields)
    if key_fields:
        raise DiffInputError(
            f"'{path}' is a directory; --key aligns collect/attach rows only (stores align by rollout id)."
        )
    calls = path / "calls"
    if os.path.lexists(calls):
        if not _is_real_directory(calls):
            raise DiffInputError(f"'{calls}' is a link or not a directory; the capsule may have been tampered with.")
        return StoreSource(path, calls, "capsule")
    return StoreSource(path, path, "capture_dir")


def _find_run(reference: str, runs_dir: Path | None) -> Path:
    from ..capsule.manifest import find_capsule
    from ..capsule.writer import default_runs_dir

    try:
        return find_capsule(runs_dir or default_runs_dir(), reference)
    except LlmtapError as exc:
        raise DiffInputError(
            f"'{reference}' is neither a path nor a run ({exc}); pass a capsule, capture directory, rows file or run id."
        ) from None
