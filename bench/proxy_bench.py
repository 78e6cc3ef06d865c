"""What `llmtap serve` adds to a model call: latency, time to first chunk, chunk hold, throughput.

Three kinds of process, none sharing a GIL: a static upstream (raw asyncio HTTP server replaying a
recorded Chat Completions body or SSE stream), one `llmtap serve` process per proxied target, and
this process as the load generator (aiohttp, keep-alive pools). Targets, measured round by round
with their order rotated each round, so that machine noise lands on all of them alike:

    direct     the upstream called directly: the baseline
    off        `llmtap serve`, capture off (prefix stripped, nothing recorded)
    on         `llmtap serve`, capture on, durable before release, capture dir on disk
    on-tmpfs   capture on into tmpfs, where fsync is free: the CPU cost of capture alone
    on-export  (--export) capture on, each record also exported live as an OTLP span to a local sink
    on-redact  (--redact) capture on with `redact: true`: each record scanned and redacted before it is written

Each of C workers (C = 1, 16, 128) sends calls back to back under its own rollout id, as RL
rollouts do. Latency: send to last byte. Throughput: calls per second of wall time; capture-on over
capture-off is taken per round, and the median of the rounds is reported.

Chunk hold: the upstream writes each SSE event as its own chunk, after an SSE comment line
`: llmtap-bench seq=<i> sent_ns=<CLOCK_MONOTONIC>` (SSE parsers ignore comments). The client reads
the same clock on arrival: transit = arrival - sent. The proxy's hold is proxied transit minus
direct transit (p50, p99, max). From the event at which the client holds the complete answer (the
chat `finish_reason`, found by llmtap's StreamTracker) to `[DONE]`, events are held by design until
the record is fsynced, so they are reported apart from the streamed events (the `[DONE]` columns).
Every response is checked byte for byte against the fixture (stamps removed), and the records on
disk are counted against the calls that went through capture.

    /work/main/.venv/bin/python bench/proxy_bench.py            # full: 5 rounds
    /work/main/.venv/bin/python bench/proxy_bench.py --quick    # 1 short round
    /work/main/.venv/bin/python bench/proxy_bench.py --quick --export --redact   # with the observers' targets
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

# tests.fixtures is the one place that finds the recorded exchanges ($LLMTAP_FIXTURES_DIR, else shared/).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.fixtures import FIXTURES_DIR  # noqa: E402

LEVELS = (1, 16, 128)
MODES = ("non-streaming", "streaming")
# Calls per (mode, concurrency) cell and target in one round, before --scale.
CALLS = {
    ("non-streaming", 1): 200, ("non-streaming", 16): 800, ("non-streaming", 128): 1920,
    ("streaming", 1): 60, ("streaming", 16): 320, ("streaming", 128): 640,
}
CHAT_PATH = "/v1/chat/completions"
STAMP = b": llmtap-bench seq="
CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)
CELL_DEADLINE_S = 300.0
TARGET_ADDED_P50_MS = 1.0
TARGET_THROUGHPUT_RATIO = 0.85
TARGET_CHUNK_HOLD_MS = 1.0
NAN = float("nan")


# Fixtures ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fixture:
    """One recorded exchange as the bench uses it: request bytes, response bytes, SSE events."""

    name: str
    request: bytes
    body: bytes
    events: tuple[bytes, ...]

    @classmethod
    def load(cls, name: str) -> Fixture:
        path = FIXTURES_DIR / f"{name}.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise SystemExit(f"Cannot read fixture '{path}' ({exc.strerror}); name one such as chat/text-basic-gpt4o.")
        body = data["response"]["body_text"].encode("utf-8")
        events = tuple(event + b"\n\n" for event in body.split(b"\n\n") if event)
        is_stream = data["response"]["headers"].get("content-type", "").startswith("text/event-stream")
        if is_stream and b"".join(events) != body:
            raise SystemExit(f"Fixture {name} does not split into blank-line-separated events; choose another.")
        return cls(name, orjson.dumps(data["request"]["json"]), body, events)


def terminal_event_index(fixture: Fixture) -> int:
    """Index of the first event llmtap's own stream tracker holds for durability (the one completing the answer)."""
    from llmtap.dialects import dialect_for_path
    from llmtap.records import StreamTracker

    dialect = dialect_for_path(CHAT_PATH)
    assert dialect is not None
    tracker = StreamTracker(dialect)
    for index, event in enumerate(fixture.events):
        if tracker.feed(event):
            return index
    return len(fixture.events) - 1


