"""Concurrent streams through `llmtap serve`, and the check of a capture dir after serve was killed.

Shared by tests/reliability/test_sigkill.py (50 streams) and bench/soak.py (1,000). Each call is a
recorded stream (chat, Responses, Messages by turns) picked with the replay upstream's
`x-replay-fixture` header, so its body can carry a unique id (`metadata.llmtap_load_call`) that
its record keeps. A call is *complete* when its client read the whole HTTP response without an
error: such a call must have its record on disk (durable before the last byte).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from llmtap.errors import CaptureRecordError
from llmtap.store import CaptureStore
from llmtap.store.readers import read_rollout_calls
from tests.fixtures import fixture
from tests.support.replay import FIXTURE_HEADER

__all__ = ["LOAD_FIXTURES", "LoadResult", "Verification", "run_streams", "verify_capture", "wait_until"]

LOAD_FIXTURES = (
    "chat/text-stream-include-usage-gpt4",
    "responses/text-basic-stream-gpt55",
    "messages/text-stream-sonnet45",
)
CALL_ID_KEY = "llmtap_load_call"


@dataclass
class LoadResult:
    """What the clients saw: the ids of complete calls, and how many broke or were refused."""

    complete: set[str] = field(default_factory=set)
    broken: int = 0
    refused: int = 0
    started: int = 0
    in_flight: int = 0


async def run_streams(
    base_url: str,
    *,
    concurrency: int,
    rollouts: int,
    stop: asyncio.Event,
    result: LoadResult,
    prefix: str = "load",
    pause: float = 0.0,
) -> None:
    """Keep `concurrency` streams going through serve at `base_url` until `stop` is set."""
    counter = itertools.count()
    bodies = [(name, fixture(name).request_path, fixture(name).request_json) for name in LOAD_FIXTURES]
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=300, sock_read=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False) as session:

        async def worker(slot: int) -> None:
            while not stop.is_set():
                number = next(counter)
                name, path, request = bodies[number % len(bodies)]
                call_id = f"{prefix}-{number}"
                rollout = f"{prefix}-r{number % rollouts}"
                body = {**request, "stream": True, "metadata": {CALL_ID_KEY: call_id}}
                result.started += 1
                result.in_flight += 1
                try:
                    async with session.post(f"{base_url}/ng-rollout/{rollout}{path}", json=body,
                                            headers={FIXTURE_HEADER: name}) as response:
                        await response.read()  # raises if the body ends before its last chunk
                        if response.status == 200:
                            result.complete.add(call_id)
                        else:
                            result.broken += 1
                except aiohttp.ClientConnectorError:
                    result.refused += 1  # serve is gone; wait for the stop
                    await asyncio.sleep(0.05)
                except (TimeoutError, aiohttp.ClientError):
                    result.broken += 1
                finally:
                    result.in_flight -= 1
                if pause:
                    await asyncio.sleep(pause)

        await asyncio.gather(*(worker(slot) for slot in range(concurrency)))


@dataclass
class Verification:
    """What a capture dir held after the kill: per file, read strictly."""

    files: int = 0
    records: int = 0
    torn: list[str] = field(default_factory=list)  # rollouts whose file ends in an unfinished line
    damaged_files: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # complete calls without a record
    recorded_ids: set[str] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        return not self.damaged_files and not self.missing


def verify_capture(capture_dir: Path, complete: set[str]) -> Verification:
    """Read every rollout file strictly (a torn tail is allowed, and counted) and match complete calls to records."""
    found = Verification()
    store = CaptureStore(capture_dir, create=False)
    for rollout_id in store.rollouts():
        found.files += 1
        try:
            calls = read_rollout_calls(store, rollout_id, strict=True)
        except CaptureRecordError:
            found.damaged_files.append(rollout_id)
            continue
        if calls.torn_tail:
            found.torn.append(rollout_id)
        found.records += len(calls.records)
        for record in calls.records:
            call_id = _call_id(record.request)
            if call_id is not None:
                found.recorded_ids.add(call_id)
    found.missing = sorted(complete - found.recorded_ids)
    return found


def _call_id(request: dict[str, Any] | None) -> str | None:
    metadata = request.get("metadata") if isinstance(request, dict) else None
    value = metadata.get(CALL_ID_KEY) if isinstance(metadata, dict) else None
    return value if isinstance(value, str) else None


async def wait_until(condition: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll `condition` on the loop; True once it holds, False after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(interval)
    return True
