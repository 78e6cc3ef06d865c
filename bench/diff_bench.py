"""How long `llmtap diff A B --assert-no-regressions` takes on two large runs, and that its memory stays flat.

Generates, in a temp dir, two capture directories (run A and run B): by default 10,000 rollouts
with 10 calls each in every run (200,000 calls). Every rollout is a 10-step Chat Completions tool
loop built from two real recordings (`chat/tool-call-gpt4o`, `chat/tool-result-followup-gpt4o`),
step k's request replaying the conversation so far; template lines go through the real capture
pipeline (`raw_line_from_exchange`) and are then copied with per-rollout ids and latencies, so
run B differs from run A the way a second run does: other call ids and latencies everywhere,
and in 1% of rollouts a changed final answer, in 0.5% a removed call, in 0.5% an inserted call.
Files are written directly (not through `CaptureStore.append`, whose fsync would dominate).

Then, each in a fresh subprocess (so peak RSS belongs to one measurement):

    baseline   read every rollout of both runs through the public reader (`read_rollout_calls`):
               the floor any comparison of two stores pays
    diff       open both runs, compare them (`compare_runs`), evaluate the gate, build the JSON

both at two sizes, a tenth of the rollouts and all of them. Memory is the resident set size
sampled every thousand rollouts; if the comparison streams, it is about the same at both sizes.

    /work/main/.venv/bin/python bench/diff_bench.py                  # full size, a few minutes
    /work/main/.venv/bin/python bench/diff_bench.py --rollouts 2000  # under a minute
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))  # tests.fixtures finds the recorded exchanges

import llmtap
from llmtap.diff.comparison import compare_runs
from llmtap.diff.gate import GateOptions, evaluate_gate
from llmtap.diff.render import to_json
from llmtap.diff.sources import open_source
from llmtap.exchange import Exchange
from llmtap.records import raw_line_from_exchange
from llmtap.store import CaptureStore
from tests.fixtures import FIXTURES_DIR

CALL_ID_MARK = b"__MCID__"
LATENCY_MARK = b"98765.4321"
TOOL_CALL_FIXTURE = "chat/tool-call-gpt4o"
ANSWER_FIXTURE = "chat/tool-result-followup-gpt4o"
ANSWER_TEXT = "The weather in Florence, Italy is currently 40°C."


def load_fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES_DIR / f"{name}.json").read_text())
    return data


def template_lines(calls_per_rollout: int) -> list[bytes]:
    """The persisted lines of one rollout's tool loop, with placeholders for the call id and latency."""
    tool_call, answer = load_fixture(TOOL_CALL_FIXTURE), load_fixture(ANSWER_FIXTURE)
    recorded_id = json.loads(tool_call["response"]["body_text"])["choices"][0]["message"]["tool_calls"][0]["id"]
    messages = copy.deepcopy(tool_call["request"]["json"]["messages"])
    lines: list[bytes] = []
    for step in range(calls_per_rollout):
        last = step == calls_per_rollout - 1
        source = answer if last else tool_call
        body = source["response"]["body_text"]
        if not last:
            body = body.replace(recorded_id, f"call_step{step}")
        request = {**tool_call["request"]["json"], "messages": copy.deepcopy(messages)}
        exchange = Exchange(
            method="POST",
            path="/v1/chat/completions",
            request_body=orjson.dumps(request),
            model_call_id=f"{CALL_ID_MARK.decode()}{step:02d}",
        )
        exchange.status_code = 200
        exchange.response_headers = {"content-type": source["response"]["headers"]["content-type"]}
        exchange.add_response_chunk(body.encode())
        exchange.finish()
        line = raw_line_from_exchange(exchange)
        line["latency_ms"] = float(LATENCY_MARK)
        lines.append(orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))
        if not last:
            messages.append(json.loads(body)["choices"][0]["message"])
            messages.append({"role": "tool", "tool_call_id": f"call_step{step}", "content": "40 C"})
    return lines