# The static upstream (its own process) -----------------------------------------------------------


class StaticUpstream(asyncio.Protocol):
    """HTTP/1.1 keep-alive server: the recorded JSON, or the recorded SSE stream when asked to stream."""

    def __init__(self, json_response: bytes, sse_head: bytes, events: tuple[bytes, ...], gap_s: float) -> None:
        self.json_response, self.sse_head, self.events, self.gap_s = json_response, sse_head, events, gap_s
        self.buffer = b""
        self.streaming = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self.answer_ready_requests()

    def answer_ready_requests(self) -> None:
        assert self.transport is not None
        while not self.streaming and (head_end := self.buffer.find(b"\r\n\r\n")) >= 0:
            length = CONTENT_LENGTH.search(self.buffer[:head_end])
            body_end = head_end + 4 + (int(length.group(1)) if length else 0)
            if len(self.buffer) < body_end:
                return
            body, self.buffer = self.buffer[head_end + 4 : body_end], self.buffer[body_end:]
            request = orjson.loads(body) if body else None
            if isinstance(request, dict) and request.get("stream") is True:
                self.streaming = True
                asyncio.get_running_loop().create_task(self.stream())
            else:
                self.transport.write(self.json_response)

    async def stream(self) -> None:
        transport = self.transport
        assert transport is not None
        transport.write(self.sse_head)
        for seq, event in enumerate(self.events):
            if seq and self.gap_s:
                await asyncio.sleep(self.gap_s)
            if transport.is_closing():
                return
            payload = b"%s%d sent_ns=%d\n%s" % (STAMP, seq, time.monotonic_ns(), event)
            transport.write(b"%x\r\n%s\r\n" % (len(payload), payload))
        transport.write(b"0\r\n\r\n")
        self.streaming = False
        self.answer_ready_requests()


def serve_upstream(args: argparse.Namespace) -> None:
    """Entry point of the upstream process: print `PORT <n>`, serve until SIGTERM or the bench dies."""
    json_fixture, sse_fixture = Fixture.load(args.json_fixture), Fixture.load(args.stream_fixture)
    json_response = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(json_fixture.body), json_fixture.body)
    sse_head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n")
    gap_s = args.chunk_gap_ms / 1000
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(loop.create_server(
        lambda: StaticUpstream(json_response, sse_head, sse_fixture.events, gap_s), "127.0.0.1", 0, backlog=4096))
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    parent = os.getppid()
    loop.add_signal_handler(signal.SIGTERM, loop.stop)

    def stop_when_orphaned() -> None:
        if os.getppid() != parent:
            loop.stop()
        loop.call_later(1.0, stop_when_orphaned)

    loop.call_later(1.0, stop_when_orphaned)
    loop.run_forever()


def serve_otlp_sink() -> None:
    """Entry point of the OTLP sink process: answer every POST with an empty 200, print `PORT <n>`.

    A sink, not a collector: it reads each request whole and accepts it, so the proxy's export
    cost is measured without a collector's own work on this machine's two cores.
    """

    class Sink(asyncio.Protocol):
        def __init__(self) -> None:
            self.buffer = b""

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while (head_end := self.buffer.find(b"\r\n\r\n")) >= 0:
                length = CONTENT_LENGTH.search(self.buffer[:head_end])
                body_end = head_end + 4 + (int(length.group(1)) if length else 0)
                if len(self.buffer) < body_end:
                    return
                self.buffer = self.buffer[body_end:]
                self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n")

    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(loop.create_server(Sink, "127.0.0.1", 0))
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    loop.add_signal_handler(signal.SIGTERM, loop.stop)
    loop.run_forever()


# Child processes and what they cost --------------------------------------------------------------


