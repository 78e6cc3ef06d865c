"""The `ng_model_call_capture` attachment: a rollout row's captured calls, metrics and gaps.

`attach_rollout(row, store)` returns a copy of the row with three attachments set, and every
other key exactly as it was (the agent's response, reward, token ids, ...):

- `ng_model_call_capture`: `rollout_id`, `metrics` (sums over the calls; null means unknown),
  `calls` (normalized records) and `gaps`, left out when empty;
- `ng_trajectory`: the schema 1.0 projection (`llmtap.rollouts.trajectory`). Once it holds the
  payloads, the attached calls leave them out; if projection fails, the calls keep them, the gap
  `trajectory_projection_failed` (detail: the exception class) is added and no trajectory is set.
  When the row already has an `ng_trajectory` (an agent that writes its own, with its tool
  timings), the projection is merged into it, never over it (`rollouts.trajectory_merge`: what
  the agent reported stays, capture adds what it knows); a row value that is not a schema 1.0
  object is kept exactly as it was, with the gap `producer_trajectory_invalid` (detail: its type);
- `ng_agent_observations`, when the agent reported some: rewritten by the join to captured calls
  (resolved references made canonical, join gaps added; nothing the agent said is dropped).

Capture gap codes: `model_call_capture_no_records` (no file and no marker, or a file without
any line), `model_call_capture_records_unreadable` (`count=N` damaged lines),
`model_call_capture_incomplete` (a write failed: the `.capture.incomplete` marker exists),
`model_call_capture_unreadable` (reading raised; detail: the exception class),
`model_call_capture_late_writes` (`count=N` calls of a cleared attempt were diverted, not
attached), `model_call_capture_torn_tail` (the file ends in a partial line), `rollout_id_unavailable`
(the row names no rollout), `agent_observation_join_failed` and `producer_trajectory_invalid`.

`attach_file` does the same for a whole rollouts JSONL file, streaming: one row in memory at a
time, so memory does not grow with the number of rollouts. A line that is not a JSON object is
written back unchanged and listed in the returned `AttachReport`; it never stops the run.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from llmtap.correlation import rollout_id_from_run_body
from llmtap.errors import StoreError
from llmtap.records import ModelCallRecord, aggregate_metrics
from llmtap.store import CaptureStore
from llmtap.store.durable import replace_atomically
from llmtap.store.readers import RolloutCalls, read_rollout_calls

from .observations import OBSERVATIONS_KEY, AgentObservations, join_model_call_observations
from .terminal import resolve_terminal
from .trajectory import TRAJECTORY_KEY, TrajectoryOptions, project_trajectory
from .trajectory_merge import ProducerTrajectoryInvalid, merge_trajectory

__all__ = [
    "CAPTURE_KEY",
    "AttachOptions",
    "AttachReport",
    "attach_file",
    "attach_rollout",
    "capture_attachment",
    "capture_gaps",
]

logger = logging.getLogger(__name__)

CAPTURE_KEY = "ng_model_call_capture"
# Row keys an agent may set in its /run result to name its terminal call (the explicit witness)
# or the response id it kept (the declared witness); see rollouts/terminal.py.
TERMINAL_CALL_KEY = "_ng_terminal_model_call_id"
DECLARED_RESPONSE_KEY = "_ng_terminal_response_id"

_MAX_LISTED_BAD_LINES = 100
_MAX_LOGGED_BAD_LINES = 10
_PROGRESS_EVERY_ROWS = 1000


@dataclass(frozen=True)
class AttachOptions:
    """What to attach.

    `trajectory`: project `ng_trajectory` (the default). `include_payloads`: keep request and
    response payloads on the attached calls when no trajectory holds them (trajectory off).
    `keep_payloads_out`: no payload copy anywhere in the row, not even after a failed projection
    (they stay in the CaptureStore). `resolved_reward_threshold`: a reward at or above it means
    resolved when the verifier gave no explicit verdict.
    """

    trajectory: bool = True
    include_payloads: bool = False
    keep_payloads_out: bool = False
    resolved_reward_threshold: float | None = None


def _gap(code: str, detail: str | None = None) -> dict[str, Any]:
    return {"code": code} if detail is None else {"code": code, "detail": detail}


def capture_gaps(calls: RolloutCalls) -> list[dict[str, Any]]:
    """Return the gaps a rollout's capture read implies, in a fixed order."""
    gaps: list[dict[str, Any]] = []
    if not calls.records and not calls.unreadable_lines and not calls.incomplete:
        gaps.append(_gap("model_call_capture_no_records"))
    if calls.unreadable_lines:
        gaps.append(_gap("model_call_capture_records_unreadable", f"count={len(calls.unreadable_lines)}"))
    if calls.incomplete:
        gaps.append(_gap("model_call_capture_incomplete"))
    if calls.late_writes:
        gaps.append(_gap("model_call_capture_late_writes", f"count={calls.late_writes}"))
    if calls.torn_tail:
        gaps.append(_gap("model_call_capture_torn_tail"))
    return gaps


