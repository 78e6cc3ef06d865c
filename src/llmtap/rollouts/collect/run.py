"""Rollout collection: send task rows to an agent's `POST /run` and write one attached row per rollout.

Each task row of the input JSONL is sent `num_repeats` times (the first `limit` tasks, at most
`concurrency` at once) with `_ng_task_index` (the row's own, else its position among the task
rows), `_ng_rollout_index` (the repeat), the row's `_ng_rollout_id` and `_ng_model_sampling`
where it has them (or the run's sampling values), and `_ng_attempt_index` on a retry. Before
each dispatch the capture of that exact rollout-attempt id is cleared (`CaptureStore.clear`,
which also fences out late writers of an older attempt). When the agent answers, the output row
is its result unchanged, with the collector's `_ng_*` identity keys set, plus the
`ng_model_call_capture` attachment (with the terminal attribution under `attribution`),
`ng_trajectory` and joined `ng_agent_observations` (`llmtap.rollouts.attach.attach_rollout`).

An agent error, a timeout or an answer that is not a JSON object becomes a row too, carrying
`ng_collect_error` = `{"type", "message", "retryable", "attempt_index", "elapsed_s",
["status_code", "body"]}` (types: `timeout`, `connection`, `agent_http_error`,
`invalid_result`, `attach_failed`) and whatever capture the attempt left; the run goes on.

The output and its attempt log are described in `llmtap.rollouts.collect.files`. Resume
(`resume=True`): a rollout whose row has no `ng_collect_error` is finished and skipped. An error
row is dropped and its rollout sent again, unless its error is not retryable (an agent 4xx, a
failed attachment: `llmtap attach` redoes that) or the rollout already failed `max_attempts`
times; then the row stays. A rollout without a row is sent again. A re-sent rollout carries
`_ng_attempt_index` = the number of its earlier attempts, so its calls land under `<key>-a<n>`.
The output is rewritten once (atomically) without the dropped rows, then appended to.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import ValidationError

from llmtap.correlation import (
    ROLLOUT_ID_KEY,
    TASK_INDEX_KEY,
)
from llmtap.correlation.sampling import ModelCallSampling
from llmtap.errors import CollectError, StoreError
from llmtap.store import CaptureStore

from ..attach import AttachOptions, attach_rollout
from .files import (
    COLLECT_ERROR_KEY,
    CollectHistory,
    OutputSink,
    attempts_path_for,
    dumps_row,
    loads_row,
    read_history,
    rewrite_output,
)
from .tasks import IDENTITY_KEYS, PlannedRollout, planned_slots

__all__ = [
    "COLLECT_ERROR_KEY",
    "CollectError",
    "CollectReport",
    "attempts_path_for",
    "collect_rollouts",
    "collect_rollouts_async",
]

_BODY_EXCERPT_CHARS = 4000
_RETRYABLE_STATUSES = frozenset({408, 409, 425, 429})

T = TypeVar("T")


# The run ----------------------------------------------------------------------------------------


@dataclass
class CollectReport:
    """What a collection did; also what the progress callback receives while it runs."""

    output_path: Path
    attempts_path: Path
    planned: int = 0
    already_done: int = 0
    to_dispatch: int = 0
    succeeded: int = 0
    failed: int = 0
    in_flight: int = 0
    dropped_lines: int = 0
    error_counts: dict[str, int] = field(default_factory=dict)
    interrupted: bool = False
    elapsed_s: float = 0.0

    @property
    def finished(self) -> int:
        """Rollouts written by this run, with or without an error."""
        return self.succeeded + self.failed


@dataclass(frozen=True)
class _Job:
    input_path: Path
    output_path: Path
    agent_url: str
    capture_dir: Path | None
    num_repeats: int
    limit: int | None
    concurrency: int
    timeout_s: float | None
    resume: bool
    overwrite: bool
    max_attempts: int
    model_sampling: Mapping[str, Any] | None
    attach_options: AttachOptions

    @property
    def run_url(self) -> str:
        base = self.agent_url.rstrip("/")
        return base if base.endswith("/run") else f"{base}/run"


def _check_job(job: _Job) -> None:
    if job.num_repeats < 1 or job.concurrency < 1 or job.max_attempts < 1:
        raise CollectError(
            f"num_repeats {job.num_repeats}, concurrency {job.concurrency} and max_attempts {job.max_attempts} "
            "must each be at least 1."
        )
    if job.limit is not None and job.limit < 0:
        raise CollectError(f"limit is {job.limit}; pass 0 or more tasks, or no limit.")
    if not job.input_path.is_file():
        raise CollectError(f"Input '{job.input_path}' is not a file; pass the task JSONL to collect.")
    if job.model_sampling is not None:
        try:
            ModelCallSampling.model_validate(dict(job.model_sampling))
        except ValidationError as exc:
            raise CollectError(
                f"Model sampling {dict(job.model_sampling)!r} is not valid ({exc.errors()[0]['msg']}); "
                "use temperature, top_p and max_output_tokens with numeric values."
            ) from None
    if not job.resume and not job.overwrite and job.output_path.exists() and job.output_path.stat().st_size > 0:
        raise CollectError(
            f"Output '{job.output_path}' already holds rows; pass --resume to finish that run or --overwrite to start over."
        )


async def _uncancellable(call: Callable[..., T], *args: Any) -> T:
    """Run `call` in a thread and let it finish even when the run is cancelled, then re-raise."""
    future = asyncio.ensure_future(asyncio.to_thread(call, *args))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        await asyncio.wait([future])
        raise


@dataclass
class _Outcome:
    result: dict[str, Any] | None = None
    fallback: bool = False
    error: dict[str, Any] | None = None


def _failure(kind: str, message: str, *, retryable: bool, **extra: Any) -> _Outcome:
    return _Outcome(error={"type": kind, "message": message, "retryable": retryable, **extra})


async def _dispatch(client: httpx.AsyncClient, job: _Job, rollout: PlannedRollout) -> _Outcome:
    """POST one rollout to the agent; every failure becomes an outcome, none raises."""
    content = dumps_row(rollout.body(job.model_sampling), rollout.fallback)
    try:
        async with asyncio.timeout(job.timeout_s):
            response = await client.post(job.run_url, content=content, headers={"content-type": "application/json"})
    except (TimeoutError, httpx.TimeoutException):
        return _failure("timeout", f"The agent did not answer within {job.timeout_s} s.", retryable=True)
    except httpx.TransportError as exc:
        return _failure("connection", f"The request to the agent failed ({type(exc).__name__}: {exc}).", retryable=True)
    if response.status_code >= 400:
        retryable = response.status_code >= 500 or response.status_code in _RETRYABLE_STATUSES
        return _failure(
            "agent_http_error",
            f"The agent answered HTTP {response.status_code}.",
            retryable=retryable,
            status_code=response.status_code,
            body=response.text[:_BODY_EXCERPT_CHARS],
        )
    try:
        result, fallback = loads_row(response.content)
    except (ValueError, RecursionError):
        result, fallback = None, False
    if not isinstance(result, dict):
        return _failure(
            "invalid_result",
            "The agent's answer is not a JSON object.",
            retryable=True,
            status_code=response.status_code,
            body=response.text[:_BODY_EXCERPT_CHARS],
        )
    return _Outcome(result=result, fallback=fallback)


def _finish(job: _Job, store: CaptureStore | None, rollout: PlannedRollout, outcome: _Outcome, elapsed: float) -> tuple[bytes, str | None]:
    """Build, attach and encode the output row (in a worker thread); return it with its error type."""
    row = dict(outcome.result) if outcome.result is not None else {}
    for key in IDENTITY_KEYS:
        row.pop(key, None)
    row.update(rollout.identity)
    if outcome.error is not None:
        row[COLLECT_ERROR_KEY] = {**outcome.error, "attempt_index": rollout.attempt_index, "elapsed_s": elapsed}
    if store is not None:
        try:
            row = attach_rollout(row, store, rollout_id=rollout.rollout_id, options=job.attach_options)
        except Exception as exc:  # never lose the agent's result to an attachment bug
            row.setdefault(
                COLLECT_ERROR_KEY,
                {
                    "type": "attach_failed",
                    "message": f"Attaching the capture failed ({type(exc).__name__}); run llmtap attach on the output.",
                    "retryable": False,
                    "attempt_index": rollout.attempt_index,
                    "elapsed_s": elapsed,
                },
            )
    error = row.get(COLLECT_ERROR_KEY)
    return dumps_row(row, outcome.fallback) + b"\n", error["type"] if isinstance(error, dict) else None


async def _run_rollout(
    client: httpx.AsyncClient, job: _Job, store: CaptureStore | None, sink: OutputSink, rollout: PlannedRollout, report: CollectReport
) -> str | None:
    """Clear, log, dispatch, attach and write one rollout; return its error type (None when it succeeded).

    Raises CollectError when the capture cannot be cleared or the output cannot be written:
    going on would mix attempts or lose rows.
    """
    if store is not None:
        try:
            await _uncancellable(store.clear, rollout.rollout_id)
        except StoreError as exc:
            raise CollectError(f"{exc} Collection stopped so that no attempt mixes with an older one.") from exc
    identity = {"key": rollout.key, "attempt_index": rollout.attempt_index, "rollout_id": rollout.rollout_id}
    try:
        await _uncancellable(
            sink.event, {"event": "dispatch", **identity, "task_index": rollout.task_index, "rollout_index": rollout.rollout_index}, True
        )
        started = time.perf_counter()
        report.in_flight += 1
        try:
            outcome = await _dispatch(client, job, rollout)
        finally:
            report.in_flight -= 1
        elapsed = round(time.perf_counter() - started, 3)
        line, error_type = await _uncancellable(_finish, job, store, rollout, outcome, elapsed)
        await _uncancellable(sink.row, line)
        status = "error" if error_type else "ok"
        await _uncancellable(sink.event, {"event": "finish", **identity, "status": status, "error_type": error_type, "elapsed_s": elapsed})
    except OSError as exc:
        raise CollectError(
            f"Could not write the output '{job.output_path}' or its attempt log ({exc.strerror or exc}); free space or "
            "fix permissions, then run again with --resume."
        ) from exc
    return error_type


async def _check_agent(client: httpx.AsyncClient, agent_url: str) -> None:
    try:
        await client.get(agent_url, timeout=10.0)
    except httpx.TransportError as exc:
        raise CollectError(
            f"Nothing answered at the agent URL '{agent_url}' ({type(exc).__name__}); start the agent "
            "(for example llmtap agent simple) or fix --agent-url."
        ) from None


def _plan(job: _Job, history: CollectHistory | None, report: CollectReport) -> set[str]:
    """Check the whole plan before anything is sent (rows readable, rollout ids unique); return the keys to send."""
    seen: set[str] = set()
    to_send: set[str] = set()
    for key, *_ in planned_slots(job.input_path, job.limit, job.num_repeats):
        if key in seen:
            raise CollectError(
                f"Two rollouts of '{job.input_path}' have the id {key!r}; give each task its own "
                f"{TASK_INDEX_KEY} or {ROLLOUT_ID_KEY}."
            )
        seen.add(key)
        report.planned += 1
        if history is not None and history.settled(key, job.max_attempts):
            report.already_done += 1
        else:
            to_send.add(key)
    report.to_dispatch = len(to_send)
    return to_send


def _rollouts(job: _Job, history: CollectHistory | None) -> Iterator[PlannedRollout]:
    for key, task_index, rollout_index, explicit, row, fallback in planned_slots(job.input_path, job.limit, job.num_repeats):
        if history is not None and history.settled(key, job.max_attempts):
            continue
        attempt = history.next_attempt(key) if history is not None else 0
        yield PlannedRollout(key, task_index, rollout_index, explicit, attempt, row, fallback)


async def _collect(job: _Job, report: CollectReport, progress: Callable[[CollectReport], None] | None) -> None:
    started = time.perf_counter()
    attempts_path = report.attempts_path
    history = read_history(job.output_path, attempts_path) if job.resume else None
    to_send = _plan(job, history, report)
    limits = httpx.Limits(max_connections=job.concurrency, max_keepalive_connections=job.concurrency)
    timeout = httpx.Timeout(connect=30.0, read=job.timeout_s, write=60.0, pool=None)
    # One client serves every rollout: a cookie one run's answer sets must not reach the next run.
    no_cookies = http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False, cookies=no_cookies) as client:
        if to_send:
            await _check_agent(client, job.agent_url)
        if history is not None:
            report.dropped_lines = rewrite_output(job.output_path, to_send)
        store = CaptureStore(job.capture_dir) if job.capture_dir is not None else None
        sink = OutputSink(job.output_path, attempts_path, fresh=not job.resume)
        try:
            sink.event(
                {"event": "run", "resume": job.resume, "input": str(job.input_path.resolve()), "agent_url": job.agent_url,
                 "num_repeats": job.num_repeats, "limit": job.limit, "planned": report.planned,
                 "to_dispatch": report.to_dispatch, "capture_dir": str(job.capture_dir) if job.capture_dir else None},
                durable=True,
            )  # fmt: skip
            await _dispatch_all(client, job, store, sink, history, report, progress, started)
        finally:
            sink.close()
            if store is not None:
                store.close()
            report.elapsed_s = time.perf_counter() - started


async def _dispatch_all(
    client: httpx.AsyncClient,
    job: _Job,
    store: CaptureStore | None,
    sink: OutputSink,
    history: CollectHistory | None,
    report: CollectReport,
    progress: Callable[[CollectReport], None] | None,
    started: float,
) -> None:
    queue: asyncio.Queue[PlannedRollout | None] = asyncio.Queue(maxsize=job.concurrency * 2)

    def tell() -> None:
        report.elapsed_s = time.perf_counter() - started
        if progress is not None:
            progress(report)

    async def worker() -> None:
        while (rollout := await queue.get()) is not None:
            error_type = await _run_rollout(client, job, store, sink, rollout, report)
            if error_type is None:
                report.succeeded += 1
            else:
                report.failed += 1
                report.error_counts[error_type] = report.error_counts.get(error_type, 0) + 1
            tell()

    tell()
    async with asyncio.TaskGroup() as group:
        for _ in range(job.concurrency):
            group.create_task(worker())
        for rollout in _rollouts(job, history):
            await queue.put(rollout)
        for _ in range(job.concurrency):
            await queue.put(None)


async def collect_rollouts_async(
    input_path: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    *,
    agent_url: str,
    capture_dir: str | os.PathLike[str] | None = None,
    num_repeats: int = 1,
    limit: int | None = None,
    concurrency: int = 8,
    timeout_s: float | None = 1800.0,
    resume: bool = False,
    overwrite: bool = False,
    max_attempts: int = 3,
    model_sampling: Mapping[str, Any] | None = None,
    attach_options: AttachOptions = AttachOptions(),
    progress: Callable[[CollectReport], None] | None = None,
    report: CollectReport | None = None,
) -> CollectReport:
    """Collect rollouts inside a running event loop; see `collect_rollouts`.

    Cancelling it stops dispatching, lets rows being written finish, and leaves a resumable
    output; the cancellation is re-raised (pass `report` to read what was done).
    """
    job = _Job(
        Path(input_path), Path(output_path), agent_url, Path(capture_dir).resolve() if capture_dir is not None else None,
        num_repeats, limit, concurrency, timeout_s, resume, overwrite, max_attempts, model_sampling, attach_options,
    )  # fmt: skip
    _check_job(job)
    report = report or CollectReport(job.output_path, attempts_path_for(job.output_path))
    try:
        await _collect(job, report, progress)
    except asyncio.CancelledError:
        report.interrupted = True
        raise
    except BaseExceptionGroup as group:  # a worker's CollectError, not wrapped
        collect_errors = group.subgroup(CollectError)
        if collect_errors is not None:
            raise collect_errors.exceptions[0] from None
        raise
    return report


def collect_rollouts(
    input_path: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    *,
    agent_url: str,
    capture_dir: str | os.PathLike[str] | None = None,
    progress: Callable[[CollectReport], None] | None = None,
    **options: Any,
) -> CollectReport:
    """Send every task row to the agent's `POST /run` and write one attached output row per rollout.

    `options` are those of `collect_rollouts_async`: `num_repeats`, `limit`, `concurrency`,
    `timeout_s` (per rollout, None for no limit), `resume`, `overwrite`, `max_attempts`,
    `model_sampling` (for rows without their own) and `attach_options`. Without `capture_dir`
    rows are written without attachments. Ctrl-C or SIGTERM stops the run with
    `report.interrupted` set and a resumable output. Raises CollectError for bad input or
    settings, an unreachable agent, or a capture that cannot be cleared.

    Usage::

        report = collect_rollouts(
            "tasks.jsonl", "rollouts.jsonl", agent_url="http://127.0.0.1:8900",
            capture_dir="/abs/model-calls", num_repeats=2,
        )
        print(report.succeeded, report.failed, report.error_counts)
    """
    report = CollectReport(Path(output_path), attempts_path_for(output_path))

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        _on_signal(signal.SIGTERM, task.cancel)
        await collect_rollouts_async(
            input_path, output_path, agent_url=agent_url, capture_dir=capture_dir, progress=progress, report=report, **options
        )

    try:
        asyncio.run(main())
    except (KeyboardInterrupt, asyncio.CancelledError):
        report.interrupted = True
    return report


def _on_signal(signum: int, callback: Callable[[], Any]) -> None:
    """Call `callback` on a signal when the loop runs in the main thread; elsewhere do nothing."""
    try:
        asyncio.get_running_loop().add_signal_handler(signum, callback)
    except (RuntimeError, ValueError, NotImplementedError):
        pass

