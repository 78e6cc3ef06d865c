"""How fast `llmtap view A B` shows the comparison of two large runs, against `llmtap diff`'s own computation.

Generates the two runs of `diff_bench.py` (by default 10,000 rollouts x 10 calls in each: other
call ids and latencies everywhere, 1% of rollouts with a changed answer, 0.5% with a removed call,
0.5% with an inserted one). Then, in this process:

    baseline       `compare_runs` over both runs and the gate: what `llmtap diff` computes
    first page     build the app, open the comparison and answer `GET /compare/d1/d2` while the run
                   summary is still being computed in the background (it lists the rollouts at once)
    rollout page   one differing rollout's side-by-side page, aligned on demand, summary still running
    summary ready  the background summary's time (the same `compare_runs`, run once)
    cached pages   the summary page with totals, gate and differing rollouts, its page 2, and the
                   rollout page again, once the summary is cached

and prints the first page's time as a fraction of the baseline.

    /work/main/.venv/bin/python bench/view_compare_bench.py                  # 10,000 rollouts a side
    /work/main/.venv/bin/python bench/view_compare_bench.py --rollouts 2000  # quicker
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from diff_bench import generate


def _timed(action: object) -> tuple[float, object]:
    started = time.perf_counter()
    result = action()  # type: ignore[operator]
    return time.perf_counter() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=10_000, help="rollouts per run (default 10,000)")
    parser.add_argument("--calls-per-rollout", type=int, default=10, help="calls per rollout (default 10)")
    args = parser.parse_args()

    from starlette.testclient import TestClient

    from llmtap.diff.comparison import compare_runs
    from llmtap.diff.gate import GateOptions, evaluate_gate
    from llmtap.diff.sources import open_source
    from llmtap.view import ViewerSettings, create_app
    from llmtap.view.sources import discover_pair

    workdir = Path(tempfile.mkdtemp(prefix="llmtap-view-compare-bench-"))
    try:
        started = time.perf_counter()
        run_a, run_b = generate(workdir, args.rollouts, args.calls_per_rollout)
        print(f"Generated 2 runs x {args.rollouts:,} rollouts x {args.calls_per_rollout} calls "
              f"in {time.perf_counter() - started:.1f} s", flush=True)  # fmt: skip

        def baseline() -> object:
            with open_source(str(run_a)) as a, open_source(str(run_b)) as b:
                comparison = compare_runs(a, b)
            return evaluate_gate(comparison, GateOptions())

        diff_seconds, _ = _timed(baseline)
        print(f"  baseline      compare_runs + gate         {diff_seconds:8.2f} s", flush=True)

        opened = time.perf_counter()
        sources, sid_a, sid_b = discover_pair(str(run_a), str(run_b))
        app = create_app(sources, ViewerSettings(port=8765, background=False))
        with TestClient(app, base_url="http://127.0.0.1:8765") as client:
            response = client.get(f"/compare/{sid_a}/{sid_b}")
            first = time.perf_counter() - opened
            assert response.status_code == 200
            state = "while the summary runs" if "Computing the run summary" in response.text else "summary already done"
            print(f"  first page    {state:26}  {first:8.2f} s  ({first / diff_seconds:.3f} of the baseline)")
            changed = next(task for task in range(args.rollouts) if task % 200 == 3)  # an inserted call
            seconds, response = _timed(lambda: client.get(f"/compare/{sid_a}/{sid_b}/r/{changed}-0"))
            assert response.status_code == 200 and 'data-status="added"' in response.text  # type: ignore[attr-defined]
            print(f"  rollout page  aligned on demand           {seconds:8.2f} s")
            while True:
                page = client.get(f"/compare/{sid_a}/{sid_b}").text
                if 'id="totals"' in page:
                    break
                time.sleep(0.05)
            ready = time.perf_counter() - opened
            print(f"  summary ready in the background           {ready:8.2f} s after opening")
            for label, path in (
                ("summary page", f"/compare/{sid_a}/{sid_b}"),
                ("summary p. 2", f"/compare/{sid_a}/{sid_b}?status=all&page=2"),
                ("rollout page", f"/compare/{sid_a}/{sid_b}/r/{changed}-0"),
            ):
                seconds, response = _timed(lambda path=path: client.get(path))
                assert response.status_code == 200  # type: ignore[attr-defined]
                print(f"  {label}  cached                      {seconds:8.3f} s")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
