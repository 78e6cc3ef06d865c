"""The plan of a collection: the task rows of the input, and the rollout attempts they make."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtap.correlation import (
    ATTEMPT_INDEX_KEY,
    ROLLOUT_ID_KEY,
    ROLLOUT_INDEX_KEY,
    TASK_INDEX_KEY,
    rollout_id_from_run_body,
)
from llmtap.correlation.ids import validate_rollout_id
from llmtap.correlation.sampling import MODEL_SAMPLING_KEY
from llmtap.errors import CollectError

from .files import loads_row

__all__ = ["IDENTITY_KEYS", "PlannedRollout", "planned_slots"]

# The collector's own keys in a row it sends: never taken from the task row as they are.
IDENTITY_KEYS = (TASK_INDEX_KEY, ROLLOUT_INDEX_KEY, ATTEMPT_INDEX_KEY, ROLLOUT_ID_KEY)


# Rows -----------------------------------------------------------------------------------------


def _identity(task_index: int, rollout_index: int, explicit_id: str | None, attempt_index: int) -> dict[str, Any]:
    """The collector's `_ng_*` keys of one rollout attempt (the attempt index only when above 0)."""
    identity: dict[str, Any] = {TASK_INDEX_KEY: task_index, ROLLOUT_INDEX_KEY: rollout_index}
    if attempt_index > 0:
        identity[ATTEMPT_INDEX_KEY] = attempt_index
    if explicit_id is not None:
        identity[ROLLOUT_ID_KEY] = explicit_id
    return identity


# The plan ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedRollout:
    """One rollout attempt to dispatch."""

    key: str
    task_index: int
    rollout_index: int
    explicit_id: str | None
    attempt_index: int
    row: dict[str, Any]
    fallback: bool

    @property
    def identity(self) -> dict[str, Any]:
        return _identity(self.task_index, self.rollout_index, self.explicit_id, self.attempt_index)

    @property
    def rollout_id(self) -> str:
        rollout_id = rollout_id_from_run_body(self.identity)
        assert rollout_id is not None
        return rollout_id

    def body(self, sampling: Mapping[str, Any] | None) -> dict[str, Any]:
        body = {key: value for key, value in self.row.items() if key not in IDENTITY_KEYS}
        body.update(self.identity)
        if sampling is not None and body.get(MODEL_SAMPLING_KEY) is None:
            body[MODEL_SAMPLING_KEY] = dict(sampling)
        return body


def _task_index(row: Mapping[str, Any], position: int, line_number: int, path: Path) -> int:
    value = row.get(TASK_INDEX_KEY)
    if value is None:
        return position
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise CollectError(
        f"Line {line_number} of '{path}' has {TASK_INDEX_KEY} {value!r}; use a non-negative integer or leave it out."
    )


def _task_rows(path: Path, limit: int | None) -> Iterator[tuple[int, int, dict[str, Any], bool]]:
    """Yield (line number, position, row, fallback) for the first `limit` task rows; blank lines are skipped."""
    position = 0
    try:
        with path.open("rb") as reader:
            for line_number, raw in enumerate(reader, start=1):
                if limit is not None and position >= limit:
                    return
                if not raw.strip():
                    continue
                try:
                    row, fallback = loads_row(raw)
                except (ValueError, RecursionError):
                    raise CollectError(
                        f"Line {line_number} of '{path}' is not valid JSON; fix or remove it, then run again."
                    ) from None
                if not isinstance(row, dict):
                    raise CollectError(
                        f"Line {line_number} of '{path}' holds a JSON {type(row).__name__}; each line must be a task object."
                    )
                yield line_number, position, row, fallback
                position += 1
    except OSError as exc:
        raise CollectError(f"Could not read the input '{path}' ({exc.strerror or exc}); check the path.") from exc


def planned_slots(path: Path, limit: int | None, num_repeats: int) -> Iterator[tuple[str, int, int, str | None, dict[str, Any], bool]]:
    """Yield (key, task index, rollout index, explicit id, row, fallback) for every planned rollout."""
    for line_number, position, row, fallback in _task_rows(path, limit):
        task_index = _task_index(row, position, line_number, path)
        explicit = row.get(ROLLOUT_ID_KEY)
        if explicit is not None:
            try:
                explicit = validate_rollout_id(explicit)
            except ValueError as exc:
                raise CollectError(f"Line {line_number} of '{path}': {exc}") from None
            if num_repeats > 1:
                raise CollectError(
                    f"Line {line_number} of '{path}' sets {ROLLOUT_ID_KEY} {explicit!r}, so its {num_repeats} repeats "
                    "would share one capture; drop the explicit id or run with --num-repeats 1."
                )
        for rollout_index in range(num_repeats):
            key = explicit if explicit is not None else f"{task_index}-{rollout_index}"
            yield key, task_index, rollout_index, explicit, row, fallback