def die_with_parent() -> None:
    """preexec_fn: PR_SET_PDEATHSIG, so no child outlives a bench that was killed."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Processes:
    """The upstream and proxies this run started; `stop()` ends exactly those, by their handles."""

    def __init__(self, workdir: Path, serve_command: list[str]) -> None:
        self.workdir = workdir
        self.serve_command = serve_command
        self.started: list[subprocess.Popen[bytes]] = []

    def start_upstream(self, args: argparse.Namespace) -> tuple[int, int]:
        command = [sys.executable, str(Path(__file__).resolve()), "--upstream-server", "--json-fixture",
                   args.json_fixture, "--stream-fixture", args.stream_fixture, "--chunk-gap-ms", str(args.chunk_gap_ms)]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, preexec_fn=die_with_parent, start_new_session=True)
        self.started.append(process)
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        if not line.startswith("PORT "):
            raise SystemExit(f"The static upstream did not start (it printed {line!r}).")
        return int(line.split()[1]), process.pid

    def start_otlp_sink(self) -> int:
        command = [sys.executable, str(Path(__file__).resolve()), "--otlp-sink"]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, preexec_fn=die_with_parent, start_new_session=True)
        self.started.append(process)
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        if not line.startswith("PORT "):
            raise SystemExit(f"The OTLP sink did not start (it printed {line!r}).")
        return int(line.split()[1])

    def start_proxy(self, name: str, upstream_port: int, capture_dir: Path | None,
                    overrides: tuple[str, ...] = ()) -> tuple[int, int]:
        port = free_port()
        command = [*self.serve_command, "serve", "--upstream", f"http://127.0.0.1:{upstream_port}",
                   "--host", "127.0.0.1", "--port", str(port)]
        if capture_dir is not None:
            command += ["--capture-dir", str(capture_dir)]
        command += overrides
        log = self.workdir / f"serve-{name}.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT,
                                       preexec_fn=die_with_parent, start_new_session=True)
        self.started.append(process)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(f"llmtap serve ({name}) exited with code {process.returncode}:\n{log.read_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return port, process.pid
            time.sleep(0.05)
        raise SystemExit(f"llmtap serve ({name}) did not listen on 127.0.0.1:{port} within 30 s; see {log}.")

    def stop(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=15)
            if process.poll() is None:
                process.kill()
                process.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, all its threads, and its live child processes, from /proc.

    Children count so that work a process hands to a helper (the capture store's sync helper) is
    charged to it.
    """
    total = 0.0
    for member in (pid, *child_pids(pid)):
        try:
            with open(f"/proc/{member}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except FileNotFoundError:  # exited meanwhile
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def child_pids(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as children:
                found.extend(int(child) for child in children.read().split())
        except FileNotFoundError:
            continue
    return found


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot: every process counts, other users' too."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    return sum(values) - values[3] - values[4], sum(values)


def upstream_connections(pid: int, upstream_port: int) -> int:
    """Established connections from process `pid` to the upstream: the size of its upstream pool."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    with open("/proc/net/tcp") as table:
        rows = [row.split() for row in table.readlines()[1:]]
    return sum(1 for r in rows if r[3] == "01" and int(r[2].rsplit(":", 1)[1], 16) == upstream_port and r[9] in inodes)


# Load generation ---------------------------------------------------------------------------------


@dataclass
class Cell:
    """What one (target, mode, concurrency) measurement of one round saw."""

    latencies_ms: list[float] = field(default_factory=list)
    first_chunk_ms: list[float] = field(default_factory=list)
    streamed_transit_ms: list[float] = field(default_factory=list)
    held_transit_ms: list[float] = field(default_factory=list)
    errors: int = 0
    mismatches: int = 0
    wall_s: float = 0.0
    proxy_cpu_s: float = 0.0
    upstream_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    machine_busy: float = 0.0  # share of all CPUs busy during the cell


@dataclass
class Target:
    name: str
    base_url: str
    pid: int | None
    session: Any
    ok_calls: int = 0


@dataclass(frozen=True)
class Workload:
    fixtures: dict[str, Fixture]
    terminal: int
    upstream_pid: int


async def one_call(target: Target, url: str, fixture: Fixture, stream: bool, terminal: int, cell: Cell) -> None:
    started = time.monotonic_ns()
    try:
        async with target.session.post(url, data=fixture.request, headers={"content-type": "application/json"}) as reply:
            body = await (read_stream(reply, started, terminal, cell) if stream else reply.read())
            done = time.monotonic_ns()
            if reply.status != 200 or body != fixture.body:
                cell.mismatches += 1
    except Exception:
        cell.errors += 1
        return
    cell.latencies_ms.append((done - started) / 1e6)
    target.ok_calls += 1


async def read_stream(reply: Any, started: int, terminal: int, cell: Cell) -> bytes:
    """Read an SSE body as it arrives, timing each stamped event; return the body without stamps."""
    pending = b""
    events: list[bytes] = []
    async for piece in reply.content.iter_any():
        arrived = time.monotonic_ns()
        if not events and not pending:
            cell.first_chunk_ms.append((arrived - started) / 1e6)
        pending += piece
        while (end := pending.find(b"\n\n")) >= 0:
            event, pending = pending[: end + 2], pending[end + 2 :]
            if event.startswith(STAMP):
                line_end = event.index(b"\n")
                seq, sent = event[len(STAMP) : line_end].split(b" sent_ns=")
                held = int(seq) >= terminal
                (cell.held_transit_ms if held else cell.streamed_transit_ms).append((arrived - int(sent)) / 1e6)
                event = event[line_end + 1 :]
            events.append(event)
    return b"".join(events) + pending


async def measure(target: Target, mode: str, concurrency: int, calls: int, label: str, work: Workload) -> Cell:
    """`calls` calls from `concurrency` workers, each under its own rollout id, against one target."""
    cell = Cell()
    fixture = work.fixtures[mode]

    async def worker(index: int) -> None:
        prefix = f"/ng-rollout/{label}-w{index}" if target.pid else ""
        url = f"{target.base_url}{prefix}{CHAT_PATH}"
        for _ in range(max(1, calls // concurrency)):
            await one_call(target, url, fixture, mode == "streaming", work.terminal, cell)

    proxy_cpu = cpu_seconds(target.pid) if target.pid else 0.0
    upstream_cpu, client_cpu, (busy, total) = cpu_seconds(work.upstream_pid), time.process_time(), machine_ticks()
    began = time.monotonic()
    await asyncio.wait_for(asyncio.gather(*(worker(i) for i in range(concurrency))), CELL_DEADLINE_S)
    cell.wall_s = time.monotonic() - began
    cell.proxy_cpu_s = cpu_seconds(target.pid) - proxy_cpu if target.pid else 0.0
    cell.upstream_cpu_s = cpu_seconds(work.upstream_pid) - upstream_cpu
    cell.client_cpu_s = time.process_time() - client_cpu
    busy_after, total_after = machine_ticks()
    cell.machine_busy = (busy_after - busy) / max(1, total_after - total)
    return cell


# Summaries ---------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile, q in 0..100 (100 is the max); NaN when there is nothing to rank."""
    if not values:
        return NAN
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(len(ordered) * q / 100) - 1))]


