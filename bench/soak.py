"""Soak `llmtap serve` with 1,000 concurrent streams, SIGKILL it, restart it, and verify every file.

What it measures, in one run:

1. serve's resident memory idle (the baseline) and with `--streams` (default 1,000) concurrent
   streams in flight (target: under 200 MB);
2. its growth over a bounded soak of `--seconds` (default 600) at that concurrency: the median of
   the last fifth of the samples against the median of the second fifth, the first being the
   warm-up (target: no growth);
3. SIGKILL of serve and its sync helper mid-load, a restart on the same capture dir, more calls,
   and every rollout file read with the strict reader: every call whose client got its whole
   response must have its record (target: 0 lost), and no file may hold a damaged line.

The upstream is the replay upstream (recorded chat, Responses and Messages streams, each cut into
3 to 8 pieces `--piece-delay` seconds apart) in its own process; the clients are aiohttp streams
in this one. Binds 127.0.0.1 only; stops exactly the processes it started.

    .venv/bin/python bench/soak.py                  # 10-minute soak
    .venv/bin/python bench/soak.py --seconds 60     # a short one
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from tests.reliability.kill_load import LoadResult, run_streams, verify_capture, wait_until
from tests.support.serve_process import ServeProcess, rss_kib

RSS_TARGET_MB = 200.0


def serve_upstream(piece_delay: float) -> None:
    """`--upstream-server`: host the replay upstream and print its port; run until killed."""
    from tests.support.replay import ReplayUpstream

    upstream = ReplayUpstream(piece_delay=piece_delay).start()
    print(f"PORT {upstream.base_url.rsplit(':', 1)[1]}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    upstream.stop()


def start_upstream(piece_delay: float) -> tuple[subprocess.Popen[bytes], str]:
    process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--upstream-server",
                                "--piece-delay", str(piece_delay)], stdout=subprocess.PIPE, start_new_session=True)
    assert process.stdout is not None
    line = process.stdout.readline().decode()
    if not line.startswith("PORT "):
        process.kill()
        raise SystemExit(f"The replay upstream did not start (it printed {line!r}).")
    return process, f"http://127.0.0.1:{int(line.split()[1])}"


def serve_rss_mb(serve: ServeProcess) -> float:
    """serve's own resident memory (its sync helper is a separate, small process, left out)."""
    return rss_kib(serve.pid) / 1024


