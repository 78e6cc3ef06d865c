"""Durable appends per second: CaptureStore's group commit against one fsync per append.

The baseline, measured in the same run, is the reference store's approach: for every record,
open the file for append, flock it, write the line, flush, fsync, close (from threads, or from
asyncio tasks through `asyncio.to_thread`, as the reference's middleware does). CaptureStore
uses `append` from threads and `append_async` from tasks.

Scenarios, each at 1, 16 and 256 concurrent writers, each cell run for a fixed time:

    one rollout        every writer appends to the same rollout: group commit's case
    rollout per writer each writer has its own rollout: nothing to group, fsyncs run in parallel
    asyncio, one       concurrent asyncio tasks on one loop, all appending to one rollout

Every cell reads its files back and checks that the line count matches the appends counted.
Records are a real recorded Chat Completions tool call (request and parsed response).

    /work/main/.venv/bin/python bench/store_bench.py                 # about a minute
    /work/main/.venv/bin/python bench/store_bench.py --seconds 1 --write-docs
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
# tests.fixtures is the one place that finds the recorded exchanges ($LLMTAP_FIXTURES_DIR, else shared/).
sys.path.insert(0, str(ROOT))

from llmtap.store import CaptureStore  # noqa: E402
from tests.fixtures import FIXTURES_DIR  # noqa: E402

FIXTURE = "chat/tool-call-gpt4o"
DOCS = ROOT / "docs" / "benchmarks.md"
SECTION = "## Capture store"


def template_record() -> dict[str, Any]:
    """A raw capture line in the spec's shape, built from one real recorded exchange."""
    recorded = json.loads((FIXTURES_DIR / f"{FIXTURE}.json").read_text())
    return {
        "model_call_id": "",
        "dialect": "chat",
        "model_ref": {"type": "responses_api_models", "name": "policy_model"},
        "started_at": 0.0,
        "completed_at": 0.0,
        "latency_ms": 842.7,
        "latency_ttft_ms": None,
        "status_code": recorded["response"]["status"],
        "error_category": None,
        "request": recorded["request"]["json"],
        "response": json.loads(recorded["response"]["body_text"]),
    }


TEMPLATE = template_record()


def fresh_record() -> dict[str, Any]:
    now = time.time()
    return {**TEMPLATE, "model_call_id": uuid.uuid4().hex, "started_at": now, "completed_at": now}


# The two writers ----------------------------------------------------------------------------------


def baseline_append(root: Path, rollout_id: str, record: dict[str, Any]) -> None:
    """One fsync per append: open, flock, write, flush, fsync, close."""
    line = orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
    with open(root / f"{rollout_id}.capture.jsonl", "ab") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


class SyncCounter:
    """Counts data syncs on capture files, to report how many appends one fsync carried."""

    def __init__(self) -> None:
        self.real_fdatasync, self.real_fsync = os.fdatasync, os.fsync
        self.count = 0
        self.lock = threading.Lock()

    def _counted(self, real: Callable[[int], None]) -> Callable[[int], None]:
        def sync(fd: int) -> None:
            real(fd)
            with self.lock:
                self.count += 1

        return sync

    def __enter__(self) -> SyncCounter:
        setattr(os, "fdatasync", self._counted(self.real_fdatasync))
        setattr(os, "fsync", self._counted(self.real_fsync))
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(os, "fdatasync", self.real_fdatasync)
        setattr(os, "fsync", self.real_fsync)


@dataclass
class Cell:
    appends: int = 0
    seconds: float = 0.0
    syncs: int = 0
    lines_on_disk: int = 0

    @property
    def rate(self) -> float:
        return self.appends / self.seconds

    def add(self, other: Cell) -> None:
        self.appends += other.appends
        self.seconds += other.seconds
        self.syncs += other.syncs
        self.lines_on_disk += other.lines_on_disk


def measure(scenario: str, writers: int, seconds: float, rounds: int, parent: Path) -> tuple[Cell, Cell]:
    """Baseline and store, alternating over several short rounds so disk-load drift hits both alike."""
    totals = {"baseline": Cell(), "store": Cell()}
    for round_index in range(rounds):
        order = ("baseline", "store") if round_index % 2 == 0 else ("store", "baseline")
        for kind in order:
            if scenario.startswith("asyncio"):
                cell = run_tasks(kind, writers, seconds / rounds, parent, sync_process="threads" not in scenario)
            else:
                cell = run_threads(kind, scenario, writers, seconds / rounds, parent)
            if cell.lines_on_disk != cell.appends:
                raise SystemExit(f"{scenario}/{writers}: {cell.appends} appends but {cell.lines_on_disk} lines.")
            totals[kind].add(cell)
    return totals["baseline"], totals["store"]


def rollout_for(scenario: str, writer: int) -> str:
    return f"w{writer}" if scenario == "rollout per writer" else "shared"


def count_lines(root: Path) -> int:
    return sum(path.read_bytes().count(b"\n") for path in root.glob("*.capture.jsonl"))