def median(values: list[float]) -> float:
    ordered = sorted(v for v in values if v == v)
    if not ordered:
        return NAN
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def summarize_cells(cells: list[Cell], direct: list[Cell], off: list[Cell], streaming: bool) -> dict[str, float]:
    """One row of figures for one (target, mode, concurrency), rounds pooled; throughput per round."""

    def pooled(group: list[Cell], name: str) -> list[float]:
        return [v for cell in group for v in getattr(cell, name)]

    def throughput(group: list[Cell]) -> list[float]:
        return [len(c.latencies_ms) / c.wall_s if c.wall_s else NAN for c in group]

    calls = sum(len(c.latencies_ms) for c in cells) or 1
    walls = sum(c.wall_s for c in cells) or 1.0
    row = {
        "calls": float(sum(len(c.latencies_ms) for c in cells)),
        "errors": float(sum(c.errors + c.mismatches for c in cells)),
        "calls_per_s": median(throughput(cells)),
        "throughput_vs_off": median([a / b for a, b in zip(throughput(cells), throughput(off)) if b == b and b]),
        "machine_busy": sum(c.machine_busy * c.wall_s for c in cells) / walls,
    }
    for process in ("proxy", "upstream", "client"):
        row[f"{process}_cpu_ms_per_call"] = 1000 * sum(getattr(c, f"{process}_cpu_s") for c in cells) / calls
    metrics = [("latencies_ms", "")]
    if streaming:
        metrics += [("first_chunk_ms", "first_chunk_"), ("streamed_transit_ms", "chunk_"), ("held_transit_ms", "final_")]
    for name, key in metrics:
        mine, base = pooled(cells, name), pooled(direct, name)
        for q, tag in ((50, "p50"), (99, "p99"), (100, "max")):
            row[f"{key}{tag}_ms"] = pct(mine, q)
            row[f"{key}added_{tag}_ms"] = pct(mine, q) - pct(base, q)
    return row