async def soak(serve: ServeProcess, options: argparse.Namespace, load: LoadResult) -> dict[str, float]:
    """Hold the load for the soak, sample serve's RSS, then SIGKILL serve with the streams in flight."""
    figures: dict[str, float] = {"idle_mb": serve_rss_mb(serve)}
    stop = asyncio.Event()
    task = asyncio.create_task(run_streams(serve.base_url, concurrency=options.streams, rollouts=options.rollouts,
                                           stop=stop, result=load, prefix="soak"))
    if not await wait_until(lambda: load.in_flight >= options.streams * 0.95, timeout=120):
        print(f"warning: only {load.in_flight:,} streams in flight after 120 s", flush=True)
    samples: list[tuple[float, float, int]] = []  # (seconds since full load, RSS MB, streams in flight)
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < options.seconds:
        samples.append((elapsed, serve_rss_mb(serve), load.in_flight))
        await asyncio.sleep(options.sample_every)
    samples.append((time.monotonic() - started, serve_rss_mb(serve), load.in_flight))
    in_flight_at_kill = load.in_flight
    complete_before_kill = len(load.complete)
    broken_before_kill = load.broken
    await asyncio.to_thread(serve.kill)
    stop.set()
    await asyncio.wait_for(task, timeout=300)
    fifth = max(1, len(samples) // 5)
    figures.update(
        peak_mb=max(rss for _, rss, _ in samples),
        first_mb=statistics.median(rss for _, rss, _ in samples[fifth : 2 * fifth] or samples[:fifth]),
        last_mb=statistics.median(rss for _, rss, _ in samples[-fifth:]),
        min_in_flight=min(streams for _, _, streams in samples),
        median_in_flight=statistics.median(streams for _, _, streams in samples),
        in_flight_at_kill=in_flight_at_kill,
        complete_before_kill=complete_before_kill,
        broken_before_kill=broken_before_kill,
        soak_s=samples[-1][0],
    )
    return figures


async def after_restart(serve: ServeProcess, options: argparse.Namespace, load: LoadResult) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(run_streams(serve.base_url, concurrency=min(100, options.streams),
                                           rollouts=options.rollouts, stop=stop, result=load, prefix="restart"))
    await wait_until(lambda: len(load.complete) >= options.rollouts * 2 or task.done(), timeout=120)
    stop.set()
    await asyncio.wait_for(task, timeout=300)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=600.0, help="length of the soak (default 600)")
    parser.add_argument("--streams", type=int, default=1000, help="concurrent streams (default 1,000)")
    parser.add_argument("--rollouts", type=int, default=100, help="rollouts the calls are spread over")
    parser.add_argument("--piece-delay", type=float, default=2.0, help="seconds between a stream's pieces")
    parser.add_argument("--sample-every", type=float, default=2.0, help="seconds between RSS samples")
    parser.add_argument("--upstream-server", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.upstream_server:
        serve_upstream(options.piece_delay)
        return 0

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, options.streams * 4)), hard))
    print(f"bench/soak.py  {options.streams:,} streams  soak {options.seconds:.0f} s  piece delay "
          f"{options.piece_delay} s  load average {os.getloadavg()[0]:.2f}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="llmtap-soak-"))
    capture = workdir / "capture"
    upstream, upstream_url = start_upstream(options.piece_delay)
    load, restart_load = LoadResult(), LoadResult()
    try:
        serve = ServeProcess(upstream_url, capture, log=workdir / "serve.log").start()
        try:
            time.sleep(1.0)  # let start-up settle before the idle figure
            figures = asyncio.run(soak(serve, options, load))
        finally:
            serve.stop()
        killed = verify_capture(capture, load.complete)
        with ServeProcess(upstream_url, capture, log=workdir / "serve-restarted.log").start() as restarted:
            asyncio.run(after_restart(restarted, options, restart_load))
        final = verify_capture(capture, load.complete | restart_load.complete)
    finally:
        upstream.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            upstream.wait(timeout=15)
        if upstream.poll() is None:
            upstream.kill()
            upstream.wait()

    growth = figures["last_mb"] - figures["first_mb"]
    lost = len(final.missing)
    print(f"calls: {load.started:,} started, {len(load.complete):,} complete, {figures['broken_before_kill']:,.0f} "
          f"broken before the SIGKILL and {load.broken - figures['broken_before_kill']:,.0f} by it (in flight, or on a "
          f"kept-alive connection), {load.refused:,} refused after it; {len(restart_load.complete):,} complete after "
          "the restart")
    print(f"streams in flight during the soak: median {figures['median_in_flight']:,.0f}, "
          f"min {figures['min_in_flight']:,.0f}; {figures['in_flight_at_kill']:,.0f} at the SIGKILL")
    print(f"files: {final.files:,}  records: {final.records:,}  torn tails after the kill: {len(killed.torn)}  "
          f"damaged files: {len(final.damaged_files)}")
    print(f"serve RSS: idle {figures['idle_mb']:.1f} MB (baseline), peak {figures['peak_mb']:.1f} MB with "
          f"{options.streams:,} streams, second fifth {figures['first_mb']:.1f} MB, last fifth {figures['last_mb']:.1f} MB "
          f"over {figures['soak_s']:.0f} s")
    print(f"ratio: peak RSS / idle RSS = {figures['peak_mb'] / figures['idle_mb']:.2f}")
    print(f"target: RSS with {options.streams:,} streams < {RSS_TARGET_MB:.0f} MB  found: {figures['peak_mb']:.1f} MB  "
          f"{'ok' if figures['peak_mb'] < RSS_TARGET_MB else 'MISSED'}")
    print(f"target: RSS growth over the soak ~0 MB  found: {growth:+.1f} MB ({growth / figures['first_mb'] * 100:+.1f} %)")
    print(f"target: 0 complete calls without a record  found: {lost}  {'ok' if lost == 0 else 'MISSED'}")
    print(f"target: 0 damaged files  found: {len(final.damaged_files)}")
    if lost or final.damaged_files:
        print(f"missing (first 10): {final.missing[:10]}  damaged: {final.damaged_files[:10]}  logs: {workdir}")
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
