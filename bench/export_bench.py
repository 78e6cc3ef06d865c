"""How fast the store exports to Parquet and OTLP and answers SQL, against reading it through the readers.

Generates, in a temp dir, the attach bench's capture store (`attach_bench.generate`: 10-call
Chat Completions tool loops built from two real recordings, through the real capture pipeline),
by default 1,000,000 calls, and an attached rollouts file for the rewards. Then, each in a fresh
subprocess so that its peak memory is its own:

    readers        every rollout read through `read_rollout_calls` (the store's public reader):
                   the floor any consumer of the records pays, and the baseline of the others
    parquet        `export_parquet` with the attached rows (calls and rollouts tables)
    parquet again  the same export once more: nothing is new, so nothing is read
    query          each README question (`llmtap.export.examples.QUESTIONS`) over the export
    otlp           `export_otlp` to a loopback OTLP/HTTP receiver in its own process
    live submit    `LiveExporter.submit` on the caller's thread, per call, with the worker
                   exporting to the receiver, next to a plain list append over the same lines

Memory is the resident set size sampled every 1,000 rollouts; "at a tenth" is the largest
sample by the time a tenth of the rollouts were done, so a flat stream shows the same figure at
a tenth and at the end.

    /work/main/.venv/bin/python bench/export_bench.py                   # 1,000,000 calls
    /work/main/.venv/bin/python bench/export_bench.py --calls 100000    # about a minute
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from attach_bench import RssSampler, generate  # noqa: E402

CALLS_PER_ROLLOUT = 10


class Progress:
    """Samples RSS every 1,000 rollouts and keeps the largest sample seen by a tenth of the work."""

    def __init__(self, rollouts: int) -> None:
        self.sampler = RssSampler()
        self.tenth = max(1, rollouts // 10)
        self.at_tenth: float | None = None
        self.done = 0

    def step(self, count: int = 1) -> None:
        self.done += count
        if self.done % 1000 < count:
            self.sampler.sample()
        if self.at_tenth is None and self.done >= self.tenth:
            self.sampler.sample()
            self.at_tenth = self.sampler.largest

    def figures(self) -> dict[str, Any]:
        self.sampler.sample()
        return {
            "rss_at_start_mib": self.sampler.first,
            "rss_at_tenth_mib": self.at_tenth,
            "rss_max_mib": self.sampler.largest,
            "ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }


def measure_readers(capture_dir: Path) -> dict[str, Any]:
    from llmtap.store import CaptureStore
    from llmtap.store.readers import read_rollout_calls

    store = CaptureStore(capture_dir, create=False)
    rollouts = store.rollouts()
    progress = Progress(len(rollouts))
    started = time.perf_counter()
    calls = 0
    for rollout_id in rollouts:
        calls += len(read_rollout_calls(store, rollout_id).records)
        progress.step()
    return {"calls": calls, "seconds": time.perf_counter() - started, **progress.figures()}


def measure_parquet(capture_dir: Path, out_dir: Path, rollouts_file: Path) -> dict[str, Any]:
    from llmtap.export.parquet import export_parquet

    rollouts = len(os.listdir(capture_dir))
    progress = Progress(rollouts)
    last = [0]

    def step(report: Any) -> None:
        progress.step(report.rollouts_read - last[0])
        last[0] = report.rollouts_read

    started = time.perf_counter()
    report = export_parquet(capture_dir, out_dir, rollouts_file=rollouts_file, progress=step)
    elapsed = time.perf_counter() - started
    size = sum(path.stat().st_size for path in report.files)
    return {
        "calls": report.calls_written,
        "rollout_rows": report.rollout_rows_written,
        "rollouts_read": report.rollouts_read,
        "files": len(report.files),
        "output_mib": size / 2**20,
        "seconds": elapsed,
        **progress.figures(),
    }


def measure_queries(out_dir: Path) -> dict[str, Any]:
    from llmtap.export.examples import QUESTIONS
    from llmtap.export.query import run_query

    sampler = RssSampler()
    timings = {}
    for name, sql in QUESTIONS.items():
        started = time.perf_counter()
        result = run_query(sql, out_dir)
        timings[name] = {"seconds": time.perf_counter() - started, "rows": len(result.rows)}
        sampler.sample()
    return {
        "queries": timings,
        "rss_max_mib": sampler.largest,
        "ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def measure_otlp(capture_dir: Path, endpoint: str) -> dict[str, Any]:
    from llmtap.export.otlp import export_otlp

    rollouts = len(os.listdir(capture_dir))
    progress = Progress(rollouts)
    last = [0]

    def step(report: Any) -> None:
        progress.step(report.rollouts - last[0])
        last[0] = report.rollouts

    started = time.perf_counter()
    report = export_otlp(capture_dir, endpoint=endpoint, content=False, progress=step)
    return {
        "calls": report.exported,
        "failed": report.failed + report.not_sent,
        "batches": report.batches,
        "seconds": time.perf_counter() - started,
        **progress.figures(),
    }


def measure_live(capture_dir: Path, endpoint: str, limit: int) -> dict[str, Any]:
    """Submit cost on the caller's thread: a tight loop (the queue's bound shows), then paced calls."""
    from llmtap.export.live import LiveExporter
    from llmtap.export.otlp import span_exporter
    from llmtap.store import CaptureStore

    store = CaptureStore(capture_dir, create=False)
    lines: list[dict[str, Any]] = []
    for rollout_id in store.rollouts():
        lines.extend(line for _, line in store.read(rollout_id).entries)
        if len(lines) >= limit:
            break
    lines = lines[:limit]
    figures: dict[str, Any] = {"calls": len(lines)}
    sink: list[dict[str, Any]] = []
    started = time.perf_counter()
    for line in lines:
        sink.append(line)  # noqa: PERF402 - the loop itself is the baseline
    figures["tight_append_seconds"] = time.perf_counter() - started
    live = LiveExporter(span_exporter(endpoint)).start()
    started = time.perf_counter()
    for line in lines:
        live.submit(line)
    figures["tight_submit_seconds"] = time.perf_counter() - started
    live.close(timeout=120)
    figures["tight_counts"] = live.counts()
    # Paced: one call per millisecond, about what a busy proxy sees; each submit timed alone.
    paced = lines[: min(len(lines), 5000)]
    baseline_ns = _paced(paced, sink.append)
    live = LiveExporter(span_exporter(endpoint)).start()
    submit_ns = _paced(paced, live.submit)
    live.close(timeout=120)
    figures["paced_calls"] = len(paced)
    figures["paced_append_ns"] = _percentiles(baseline_ns)
    figures["paced_submit_ns"] = _percentiles(submit_ns)
    figures["paced_counts"] = live.counts()
    return figures


def _paced(lines: list[dict[str, Any]], call: Any) -> list[int]:
    timings = []
    for line in lines:
        started = time.perf_counter_ns()
        call(line)
        timings.append(time.perf_counter_ns() - started)
        time.sleep(0.001)
    return timings


def _percentiles(values: list[int]) -> dict[str, float]:
    ordered = sorted(values)
    return {name: ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] for name, fraction in (("p50", 0.5), ("p99", 0.99))}


def write_attached_rows(workdir: Path, rollouts_path: Path, capture_dir: Path) -> Path:
    """Attach the generated rows (rewards, terminal attribution) with the real `attach_file`."""
    from llmtap.rollouts.attach import AttachOptions, attach_file

    attached = workdir / "attached.jsonl"
    attach_file(rollouts_path, attached, capture_dir, options=AttachOptions(trajectory=False))
    return attached


def start_receiver() -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, __file__, "--receiver"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    port = int(process.stdout.readline().strip())
    return process, f"http://127.0.0.1:{port}"


def run_receiver() -> None:
    """A loopback OTLP/HTTP sink: reads each request whole and accepts it (decoding is the collector's cost)."""
    received = [0]

    class Sink(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # the http.server hook name
            length = int(self.headers.get("content-length", "0"))
            while length:
                length -= len(self.rfile.read(min(length, 1 << 20)))
            received[0] += 1
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # a quiet sink
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    print(server.server_address[1], flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()  # serve until the bench closes this pipe (or exits)


def subprocess_figures(*args: str) -> dict[str, Any]:
    completed = subprocess.run([sys.executable, __file__, "--measure", *args], check=True, capture_output=True, text=True)
    figures: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return figures


def measure(args: list[str]) -> None:
    """Subprocess entry: run one measurement and print its figures as one JSON line."""
    mode = args[0]
    if mode == "readers":
        figures = measure_readers(Path(args[1]))
    elif mode == "parquet":
        figures = measure_parquet(Path(args[1]), Path(args[2]), Path(args[3]))
    elif mode == "query":
        figures = measure_queries(Path(args[1]))
    elif mode == "otlp":
        figures = measure_otlp(Path(args[1]), args[2])
    elif mode == "live":
        figures = measure_live(Path(args[1]), args[2], int(args[3]))
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(orjson.dumps(figures).decode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1_000_000, help="calls to generate (default 1,000,000)")
    parser.add_argument("--live-calls", type=int, default=100_000, help="calls submitted to the live exporter")
    parser.add_argument("--skip-otlp", action="store_true", help="leave out the OTLP measurements")
    parser.add_argument("--workdir", type=Path, help="where to generate (default: a fresh temp dir, removed after)")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    parser.add_argument("--measure", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--receiver", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.receiver:
        run_receiver()
        return
    if args.measure:
        measure(args.measure)
        return
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="llmtap-export-bench-"))
    owned = args.workdir is None
    rollouts = max(1, args.calls // CALLS_PER_ROLLOUT)
    results: dict[str, Any] = {"calls": rollouts * CALLS_PER_ROLLOUT, "load_average_at_start": os.getloadavg()}
    receiver = None
    try:
        print(f"Generating {rollouts:,} rollouts x {CALLS_PER_ROLLOUT} calls in {workdir} ...", flush=True)
        started = time.perf_counter()
        rollouts_path, capture_dir = generate(workdir, rollouts, CALLS_PER_ROLLOUT)
        attached = write_attached_rows(workdir, rollouts_path, capture_dir)
        capture_mib = sum(entry.stat().st_size for entry in os.scandir(capture_dir)) / 2**20
        print(f"  generated and attached in {time.perf_counter() - started:.1f} s: {capture_mib:,.0f} MiB of capture", flush=True)
        results["capture_mib"] = capture_mib
        out_dir = workdir / "export"
        results["readers"] = subprocess_figures("readers", str(capture_dir))
        show("readers", results["readers"])
        results["parquet"] = subprocess_figures("parquet", str(capture_dir), str(out_dir), str(attached))
        show("parquet", results["parquet"])
        results["parquet_again"] = subprocess_figures("parquet", str(capture_dir), str(out_dir), str(attached))
        show("parquet again", results["parquet_again"])
        results["query"] = subprocess_figures("query", str(out_dir))
        for name, figures in results["query"]["queries"].items():
            print(f"  query {name:32} {figures['seconds']:7.2f} s  {figures['rows']:>7,} rows", flush=True)
        print(f"  query peak RSS {results['query']['ru_maxrss_mib']:.0f} MiB", flush=True)
        if not args.skip_otlp:
            receiver, endpoint = start_receiver()
            results["otlp"] = subprocess_figures("otlp", str(capture_dir), endpoint)
            show("otlp", results["otlp"])
            results["live"] = subprocess_figures("live", str(capture_dir), endpoint, str(args.live_calls))
            live = results["live"]
            tight = live["tight_counts"]
            print(
                f"  live, tight loop: {live['tight_submit_seconds'] / live['calls'] * 1e6:.2f} us per submit "
                f"(a list append {live['tight_append_seconds'] / live['calls'] * 1e6:.2f} us); {tight['exported']:,} "
                f"exported, dropped {tight['dropped']['queue_full']:,} (queue full) of {live['calls']:,}",
                flush=True,
            )
            paced = live["paced_counts"]
            print(
                f"  live, one call per ms: submit p50 {live['paced_submit_ns']['p50'] / 1000:.1f} us, "
                f"p99 {live['paced_submit_ns']['p99'] / 1000:.1f} us (a list append p50 "
                f"{live['paced_append_ns']['p50'] / 1000:.1f} us, p99 {live['paced_append_ns']['p99'] / 1000:.1f} us); "
                f"{paced['exported']:,} of {live['paced_calls']:,} exported, dropped {sum(paced['dropped'].values()):,}",
                flush=True,
            )
        summary(results)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
    finally:
        if receiver is not None:
            assert receiver.stdin is not None
            receiver.stdin.close()
            receiver.wait(10)
        if owned:
            shutil.rmtree(workdir, ignore_errors=True)


def show(label: str, figures: dict[str, Any]) -> None:
    rate = figures["calls"] / figures["seconds"] if figures["seconds"] else 0.0
    print(
        f"  {label:14} {figures['calls']:>10,} calls {figures['seconds']:8.1f} s {rate:10,.0f} calls/s  "
        f"RSS at a tenth {figures['rss_at_tenth_mib'] or 0:6.1f}, max {figures['rss_max_mib']:6.1f} MiB "
        f"(ru_maxrss {figures['ru_maxrss_mib']:.1f})",
        flush=True,
    )


def summary(results: dict[str, Any]) -> None:
    readers = results["readers"]["seconds"]
    print()
    print(f"parquet export takes {results['parquet']['seconds'] / readers:.2f}x the readers' pass; "
          f"the re-run {results['parquet_again']['seconds'] / readers:.3f}x")
    slowest = max(figures["seconds"] for figures in results["query"]["queries"].values())
    print(f"slowest README question: {slowest:.2f} s, {slowest / readers:.3f}x the readers' pass")
    if "otlp" in results:
        print(f"otlp export takes {results['otlp']['seconds'] / readers:.2f}x the readers' pass")


if __name__ == "__main__":
    main()