def run_threads(kind: str, scenario: str, writers: int, seconds: float, parent: Path) -> Cell:
    root = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=parent))
    store = CaptureStore(root)
    counts = [0] * writers
    start = threading.Barrier(writers + 1)
    deadline = [0.0]

    def writer(index: int) -> None:
        rollout_id = rollout_for(scenario, index)
        start.wait()
        while time.perf_counter() < deadline[0]:
            if kind == "baseline":
                baseline_append(root, rollout_id, fresh_record())
            else:
                store.append(rollout_id, fresh_record())
            counts[index] += 1

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    with SyncCounter() as syncs:
        began = time.perf_counter()
        deadline[0] = began + seconds
        start.wait()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - began
    store.close()
    return Cell(sum(counts), elapsed, syncs.count, count_lines(root))


def run_tasks(kind: str, writers: int, seconds: float, parent: Path, sync_process: bool) -> Cell:
    """Appends from asyncio tasks: by default the store's sync helper process does the fsyncs,
    which this process's sync counter cannot see; `sync_process=False` keeps them on threads."""
    root = Path(tempfile.mkdtemp(prefix=f"{kind}-async-", dir=parent))
    store = CaptureStore(root, sync_process=sync_process)
    counts = [0] * writers

    async def writer(index: int, deadline: float) -> None:
        while time.perf_counter() < deadline:
            if kind == "baseline":
                await asyncio.to_thread(baseline_append, root, "shared", fresh_record())
            else:
                await store.append_async("shared", fresh_record())
            counts[index] += 1

    async def main() -> float:
        began = time.perf_counter()
        await asyncio.gather(*(writer(i, began + seconds) for i in range(writers)))
        return time.perf_counter() - began

    with SyncCounter() as syncs:
        elapsed = asyncio.run(main())
    store.close()
    return Cell(sum(counts), elapsed, syncs.count, count_lines(root))


# Report -----------------------------------------------------------------------------------------