def rollout_bytes(template: list[bytes], run: str, task: int, rng: random.Random, variant: str | None) -> bytes:
    lines = list(template)
    if variant == "answer":
        lines[-1] = lines[-1].replace(ANSWER_TEXT.encode(), b"It is 40 C in Florence today.")
    elif variant == "removed":
        del lines[len(lines) // 2]
    elif variant == "inserted":
        lines.insert(len(lines) // 2, lines[0].replace(b"What's the weather", b"What is the forecast"))
    data = b"".join(lines).replace(CALL_ID_MARK, f"{run}{task:08x}".encode())
    return data.replace(LATENCY_MARK, f"{rng.uniform(200, 900):.3f}".encode())


def generate(workdir: Path, rollouts: int, calls_per_rollout: int) -> tuple[Path, Path]:
    """Write runs A and B; return their capture directories."""
    template = template_lines(calls_per_rollout)
    rng = random.Random(14)
    runs = (workdir / "run-a", workdir / "run-b")
    for directory in runs:
        directory.mkdir(parents=True)
    for task in range(rollouts):
        rollout_id = f"{task}-0"
        roll = task % 200
        variant = "answer" if roll < 2 else "removed" if roll == 2 else "inserted" if roll == 3 else None
        (runs[0] / f"{rollout_id}.capture.jsonl").write_bytes(rollout_bytes(template, "a", task, rng, None))
        (runs[1] / f"{rollout_id}.capture.jsonl").write_bytes(rollout_bytes(template, "b", task, rng, variant))
    return runs


class RssSampler:
    """The largest resident set size seen at the samples taken (Linux `/proc/self/statm`)."""

    def __init__(self) -> None:
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.first = self.current()
        self.largest = self.first

    def current(self) -> float:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * self.page / 2**20

    def sample(self) -> None:
        self.largest = max(self.largest, self.current())


def run_baseline(run_a: Path, run_b: Path, sampler: RssSampler) -> dict[str, Any]:
    calls = rollouts = 0
    for directory in (run_a, run_b):
        store = CaptureStore(directory, create=False)
        for rollout_id in store.rollouts():
            calls += len(llmtap.read_rollout_calls(store, rollout_id).records)
            rollouts += 1
            if rollouts % 1000 == 0:
                sampler.sample()
        store.close()
    return {"rollouts": rollouts // 2, "calls": calls}


def run_diff(run_a: Path, run_b: Path, sampler: RssSampler) -> dict[str, Any]:
    source_a, source_b = open_source(str(run_a)), open_source(str(run_b))
    original = source_b.load

    def load(key: str) -> Any:  # sample memory as the comparison walks the rollouts
        if int(key.split("-")[0]) % 1000 == 0:
            sampler.sample()
        return original(key)

    source_b.load = load  # type: ignore[method-assign]
    comparison = compare_runs(source_a, source_b)
    gate = evaluate_gate(comparison, GateOptions(max_token_increase=0.1, max_latency_p95_increase=0.2))
    payload = to_json(comparison, gate)
    summary = payload["summary"]
    return {
        "rollouts": comparison.totals_a.rollouts,
        "calls": comparison.totals_a.calls + comparison.totals_b.calls,
        "call_counts": summary["calls"],
        "reasons": len(gate.reasons) + sum(gate.unlisted.values()),
        "json_bytes": len(orjson.dumps(payload)),
    }


def measure(mode: str, run_a: Path, run_b: Path) -> None:
    """Subprocess entry: run one measurement and print its figures as one JSON line."""
    sampler = RssSampler()
    started = time.perf_counter()
    figures = run_diff(run_a, run_b, sampler) if mode == "diff" else run_baseline(run_a, run_b, sampler)
    elapsed = time.perf_counter() - started
    sampler.sample()
    figures.update(
        mode=mode,
        seconds=elapsed,
        rss_at_start_mib=sampler.first,
        rss_sampled_max_mib=sampler.largest,
        ru_maxrss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )
    print(json.dumps(figures))


def run_measurement(mode: str, run_a: Path, run_b: Path) -> dict[str, Any]:
    command = [sys.executable, __file__, "--measure", mode, str(run_a), str(run_b)]
    completed = subprocess.run(command, check=True, capture_output=True, text=True)
    figures: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=10_000, help="rollouts per run at full size (default 10,000)")
    parser.add_argument("--calls-per-rollout", type=int, default=10, help="calls per rollout (default 10)")
    parser.add_argument("--measure", nargs=3, metavar=("MODE", "RUN_A", "RUN_B"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        mode, run_a, run_b = args.measure
        measure(mode, Path(run_a), Path(run_b))
        return

    workdir = Path(tempfile.mkdtemp(prefix="llmtap-diff-bench-"))
    try:
        results: list[dict[str, Any]] = []
        for label, rollouts in (("tenth", max(1, args.rollouts // 10)), ("full", args.rollouts)):
            started = time.perf_counter()
            run_a, run_b = generate(workdir / label, rollouts, args.calls_per_rollout)
            size = sum(entry.stat().st_size for run in (run_a, run_b) for entry in run.iterdir())
            print(
                f"Generated 2 runs x {rollouts:,} rollouts x {args.calls_per_rollout} calls "
                f"({size / 2**20:,.0f} MiB) in {time.perf_counter() - started:.1f} s",
                flush=True,
            )
            for mode in ("baseline", "diff"):
                figures = run_measurement(mode, run_a, run_b)
                figures["size"] = label
                results.append(figures)
                extra = f"  calls {figures['call_counts']}, {figures['reasons']} gate reasons" if mode == "diff" else ""
                print(
                    f"  {mode:8} {label:5} {figures['rollouts']:>7,} rollouts {figures['calls']:>9,} calls "
                    f"{figures['seconds']:7.1f} s  RSS {figures['rss_at_start_mib']:5.1f} -> max "
                    f"{figures['rss_sampled_max_mib']:5.1f} MiB (ru_maxrss {figures['ru_maxrss_mib']:.1f}){extra}",
                    flush=True,
                )
            shutil.rmtree(workdir / label, ignore_errors=True)
        report(results)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def report(results: list[dict[str, Any]]) -> None:
    cell = {(entry["mode"], entry["size"]): entry for entry in results}
    full_diff, full_base, small_diff = cell[("diff", "full")], cell[("baseline", "full")], cell[("diff", "tenth")]
    growth = full_diff["rss_sampled_max_mib"] - small_diff["rss_sampled_max_mib"]
    print()
    print(
        f"diff, full size: {full_diff['seconds']:.1f} s for {full_diff['rollouts']:,} rollouts per run "
        f"({full_diff['calls'] / full_diff['seconds']:,.0f} calls/s); target under 30 s"
    )
    print(
        f"baseline (reading both runs): {full_base['seconds']:.1f} s; "
        f"diff takes {full_diff['seconds'] / full_base['seconds']:.2f}x the baseline's time"
    )
    print(
        f"largest RSS of diff: {small_diff['rss_sampled_max_mib']:.1f} MiB at {small_diff['rollouts']:,} rollouts, "
        f"{full_diff['rss_sampled_max_mib']:.1f} MiB at {full_diff['rollouts']:,} ({growth:+.1f} MiB for "
        f"{full_diff['rollouts'] / small_diff['rollouts']:.0f}x the rollouts)"
    )


if __name__ == "__main__":
    main()
