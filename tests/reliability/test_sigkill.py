"""SIGKILL of `llmtap serve` under load: no call whose client got its whole response loses its record.

A bounded version of `bench/soak.py`: 50 concurrent streams (chat, Responses, Messages) through a
real serve process, SIGKILL of serve and its sync helper mid-run, a restart on the same capture
dir, more calls, and every file read with the strict reader.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.reliability.kill_load import LoadResult, run_streams, verify_capture, wait_until
from tests.support.replay import ReplayUpstream
from tests.support.serve_process import ServeProcess

STREAMS = 50
ROLLOUTS = 10


async def load_until(serve: ServeProcess, result: LoadResult, *, complete: int, prefix: str, kill: bool) -> None:
    """Run STREAMS streams until `complete` calls completed, then SIGKILL serve mid-run (or just stop)."""
    stop = asyncio.Event()
    load = asyncio.create_task(run_streams(serve.base_url, concurrency=STREAMS, rollouts=ROLLOUTS, stop=stop,
                                           result=result, prefix=prefix))
    assert await wait_until(lambda: len(result.complete) >= complete or load.done(), timeout=120)
    if kill:
        await asyncio.to_thread(serve.kill)
    stop.set()
    await asyncio.wait_for(load, timeout=120)


@pytest.mark.slow
def test_sigkill_under_load_keeps_every_complete_call_and_every_file_readable(tmp_path: Path) -> None:
    capture = tmp_path / "capture"
    first, second = LoadResult(), LoadResult()
    with ReplayUpstream(piece_delay=0.03).start() as upstream:
        serve = ServeProcess(upstream.base_url, capture, log=tmp_path / "serve.log").start()
        try:
            asyncio.run(load_until(serve, first, complete=150, prefix="before", kill=True))
        finally:
            serve.stop()
        killed = verify_capture(capture, first.complete)
        with ServeProcess(upstream.base_url, capture, log=tmp_path / "serve-restarted.log").start() as restarted:
            asyncio.run(load_until(restarted, second, complete=60, prefix="after", kill=False))
        restarted_check = verify_capture(capture, first.complete | second.complete)

    assert first.broken > 0, "the kill must land while streams are in flight"
    assert killed.missing == [] and killed.damaged_files == []  # strict reads; a torn tail alone is allowed
    assert killed.records >= len(first.complete)
    assert restarted_check.missing == []
    assert set(restarted_check.damaged_files) <= set(killed.torn)  # only a torn tail, ended by the next append
    assert restarted_check.torn == []
