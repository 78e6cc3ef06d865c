"""How fast `llmtap view` shows its first page over a big capture directory, and its memory.

Generates, in a temp dir, a capture directory of 100,000 rollouts with 10 calls each (1,000,000
calls; the Chat Completions tool loop of `attach_bench.py`, each line from the real capture
pipeline). Then, in one fresh subprocess (so its RSS belongs to the viewer alone), with the page
cache warm from generation:

    baseline     `os.listdir` of the capture directory: the floor of any page that lists it
    first page   build the app and answer `GET /` (the first 50 rollouts by id, summarised on
                 demand) through the real ASGI app, in process
    next pages   page 2, and a text search over the ids
    partial sort `GET /?sort=calls` before the background summariser has run: answers over what
                 is summarised and says how much that is
    full index   the background summariser's time to summarise every rollout (every line parsed once)
    sorted page  `GET /?sort=tokens_in&order=desc`, its page 2, and `?status=error` once everything
                 is summarised
    live refresh one listing again with nothing changed (what each poll of a live page costs)

and the resident set size after the first page and after the full index.

    /work/main/.venv/bin/python bench/view_bench.py                   # full size: ~3 GB written, a few minutes
    /work/main/.venv/bin/python bench/view_bench.py --rollouts 10000  # under a minute
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from attach_bench import CALL_ID_MARK, ROLLOUT_MARK, RssSampler, template_lines


def generate(capture_dir: Path, rollouts: int, calls_per_rollout: int) -> None:
    """Write the capture files directly (the store's per-call fsync would dominate generation)."""
    capture_dir.mkdir(parents=True)
    template = b"".join(template_lines(calls_per_rollout))
    for task in range(rollouts):
        rollout_id = f"{task}-0"
        data = template.replace(ROLLOUT_MARK, rollout_id.encode()).replace(CALL_ID_MARK, f"{task:08x}".encode())
        (capture_dir / f"{rollout_id}.capture.jsonl").write_bytes(data)


def _timed(action: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def measure(capture_dir: Path) -> None:
    """Subprocess entry: time the viewer over `capture_dir`; print the figures as one JSON line."""
    from starlette.testclient import TestClient

    sampler = RssSampler()
    figures: dict[str, Any] = {"rss_at_start_mib": sampler.first}
    figures["listdir_s"], names = _timed(lambda: os.listdir(capture_dir))
    figures["files"] = len(names)

    from llmtap.view import ViewerSettings, create_app, discover

    def first_page() -> Any:
        started = time.perf_counter()
        app = create_app(discover([str(capture_dir)]), ViewerSettings(port=8765, background=False))
        client = TestClient(app, base_url="http://127.0.0.1:8765")
        figures["app_built_s"] = time.perf_counter() - started
        response = client.get("/")
        assert response.status_code == 200 and 'data-id="0-0"' in response.text
        return client, app

    figures["load_average"] = os.getloadavg()[0]
    figures["first_page_s"], (client, app) = _timed(first_page)
    sampler.sample()
    figures["rss_after_first_page_mib"] = sampler.current()
    figures["page_2_s"], _ = _timed(lambda: client.get("/?page=2"))
    figures["search_s"], _ = _timed(lambda: client.get("/?q=9999"))
    figures["partial_sort_s"], partial = _timed(lambda: client.get("/?sort=calls&order=desc"))
    figures["partial_sort_says_how_much"] = "so far" in partial.text
    index = app.app.state.viewer.sources.get("d1").captures

    def summarise_all() -> None:
        while index.summarise_some(1000):
            pass

    figures["full_index_s"], _ = _timed(summarise_all)
    figures["summarised"] = index.summarised
    sampler.sample()
    figures["rss_after_full_index_mib"] = sampler.current()
    figures["sorted_page_s"], sorted_page = _timed(lambda: client.get("/?sort=tokens_in&order=desc"))
    assert sorted_page.status_code == 200
    figures["sorted_page_2_s"], _ = _timed(lambda: client.get("/?sort=tokens_in&order=desc&page=2"))
    figures["error_filter_s"], _ = _timed(lambda: client.get("/?status=error"))
    figures["relist_s"], _ = _timed(lambda: index.refresh())
    figures["ru_maxrss_mib"] = __import__("resource").getrusage(__import__("resource").RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=100_000, help="rollouts (default 100,000)")
    parser.add_argument("--calls-per-rollout", type=int, default=10, help="calls per rollout (default 10)")
    parser.add_argument("--workdir", type=Path, help="where to generate (default: a fresh temp dir, removed after)")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(args.measure)
        return
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="llmtap-view-bench-"))
    owned = args.workdir is None
    try:
        capture_dir = workdir / "model-calls"
        print(f"Generating {args.rollouts:,} rollouts x {args.calls_per_rollout} calls in {workdir} ...", flush=True)
        started = time.perf_counter()
        generate(capture_dir, args.rollouts, args.calls_per_rollout)
        size = sum(entry.stat().st_size for entry in os.scandir(capture_dir))
        print(f"  generated in {time.perf_counter() - started:.1f} s: {size / 2**20:,.0f} MiB", flush=True)
        command = [sys.executable, __file__, "--measure", str(capture_dir)]
        completed = subprocess.run(command, check=True, capture_output=True, text=True)
        figures = json.loads(completed.stdout.strip().splitlines()[-1])
        report(figures, args.calls_per_rollout)
    finally:
        if owned:
            shutil.rmtree(workdir, ignore_errors=True)


def report(f: dict[str, Any], calls_per_rollout: int) -> None:
    print()
    print(f"baseline: os.listdir of {f['files']:,} files                    {f['listdir_s'] * 1000:9.1f} ms")
    print(f"first page (app built, listing, 50 rows summarised)     {f['first_page_s'] * 1000:9.1f} ms  "
          f"= {f['first_page_s'] / f['listdir_s']:.1f}x the listing")  # fmt: skip
    print(f"  of which building the app                             {f['app_built_s'] * 1000:9.1f} ms  (load average {f['load_average']:.1f})")
    print(f"page 2                                                  {f['page_2_s'] * 1000:9.1f} ms")
    print(f"search over ids                                         {f['search_s'] * 1000:9.1f} ms")
    print(
        f"sort by calls before the background index (partial: {f['partial_sort_says_how_much']}) {f['partial_sort_s'] * 1000:9.1f} ms"
    )
    calls = f["summarised"] * calls_per_rollout
    print(f"full index: {f['summarised']:,} rollouts, {calls:,} calls          {f['full_index_s']:9.1f} s  "
          f"({calls / f['full_index_s']:,.0f} calls/s)")  # fmt: skip
    print(f"sorted by tokens, all summarised                        {f['sorted_page_s'] * 1000:9.1f} ms")
    print(f"  its page 2 (the order reused)                         {f['sorted_page_2_s'] * 1000:9.1f} ms")
    print(f"status=error filter, all summarised                     {f['error_filter_s'] * 1000:9.1f} ms")
    print(f"live poll: listing again, nothing changed               {f['relist_s'] * 1000:9.1f} ms")
    print(f"RSS: start {f['rss_at_start_mib']:.0f} MiB, after first page {f['rss_after_first_page_mib']:.0f} MiB, "
          f"after full index {f['rss_after_full_index_mib']:.0f} MiB (ru_maxrss {f['ru_maxrss_mib']:.0f} MiB)")  # fmt: skip


if __name__ == "__main__":
    main()