def fmt(value: float, signed: bool = False) -> str:
    return "-" if value != value else f"{value:+.2f}" if signed else f"{value:.2f}"


def print_tables(summary: dict[str, dict[str, float]], targets: list[str], levels: list[int], modes: list[str]) -> None:
    for mode in modes:
        for level in levels:
            rows = [(t, summary[f"{mode}/c{level}/{t}"]) for t in targets]
            print(f"\n{mode}, concurrency {level}  ({rows[0][1]['calls']:.0f} calls per target, rounds pooled)")
            print(f"  {'target':<9} {'p50 ms':>7} {'p99 ms':>7} {'+p50':>7} {'+p99':>7} {'calls/s':>7} {'vs off':>6}"
                  f" {'CPU ms/call proxy/upstream/client':>33} {'busy':>5} {'err':>4}")
            for name, r in rows:
                extra = name != "direct"
                cpu = f"{fmt(r['proxy_cpu_ms_per_call']) if extra else '-'}/{fmt(r['upstream_cpu_ms_per_call'])}/" \
                      f"{fmt(r['client_cpu_ms_per_call'])}"
                print(f"  {name:<9} {fmt(r['p50_ms']):>7} {fmt(r['p99_ms']):>7}"
                      f" {fmt(r['added_p50_ms'], True) if extra else '':>7} {fmt(r['added_p99_ms'], True) if extra else '':>7}"
                      f" {r['calls_per_s']:>7.0f} {fmt(r['throughput_vs_off']) if extra else '':>6} {cpu:>33}"
                      f" {r['machine_busy']:>5.0%} {r['errors']:>4.0f}")
            if mode != "streaming":
                continue
            print(f"  {'':<9} {'1st chunk':>9} {'+p50':>6} {'+p99':>6} | {'chunk transit p50/p99/max':>25} {'+p50':>6}"
                  f" {'+p99':>6} {'+max':>6} | {'[DONE] p50/p99':>14} {'+p50':>6}")
            for name, r in rows:
                extra = name != "direct"
                added = {key: f"{fmt(r[key], True) if extra else '':>6}" for key in r if "_added_" in key}
                transit = f"{fmt(r['chunk_p50_ms'])}/{fmt(r['chunk_p99_ms'])}/{fmt(r['chunk_max_ms'])}"
                final = f"{fmt(r['final_p50_ms'])}/{fmt(r['final_p99_ms'])}"
                print(f"  {name:<9} {fmt(r['first_chunk_p50_ms']):>9} {added['first_chunk_added_p50_ms']}"
                      f" {added['first_chunk_added_p99_ms']} | {transit:>25} {added['chunk_added_p50_ms']}"
                      f" {added['chunk_added_p99_ms']} {added['chunk_added_max_ms']} | {final:>14}"
                      f" {added['final_added_p50_ms']}")


def verdicts(summary: dict[str, dict[str, float]], levels: list[int]) -> list[tuple[str, bool, str]]:
    """The issue's three targets, each with the figure it was judged on."""
    found: list[tuple[str, bool, str]] = []
    if "non-streaming/c1/on" in summary:
        added, off = summary["non-streaming/c1/on"]["added_p50_ms"], summary["non-streaming/c1/off"]["added_p50_ms"]
        found.append((f"capture on adds <= {TARGET_ADDED_P50_MS:g} ms p50 over direct, concurrency 1",
                      added <= TARGET_ADDED_P50_MS, f"{added:+.2f} ms (capture off: {off:+.2f} ms)"))
    top = max(levels)
    for mode in MODES:
        if f"{mode}/c{top}/on" in summary:
            ratio = summary[f"{mode}/c{top}/on"]["throughput_vs_off"]
            found.append((f"capture on keeps >= {TARGET_THROUGHPUT_RATIO:.0%} of capture-off throughput, "
                          f"concurrency {top}, {mode}", ratio >= TARGET_THROUGHPUT_RATIO, f"{ratio:.2f}"))
    if "streaming/c1/on" in summary:
        row = summary["streaming/c1/on"]
        found.append((f"no streamed chunk held longer than {TARGET_CHUNK_HOLD_MS:g} ms (transit vs direct, concurrency 1)",
                      row["chunk_added_p99_ms"] <= TARGET_CHUNK_HOLD_MS,
                      f"{row['chunk_added_p99_ms']:+.2f} ms p99, {row['chunk_added_max_ms']:+.2f} ms max"))
    return found