def fsync_latency_ms(parent: Path) -> float:
    path = parent / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    samples = []
    try:
        for _ in range(50):
            os.write(fd, b"x" * 2048)
            began = time.perf_counter()
            os.fdatasync(fd)
            samples.append((time.perf_counter() - began) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(samples)


def filesystem_of(path: Path) -> str:
    best = ("?", "", "?")
    for line in Path("/proc/mounts").read_text().splitlines():
        device, mount, fstype = line.split()[:3]
        if str(path).startswith(mount) and len(mount) > len(best[1]):
            best = (device, mount, fstype)
    return f"{best[2]} ({best[0]} on {best[1]})"


def sequential_interleaved_us(parent: Path, appends: int = 300) -> tuple[float, float]:
    """One writer, baseline and store alternating append by append: the fairest single-writer view.

    Cells of whole rounds are at the mercy of fsync latency drifting on a shared disk; alternating
    every append exposes both sides to the same drift.
    """
    root = Path(tempfile.mkdtemp(prefix="sequential-", dir=parent))
    baseline = store_time = 0.0
    with CaptureStore(root) as store:
        for _ in range(appends):
            began = time.perf_counter()
            baseline_append(root, "baseline", fresh_record())
            middle = time.perf_counter()
            store.append("store", fresh_record())
            baseline, store_time = baseline + middle - began, store_time + time.perf_counter() - middle
    return baseline / appends * 1e6, store_time / appends * 1e6


def machine_notes(parent: Path) -> list[str]:
    return [
        f"- Machine: {platform.machine()}, {os.cpu_count()} CPUs (shared with other work while measured), "
        f"Linux {platform.release()}, Python {platform.python_version()}.",
        f"- Filesystem: {filesystem_of(parent)}; median fdatasync of a 2 KiB append: "
        f"{fsync_latency_ms(parent):.2f} ms.",
        f"- Record: a real recorded Chat Completions tool call, {len(orjson.dumps(fresh_record()))} bytes per line.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="run time of each side of a cell (default 3)")
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds per cell (default 6)")
    parser.add_argument("--writers", default="1,16,256", help="comma-separated writer counts")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--write-docs", action="store_true", help=f"replace '{SECTION}' in {DOCS}")
    args = parser.parse_args()
    counts = [int(part) for part in args.writers.split(",")]
    parent = Path(tempfile.mkdtemp(prefix="store-bench-", dir=args.dir)).resolve()

    load_at_start = os.getloadavg()[0]
    rows: list[tuple[str, int, Cell, Cell]] = []
    header = f"{'scenario':<20} {'writers':>7} {'baseline/s':>11} {'store/s':>9} {'ratio':>7} {'appends/fsync':>13}"
    print(header)
    for scenario in ("one rollout", "rollout per writer", "asyncio, one rollout", "asyncio (threads), one rollout"):
        for writers in counts:
            baseline, store = measure(scenario, writers, args.seconds, args.rounds, parent)
            rows.append((scenario, writers, baseline, store))
            print(
                f"{scenario:<20} {writers:>7} {baseline.rate:>11,.0f} {store.rate:>9,.0f} "
                f"{store.rate / baseline.rate:>6.1f}x {per_fsync_text(scenario, store):>13}",
                flush=True,
            )
    baseline_us, store_us = sequential_interleaved_us(parent)
    sequential = (
        f"- One writer, one rollout, baseline and store alternating append by append (300 each): "
        f"{baseline_us:,.0f} µs vs {store_us:,.0f} µs per durable append."
    )
    notes = [sequential, *machine_notes(parent), f"- Load average at the start of the run: {load_at_start:.1f}."]
    shutil.rmtree(parent)
    print("\n".join(notes))
    if args.write_docs:
        write_docs(rows, notes, args.seconds, args.rounds, store_us / baseline_us - 1)


def per_fsync_text(scenario: str, store: Cell) -> str:
    if scenario == "asyncio, one rollout":
        return "in helper"  # the sync helper process's fsyncs are not seen by this process's counter
    return f"{store.appends / max(store.syncs, 1):.1f}"


def write_docs(
    rows: list[tuple[str, int, Cell, Cell]], notes: list[str], seconds: float, rounds: int, sequential_gap: float
) -> None:
    table = [
        "| scenario | writers | baseline appends/s | CaptureStore appends/s | ratio | appends per fsync |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    ratios: dict[tuple[str, int], tuple[float, float]] = {}
    for scenario, writers, baseline, store in rows:
        ratio, per_sync = store.rate / baseline.rate, store.appends / max(store.syncs, 1)
        ratios[(scenario, writers)] = (ratio, per_sync)
        table.append(
            f"| {scenario} | {writers} | {baseline.rate:,.0f} | {store.rate:,.0f} | {ratio:.1f}x | "
            f"{per_fsync_text(scenario, store)} |"
        )
    most = max(writers for _, writers, _, _ in rows)
    one_ratio, one_per_sync = ratios.get(("one rollout", most), (0.0, 0.0))
    async_ratio, _ = ratios.get(("asyncio, one rollout", most), (0.0, 0.0))
    spread = [ratio for (name, writers), (ratio, _) in ratios.items() if name == "rollout per writer" and writers > 1]
    spread_text = f"{min(spread):.1f}x to {max(spread):.1f}x" if spread else "n/a"
    if spread and f"{min(spread):.1f}" == f"{max(spread):.1f}":
        spread_text = f"{min(spread):.1f}x"
    section = "\n".join(
        [
            SECTION,
            "",
            "Durable appends per second, from `bench/store_bench.py`. The baseline, measured in the same run,",
            "is the reference store's approach: one fsync per append (open, flock, write, fsync, close each",
            "time; from asyncio through `asyncio.to_thread`). CaptureStore: `append` from threads,",
            "`append_async` from tasks; an append returns only once its line is fsynced. Each side of a cell",
            f"ran {seconds:g} s in {rounds} rounds alternating with the other side, every round checked against",
            "the lines on disk. \"Appends per fsync\" counts CaptureStore's data and directory syncs.",
            "",
            *table,
            "",
            *notes,
            "",
            f"- **What group commit buys.** With {most} writers on one rollout, CaptureStore made {one_ratio:.1f}x",
            f"  the baseline's durable appends (threads; {async_ratio:.1f}x from asyncio tasks): one write and",
            f"  one fdatasync carried {one_per_sync:.0f} queued lines on average, while the baseline pays a full",
            "  fsync per append behind the file lock. The baseline's asyncio path also queues on the loop's",
            f"  default executor ({min(32, (os.cpu_count() or 1) + 4)} threads here); `append_async` never uses it.",
            "  CaptureStore's rate there is bounded by the 2 shared CPUs (the GIL serializes 256 threads'",
            "  encoding and wake-ups), so it moves with the machine's load; the baseline's, by fsync latency.",
            "- **What it does not buy.** With one writer per rollout there is nothing to group (one append per",
            f"  fsync), and CaptureStore ran at {spread_text} of the baseline at 16 and {most} writers. ext4 already",
            "  folds concurrent fsyncs of different files into shared journal commits, so both sides are CPU-bound",
            "  here, and CaptureStore's extra work per commit shows: the lock file, the clear() fence and",
            "  torn-tail checks (three more syscalls), the queue hand-off, and a directory fsync per new file.",
            "  That is the price of its guarantees (no lost or interleaved lines across processes, crash",
            "  repair, fencing, durable file creation), which the baseline does not give.",
            "- **One writer** (threads or asyncio) pays one fsync per append on both sides. Whole-round figures",
            "  for one writer drift with the shared disk (fdatasync latency on this VM swung between about 0.1",
            "  and 4 ms during this work): over seven full runs the asyncio one-writer row came out at 0.3x to",
            "  0.6x and the thread rows at 0.6x to 1.7x. In the append-by-append alternation above, the",
            f"  fairer single-writer comparison, CaptureStore took {abs(sequential_gap):.0%} "
            f"{'longer' if sequential_gap > 0 else 'less'} per append in this run. The",
            "  cause of the asyncio row's low figures is not pinned down: it is not the store's Python",
            "  overhead (about 30 us per append without fsync) nor fdatasync against fsync, both measured.",
            "",
        ]
    )
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n\n"
    start = text.find(SECTION)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + (text[end + 1 :] if end >= 0 else "")
    DOCS.write_text(text)
    print(f"Wrote '{SECTION}' to {DOCS}.")


if __name__ == "__main__":
    main()
