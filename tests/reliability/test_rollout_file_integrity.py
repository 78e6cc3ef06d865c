"""One rollout's capture file under many writers and after a crash mid-line.

tests/store/test_capture_store.py covers blocking appends from threads in 8 processes; here 8 processes append
through the path `llmtap serve` takes (`append_async` on an event loop, 1,000 each, many in
flight at once, some lines spanning many pages), and a torn tail left by a crashed writer meets
the next call through a real serve process.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from pathlib import Path

import httpx
import orjson
import pytest

from llmtap.errors import CaptureRecordError
from llmtap.store import CaptureStore
from llmtap.store.readers import read_rollout_calls
from tests.support.faults import FAULT_HEADER, FaultUpstream
from tests.support.serve_process import ServeProcess

WRITERS = 8
APPENDS_EACH = 1000
IN_FLIGHT = 64
SHARED = "shared-rollout"


def padding(writer: int, seq: int) -> str:
    size = 90_000 if seq % 211 == 0 else (seq * 37 + writer) % 3000  # a few lines span twenty pages
    return "é" * size


def append_like_serve(root: str, writer: int) -> None:
    """One process: 1,000 awaited appends, IN_FLIGHT at a time, as concurrent calls of a serve process make them."""

    async def run() -> None:
        with CaptureStore(root) as store:
            pending: set[asyncio.Future[object]] = set()
            for seq in range(APPENDS_EACH):
                record = {"model_call_id": f"w{writer}-{seq}", "writer": writer, "seq": seq, "pad": padding(writer, seq)}
                pending.add(asyncio.ensure_future(store.append_async(SHARED, record)))
                if len(pending) >= IN_FLIGHT:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        task.result()
            for task in asyncio.as_completed(pending):
                await task

    asyncio.run(run())


@pytest.mark.slow
def test_eight_processes_appending_a_thousand_each_to_one_rollout_lose_and_tear_nothing(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=append_like_serve, args=(str(tmp_path), w)) for w in range(WRITERS)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=300)
        assert process.exitcode == 0

    raw = (tmp_path / f"{SHARED}.capture.jsonl").read_bytes()
    lines = raw.split(b"\n")
    assert lines[-1] == b"" and len(lines) - 1 == WRITERS * APPENDS_EACH  # every line whole, none torn
    calls = read_rollout_calls(CaptureStore(tmp_path, create=False), SHARED, strict=True)
    assert not calls.unreadable_lines and not calls.torn_tail and not calls.incomplete
    assert [record.call_index for record in calls.records] == list(range(WRITERS * APPENDS_EACH))
    seen = sorted((line["writer"], line["seq"]) for line in map(orjson.loads, lines[:-1]))
    assert seen == [(w, s) for w in range(WRITERS) for s in range(APPENDS_EACH)]  # each exactly once
    for line in map(orjson.loads, lines[:-1]):  # no line carries another's bytes
        assert line["pad"] == padding(line["writer"], line["seq"])


CHAT = {"model": "gpt-4", "messages": [{"role": "user", "content": "Say this is a test"}]}


def test_a_torn_tail_is_skipped_counted_and_never_shifts_the_other_calls(
    fault_upstream: FaultUpstream, tmp_path: Path
) -> None:
    store = CaptureStore(tmp_path, create=False)
    url = "/ng-rollout/torn/v1/chat/completions"
    with ServeProcess(fault_upstream.base_url, tmp_path, log=tmp_path / "serve.log").start() as serve, httpx.Client(
        trust_env=False, timeout=30
    ) as http:
        for stream in (False, True, False):
            assert http.post(serve.base_url + url, json={**CHAT, "stream": stream}, headers={FAULT_HEADER: "ok"}).status_code == 200
        before = read_rollout_calls(store, "torn", strict=True).records
        with store.path_for("torn").open("ab") as crashed:  # a writer died half-way through its line
            whole = orjson.dumps(before[0].to_dict())
            crashed.write(whole[: len(whole) // 2])
        torn = read_rollout_calls(store, "torn", strict=True)
        assert http.post(serve.base_url + url, json=CHAT, headers={FAULT_HEADER: "ok"}).status_code == 200
    after = read_rollout_calls(store, "torn")

    assert torn.torn_tail and [r.model_call_id for r in torn.records] == [r.model_call_id for r in before]
    assert [r.call_index for r in torn.records] == [0, 1, 2]
    assert after.unreadable_lines == [3] and not after.torn_tail  # skipped and counted
    assert [r.call_index for r in after.records] == [0, 1, 2, 4]  # the others keep their index
    assert [r.model_call_id for r in after.records[:3]] == [r.model_call_id for r in before]
    with pytest.raises(CaptureRecordError, match="Line 4 of "):
        read_rollout_calls(store, "torn", strict=True)