# Orchestration -----------------------------------------------------------------------------------


def fsync_probe(directory: Path, count: int = 50) -> float:
    """Median ms of one 2 KB append + fdatasync in `directory`: the floor of durable-before-release."""
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    times = []
    try:
        for _ in range(count):
            began = time.perf_counter()
            os.write(fd, b"x" * 2048 + b"\n")
            os.fdatasync(fd)
            times.append((time.perf_counter() - began) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return median(times)


def records_on_disk(directory: Path, calls: int) -> dict[str, int]:
    lines = sum(path.read_bytes().count(b"\n") for path in directory.glob("*.capture.jsonl"))
    return {"records": lines, "calls": calls, "incomplete_markers": len(list(directory.glob("*.capture.incomplete")))}


async def run_rounds(args: argparse.Namespace, targets: list[Target], work: Workload) -> dict[tuple[str, str, int], list[Cell]]:
    """Warm every pool up to the top concurrency, then measure each cell, target order rotating per round."""
    for mode in args.modes:
        for target in targets:
            await measure(target, mode, max(args.levels), 2 * max(args.levels), "warmup", work)
    cells: dict[tuple[str, str, int], list[Cell]] = {}
    began = time.monotonic()
    for round_index in range(args.rounds):
        for mode in args.modes:
            for level in args.levels:
                calls = max(level, int(CALLS[(mode, level)] * args.scale) // level * level)
                shift = round_index % len(targets)
                for target in targets[shift:] + targets[:shift]:
                    cell = await measure(target, mode, level, calls, f"r{round_index}-{mode[0]}{level}", work)
                    cells.setdefault((target.name, mode, level), []).append(cell)
        print(f"round {round_index + 1}/{args.rounds} done ({time.monotonic() - began:.0f} s)", flush=True)
    return cells


async def run(args: argparse.Namespace, processes: Processes, workdir: Path) -> dict[str, Any]:
    import aiohttp

    fixtures = {"non-streaming": Fixture.load(args.json_fixture), "streaming": Fixture.load(args.stream_fixture)}
    capture_dirs = {"on": Path(tempfile.mkdtemp(prefix="captures-", dir=workdir))}
    if not args.no_tmpfs and os.access("/dev/shm", os.W_OK):
        capture_dirs["on-tmpfs"] = Path(tempfile.mkdtemp(prefix="llmtap-bench-", dir="/dev/shm"))
    overrides: dict[str, tuple[str, ...]] = {}
    if args.export:
        capture_dirs["on-export"] = Path(tempfile.mkdtemp(prefix="captures-export-", dir=workdir))
        overrides["on-export"] = (f"++otlp_endpoint=http://127.0.0.1:{processes.start_otlp_sink()}",)
    if args.redact:
        capture_dirs["on-redact"] = Path(tempfile.mkdtemp(prefix="captures-redact-", dir=workdir))
        overrides["on-redact"] = ("++redact=true",)
    probes = {"disk_before": fsync_probe(capture_dirs["on"])}
    targets: list[Target] = []
    try:
        upstream_port, upstream_pid = processes.start_upstream(args)
        targets.append(Target("direct", f"http://127.0.0.1:{upstream_port}", None, None))
        for name in ["off", *capture_dirs]:
            port, pid = processes.start_proxy(name, upstream_port, capture_dirs.get(name), overrides.get(name, ()))
            targets.append(Target(name, f"http://127.0.0.1:{port}", pid, None))
        print(f"processes: load generator {os.getpid()}, upstream {upstream_pid}, "
              + ", ".join(f"{t.name} {t.pid}" for t in targets if t.pid), flush=True)
        for target in targets:
            target.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=120),
                                                   timeout=aiohttp.ClientTimeout(total=60), auto_decompress=False)
        began = time.monotonic()
        cells = await run_rounds(args, targets, Workload(fixtures, terminal_event_index(fixtures["streaming"]), upstream_pid))
        pools = {t.name: upstream_connections(t.pid, upstream_port) for t in targets if t.pid}
        await asyncio.sleep(0.5)  # let the last commits land before counting records
        summary = {
            f"{mode}/c{level}/{name}": summarize_cells(
                group, cells[("direct", mode, level)], cells[("off", mode, level)], mode == "streaming")
            for (name, mode, level), group in cells.items()
        }
        records = {t.name: records_on_disk(capture_dirs[t.name], t.ok_calls) for t in targets if t.name in capture_dirs}
        probes["disk_after"] = fsync_probe(capture_dirs["on"])
        if "on-tmpfs" in capture_dirs:
            probes["tmpfs"] = fsync_probe(capture_dirs["on-tmpfs"])
        return {"summary": summary, "targets": [t.name for t in targets], "records": records,
                "upstream_pools": pools, "fsync_probe_ms": probes, "elapsed_s": time.monotonic() - began}
    finally:
        for target in targets:
            if target.session is not None:
                await target.session.close()
        if "on-tmpfs" in capture_dirs:
            shutil.rmtree(capture_dirs["on-tmpfs"], ignore_errors=True)