def capture_attachment(
    rollout_id: str | None,
    records: list[ModelCallRecord],
    gaps: list[dict[str, Any]],
    *,
    include_payloads: bool = False,
) -> dict[str, Any]:
    """Build the `ng_model_call_capture` value; `gaps` is left out when empty."""
    attachment: dict[str, Any] = {
        "rollout_id": rollout_id,
        "metrics": aggregate_metrics(records),
        "calls": [_call_dict(record, include_payloads) for record in records],
    }
    if gaps:
        attachment["gaps"] = gaps
    return attachment


def _call_dict(record: ModelCallRecord, include_payloads: bool) -> dict[str, Any]:
    return record.to_dict(include_payloads=include_payloads)


def _rollout_id(row: Mapping[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
    try:
        rollout_id = rollout_id_from_run_body(row)
    except ValueError as exc:  # InvalidRolloutIdError is a ValueError too
        return None, _gap("rollout_id_unavailable", type(exc).__name__)
    if rollout_id is None:
        return None, _gap("rollout_id_unavailable", "no _ng_rollout_id, or no _ng_task_index and _ng_rollout_index")
    return rollout_id, None


def attach_rollout(
    row: Mapping[str, Any],
    store: CaptureStore,
    *,
    rollout_id: str | None = None,
    options: AttachOptions = AttachOptions(),
) -> dict[str, Any]:
    """Return a copy of `row` with its capture attachment, trajectory and joined observations.

    The rollout id is `rollout_id` when given, else the one the row carries (`_ng_rollout_id`,
    or task and rollout indices plus the attempt suffix). Never raises for a bad row or an
    unreadable capture: each problem becomes a gap.

    Usage::

        with CaptureStore("/abs/model-calls") as store:
            row = attach_rollout(row, store)
        row["ng_model_call_capture"]["metrics"]["tokens_total"]
    """
    gaps: list[dict[str, Any]] = []
    if rollout_id is None:
        rollout_id, problem = _rollout_id(row)
        if problem is not None:
            gaps.append(problem)
    records: list[ModelCallRecord] = []
    if rollout_id is not None:
        try:
            calls = read_rollout_calls(store, rollout_id)
        except (StoreError, OSError, ValueError) as exc:
            gaps.append(_gap("model_call_capture_unreadable", type(exc).__name__))
        else:
            records = calls.records
            gaps.extend(capture_gaps(calls))
    result = dict(row)
    # Which captured call earned the reward: the one whose response the agent returned.
    attribution = resolve_terminal(
        records,
        row.get("response"),
        explicit_call_id=_optional_str(row.get(TERMINAL_CALL_KEY)),
        declared_response_id=_optional_str(row.get(DECLARED_RESPONSE_KEY)),
    )
    trajectory_gaps = list(gaps)
    observations = _joined_observations(row, records, gaps, trajectory_gaps)
    if observations is not None:
        result[OBSERVATIONS_KEY] = observations.to_dict()
    payloads_on_calls = options.include_payloads and not options.keep_payloads_out
    if options.trajectory:
        try:
            projected = project_trajectory(
                row,
                records,
                tool_call_records=_wire_tool_calls(store, rollout_id, gaps),
                rollout_id=rollout_id,
                observations=observations,
                capture_gaps=trajectory_gaps,
                terminal_model_call_id=attribution.model_call_id,
                options=TrajectoryOptions(
                    include_payloads=not options.keep_payloads_out,
                    resolved_reward_threshold=options.resolved_reward_threshold,
                ),
            )
            payloads_on_calls = False
            if TRAJECTORY_KEY in row:
                projected = merge_trajectory(row[TRAJECTORY_KEY], projected)
            result[TRAJECTORY_KEY] = projected
        except ProducerTrajectoryInvalid as exc:  # the agent's own record is kept exactly as it came
            result[TRAJECTORY_KEY] = row[TRAJECTORY_KEY]
            gaps.append(_gap("producer_trajectory_invalid", type(row[TRAJECTORY_KEY]).__name__))
            logger.debug("Kept the row's own ng_trajectory unmerged: %s", exc)
            payloads_on_calls = not options.keep_payloads_out
        except Exception as exc:  # a projection bug must not cost the row its capture
            if TRAJECTORY_KEY in row:  # what the agent reported stays; only the projection failed
                result[TRAJECTORY_KEY] = row[TRAJECTORY_KEY]
            else:
                result.pop(TRAJECTORY_KEY, None)
            gaps.append(_gap("trajectory_projection_failed", type(exc).__name__))
            payloads_on_calls = not options.keep_payloads_out
    attachment = capture_attachment(rollout_id, records, gaps, include_payloads=payloads_on_calls)
    attachment["attribution"] = attribution.to_dict()
    result[CAPTURE_KEY] = attachment
    return result


def _wire_tool_calls(store: CaptureStore, rollout_id: str | None, gaps: list[dict[str, Any]]) -> list[Any]:
    """The rollout's MCP tool calls recorded beside its model calls (`store.tool_calls`); none when unreadable."""
    if rollout_id is None:
        return []
    from llmtap.store.tool_calls import read_tool_calls

    try:
        read = read_tool_calls(store.root, rollout_id)
    except (StoreError, OSError, ValueError) as exc:
        gaps.append(_gap("tool_call_capture_unreadable", type(exc).__name__))
        return []
    if read.unreadable_lines:
        gaps.append(_gap("tool_call_lines_unreadable", f"count={read.unreadable_lines}"))
    return read.records


def _optional_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _joined_observations(
    row: Mapping[str, Any],
    records: list[ModelCallRecord],
    capture_gap_list: list[dict[str, Any]],
    trajectory_gaps: list[dict[str, Any]],
) -> AgentObservations | None:
    """Validate and join the row's observations; an invalid bundle is left as the agent sent it."""
    raw = row.get(OBSERVATIONS_KEY)
    if raw is None:
        return None
    try:
        bundle = AgentObservations.model_validate(raw)
    except ValidationError:
        trajectory_gaps.append({"code": "agent_observations_invalid", "source": "agent_observations"})
        return None
    try:
        return join_model_call_observations(bundle, records)
    except Exception as exc:  # a join bug must not cost the row its capture
        capture_gap_list.append(_gap("agent_observation_join_failed", type(exc).__name__))
        trajectory_gaps.append(_gap("agent_observation_join_failed", type(exc).__name__))
        return bundle


# Whole files ------------------------------------------------------------------------------------


@dataclass
class AttachReport:
    """What one `attach_file` run did: counts, the gaps it attached, and the lines it passed through."""

    rows: int = 0
    attached: int = 0
    calls: int = 0
    bad_lines: int = 0
    bad_line_samples: list[tuple[int, str]] = field(default_factory=list)
    gap_counts: dict[str, int] = field(default_factory=dict)
    bytes_read: int = 0
    total_bytes: int = 0
    elapsed_s: float = 0.0

    @property
    def rows_per_second(self) -> float:
        """Rows handled per second so far."""
        return self.rows / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def _note_bad_line(self, line_number: int, reason: str) -> None:
        self.bad_lines += 1
        if len(self.bad_line_samples) < _MAX_LISTED_BAD_LINES:
            self.bad_line_samples.append((line_number, reason))
        if self.bad_lines <= _MAX_LOGGED_BAD_LINES:
            logger.warning("Line %d of the rollouts file was written back unchanged: %s.", line_number, reason)


def _parse_row(raw: bytes) -> tuple[dict[str, Any] | None, bool, str | None]:
    """Return (row, parsed by the standard library, problem). orjson first; the standard library
    takes NaN, Infinity and integers beyond 64 bits, and then also writes the row back."""
    try:
        value = orjson.loads(raw)
        fallback = False
    except orjson.JSONDecodeError:
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            return None, False, f"it is not valid JSON ({type(exc).__name__})"
        fallback = True
    if not isinstance(value, dict):
        return None, fallback, f"it holds a JSON {type(value).__name__}, not an object"
    return value, fallback, None


def _encode_row(row: dict[str, Any], fallback: bool) -> bytes:
    if fallback:
        return json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
    return orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE)


def attach_file(
    in_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    capture_dir: str | os.PathLike[str] | CaptureStore,
    *,
    options: AttachOptions = AttachOptions(),
    progress: Callable[[AttachReport], None] | None = None,
) -> AttachReport:
    """Attach captures to every row of a rollouts JSONL file, streaming, and write the result.

    The output is written to a temporary file next to `out_path`, synced, then renamed over it,
    so `out_path` may equal `in_path` and an interrupted run leaves the old file intact. Each
    output line ends in a newline. Blank lines and lines that are not a JSON object are written
    back unchanged and counted in `AttachReport.bad_lines` (the first hundred listed with their
    line numbers and the reason). `progress` is called every thousand rows and at the end.
    Raises StoreError when `capture_dir` does not exist, and OSError when the files cannot be
    read or written.

    Usage::

        report = attach_file("rollouts.jsonl", "rollouts.attached.jsonl", "/abs/model-calls")
        print(report.rows, report.bad_lines, report.gap_counts)
    """
    owned = not isinstance(capture_dir, CaptureStore)
    store = _open_store(capture_dir) if not isinstance(capture_dir, CaptureStore) else capture_dir
    source, target = Path(in_path), Path(out_path)
    report = AttachReport(total_bytes=source.stat().st_size)
    started = time.perf_counter()
    try:
        with source.open("rb") as reader, replace_atomically(target, "attach") as writer:
            for line_number, raw in enumerate(reader, start=1):
                report.bytes_read += len(raw)
                writer.write(_attach_line(raw, line_number, store, options, report))
                if progress is not None and line_number % _PROGRESS_EVERY_ROWS == 0:
                    report.elapsed_s = time.perf_counter() - started
                    progress(report)
    finally:
        if owned:
            store.close()
    report.elapsed_s = time.perf_counter() - started
    if progress is not None:
        progress(report)
    return report


def _attach_line(
    raw: bytes, line_number: int, store: CaptureStore, options: AttachOptions, report: AttachReport
) -> bytes:
    line = raw if raw.endswith(b"\n") else raw + b"\n"
    if not raw.strip():
        return line
    report.rows += 1
    row, fallback, problem = _parse_row(raw)
    if row is None:
        report._note_bad_line(line_number, problem or "it is not a JSON object")
        return line
    try:
        attached = attach_rollout(row, store, options=options)
        encoded = _encode_row(attached, fallback)
    except Exception as exc:  # one row's failure never stops the file
        report._note_bad_line(line_number, f"attaching failed ({type(exc).__name__})")
        return line
    capture = attached[CAPTURE_KEY]
    report.attached += 1
    report.calls += len(capture["calls"])
    for gap in capture.get("gaps", ()):
        report.gap_counts[gap["code"]] = report.gap_counts.get(gap["code"], 0) + 1
    return encoded


def _open_store(capture_dir: str | os.PathLike[str]) -> CaptureStore:
    path = Path(capture_dir)
    if not path.is_dir():
        raise StoreError(
            f"Capture directory '{path}' does not exist; pass the directory the model server wrote "
            "its captures to (model_call_capture_dir)."
        )
    return CaptureStore(path, create=False)