def machine_notes() -> str:
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    return (f"{os.cpu_count()} CPUs ({model}), Linux {platform.release()}, Python {platform.python_version()}, "
            f"load average at start {os.getloadavg()[0]:.2f}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Measure what `llmtap serve` adds to a model call.")
    parser.add_argument("--quick", action="store_true", help="one round with a fifth of the calls")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 5, quick 1)")
    parser.add_argument("--scale", type=float, help="multiply the calls per cell (default 1, quick 0.2)")
    parser.add_argument("--levels", type=int, nargs="+", default=list(LEVELS), help="concurrency levels")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--no-tmpfs", action="store_true", help="skip the capture-on-tmpfs target")
    parser.add_argument("--chunk-gap-ms", type=float, default=2.0, help="upstream pause between SSE events")
    parser.add_argument("--json-fixture", default="chat/text-basic-gpt4o")
    parser.add_argument("--stream-fixture", default="chat/text-stream-include-usage-gpt4")
    parser.add_argument("--serve-cmd", default=f"{sys.executable} -m llmtap",
                        help="command taking `serve ...` arguments, to measure another build of the proxy")
    parser.add_argument("--json", dest="json_out", type=Path, help="also write every figure to this file")
    parser.add_argument("--export", action="store_true", help="add on-export: live OTLP export to a local sink")
    parser.add_argument("--redact", action="store_true", help="add on-redact: capture with redact: true")
    parser.add_argument("--upstream-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--otlp-sink", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (1 if args.quick else 5)
    args.scale = args.scale or (0.2 if args.quick else 1.0)
    if args.rounds < 1 or args.scale <= 0 or not set(args.levels) <= set(LEVELS):
        parser.error(f"--rounds and --scale must be positive and --levels among {list(LEVELS)}.")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.upstream_server:
        serve_upstream(args)
        return 0
    if args.otlp_sink:
        serve_otlp_sink()
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="llmtap-proxy-bench-"))
    print(f"machine: {machine_notes()}", flush=True)
    processes = Processes(workdir, args.serve_cmd.split())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        outcome = asyncio.run(run(args, processes, workdir))
    finally:
        processes.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    summary, targets = outcome["summary"], outcome["targets"]
    print(f"measured for {outcome['elapsed_s']:.0f} s; fdatasync of a 2 KB append (median): "
          + ", ".join(f"{k} {v:.2f} ms" for k, v in outcome["fsync_probe_ms"].items()))
    print_tables(summary, targets, args.levels, args.modes)
    print("\nproxy->upstream pooled connections at the end: "
          + ", ".join(f"{name} {count}" for name, count in outcome["upstream_pools"].items()))
    print("records on disk: " + ", ".join(f"{name} {r['records']} for {r['calls']} calls, "
                                          f"{r['incomplete_markers']} incomplete markers"
                                          for name, r in outcome["records"].items()))
    print("\ntargets (issue 3):")
    for text, passed, figure in verdicts(summary, args.levels):
        print(f"  [{'PASS' if passed else 'FAIL'}] {text}: {figure}")
    if args.json_out:
        args.json_out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **outcome}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
