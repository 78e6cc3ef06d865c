"""How fast `attach_file` attaches captures to a rollouts file, and that its memory stays flat.

Generates, in a temp dir, a capture store and a rollouts JSONL: by default 100,000 rollouts with
10 calls each (1,000,000 calls). Every rollout is a 10-step Chat Completions tool loop built from
two real recordings (`chat/tool-call-gpt4o` for the tool-calling steps, `chat/tool-result-followup-gpt4o`
for the final answer): step k's request replays the conversation so far, as an agent does, so
requests grow with the step and the histories chain. Each template line goes through the real
capture pipeline (`raw_line_from_exchange`); per rollout only the ids differ. Files are written
directly (not through `CaptureStore.append`, whose per-call fsync would dominate generation).

Then, each in a fresh subprocess (so peak RSS belongs to one measurement):

    baseline   parse every row, read its rollout's capture lines (`CaptureStore.read`), write the
               row back: the floor of file and JSON work any attachment must do
    attach     `attach_file` with the defaults: capture attachment, trajectory, payloads moved
               into the trajectory

both at two sizes, the first tenth of the rows and all of them. Memory is the resident set size
sampled every thousand rows (and `ru_maxrss`, whose peak may be set by the imports); if the
streaming holds, it is the same at both sizes.

    /work/main/.venv/bin/python bench/attach_bench.py                  # full size, several minutes
    /work/main/.venv/bin/python bench/attach_bench.py --rollouts 5000  # about half a minute
"""

from __future__ import annotations

import argparse
import copy
import json
import os
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
# tests.fixtures is the one place that finds the recorded exchanges ($LLMTAP_FIXTURES_DIR, else shared/).
sys.path.insert(0, str(ROOT))

from llmtap.exchange import Exchange  # noqa: E402
from llmtap.records import raw_line_from_exchange  # noqa: E402
from llmtap.rollouts.attach import attach_file  # noqa: E402
from llmtap.store import CaptureStore  # noqa: E402
from tests.fixtures import FIXTURES_DIR  # noqa: E402

CALL_ID_MARK = b"__MCID__"
ROLLOUT_MARK = b"__ROLLOUT__"
TOOL_CALL_FIXTURE = "chat/tool-call-gpt4o"
ANSWER_FIXTURE = "chat/tool-result-followup-gpt4o"


def load_fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES_DIR / f"{name}.json").read_text())
    return data


def template_lines(calls_per_rollout: int) -> list[bytes]:
    """The persisted lines of one rollout's tool loop, with placeholders for the ids."""
    tool_call, answer = load_fixture(TOOL_CALL_FIXTURE), load_fixture(ANSWER_FIXTURE)
    recorded_id = json.loads(tool_call["response"]["body_text"])["choices"][0]["message"]["tool_calls"][0]["id"]
    messages = copy.deepcopy(tool_call["request"]["json"]["messages"])
    lines: list[bytes] = []
    started = 1_700_000_000.0
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
            rollout_id=ROLLOUT_MARK.decode(),
            model_ref={"type": "responses_api_models", "name": "policy_model"},
        )
        exchange.started_at = started + step * 2.0
        exchange.status_code = 200
        exchange.response_headers = {"content-type": source["response"]["headers"]["content-type"]}
        exchange.add_response_chunk(body.encode())
        exchange.finish()
        lines.append(orjson.dumps(raw_line_from_exchange(exchange), option=orjson.OPT_APPEND_NEWLINE))
        if not last:
            messages.append(json.loads(body)["choices"][0]["message"])
            messages.append({"role": "tool", "tool_call_id": f"call_step{step}", "content": "40 C"})
    return lines


def generate(workdir: Path, rollouts: int, calls_per_rollout: int) -> tuple[Path, Path]:
    """Write the capture files and the rollouts file; return (rollouts file, capture dir)."""
    capture_dir = workdir / "model-calls"
    capture_dir.mkdir(parents=True)
    template = b"".join(template_lines(calls_per_rollout))
    rollouts_path = workdir / "rollouts.jsonl"
    with rollouts_path.open("wb") as rows:
        for task in range(rollouts):
            rollout_id = f"{task}-0"
            data = template.replace(ROLLOUT_MARK, rollout_id.encode()).replace(CALL_ID_MARK, f"{task:08x}".encode())
            (capture_dir / f"{rollout_id}.capture.jsonl").write_bytes(data)
            row = {
                "_ng_task_index": task,
                "_ng_rollout_index": 0,
                "responses_create_params": {"input": [{"role": "user", "content": "What's the weather like?"}]},
                "response": {"id": f"chatcmpl-{task}", "output_text": "It is 40 C."},
                "reward": float(task % 2),
            }
            rows.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
    return rollouts_path, capture_dir


def head(path: Path, rows: int, target: Path) -> Path:
    with path.open("rb") as reader, target.open("wb") as writer:
        for number, line in enumerate(reader):
            if number >= rows:
                break
            writer.write(line)
    return target


class RssSampler:
    """The largest resident set size seen at the samples taken (Linux `/proc/self/statm`)."""

    def __init__(self) -> None:
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.first = self.current()
        self.largest = self.first

    def current(self) -> float:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * self.page / 2**20

    def sample(self, *_: object) -> None:
        self.largest = max(self.largest, self.current())


def run_baseline(in_path: Path, out_path: Path, capture_dir: Path, sampler: RssSampler) -> tuple[int, int]:
    """Parse each row, read its capture lines, write the row back: the I/O and JSON floor."""
    rows = calls = 0
    store = CaptureStore(capture_dir, create=False)
    with in_path.open("rb") as reader, out_path.open("wb") as writer:
        for raw in reader:
            row = orjson.loads(raw)
            calls += len(store.read(f"{row['_ng_task_index']}-{row['_ng_rollout_index']}").entries)
            writer.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
            rows += 1
            if rows % 1000 == 0:
                sampler.sample()
    store.close()
    return rows, calls


def measure(mode: str, in_path: Path, out_path: Path, capture_dir: Path) -> None:
    """Subprocess entry: run one measurement and print its figures as one JSON line."""
    sampler = RssSampler()
    started = time.perf_counter()
    if mode == "attach":
        report = attach_file(in_path, out_path, capture_dir, progress=sampler.sample)
        rows, calls = report.rows, report.calls
    else:
        rows, calls = run_baseline(in_path, out_path, capture_dir, sampler)
    elapsed = time.perf_counter() - started
    sampler.sample()
    print(
        json.dumps(
            {
                "mode": mode,
                "rows": rows,
                "calls": calls,
                "seconds": elapsed,
                "rss_at_start_mib": sampler.first,
                "rss_sampled_max_mib": sampler.largest,
                "ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "output_bytes": out_path.stat().st_size,
            }
        )
    )


def run_measurement(mode: str, in_path: Path, out_path: Path, capture_dir: Path) -> dict[str, Any]:
    command = [sys.executable, __file__, "--measure", mode, str(in_path), str(out_path), str(capture_dir)]
    completed = subprocess.run(command, check=True, capture_output=True, text=True)
    figures: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    out_path.unlink()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=100_000, help="rollouts at full size (default 100,000)")
    parser.add_argument("--calls-per-rollout", type=int, default=10, help="calls per rollout (default 10)")
    parser.add_argument("--workdir", type=Path, help="where to generate (default: a fresh temp dir, removed after)")
    parser.add_argument("--measure", nargs=4, metavar=("MODE", "IN", "OUT", "CAPTURE_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        mode, in_path, out_path, capture_dir = args.measure
        measure(mode, Path(in_path), Path(out_path), Path(capture_dir))
        return

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="llmtap-attach-bench-"))
    owned = args.workdir is None
    try:
        print(f"Generating {args.rollouts:,} rollouts x {args.calls_per_rollout} calls in {workdir} ...", flush=True)
        started = time.perf_counter()
        rollouts_path, capture_dir = generate(workdir, args.rollouts, args.calls_per_rollout)
        capture_bytes = sum(entry.stat().st_size for entry in capture_dir.iterdir())
        print(
            f"  generated in {time.perf_counter() - started:.1f} s: {capture_bytes / 2**20:,.0f} MiB of capture, "
            f"{rollouts_path.stat().st_size / 2**20:,.1f} MiB of rows",
            flush=True,
        )
        small_rows = max(1, args.rollouts // 10)
        small_path = head(rollouts_path, small_rows, workdir / "rollouts.small.jsonl")
        results: list[dict[str, Any]] = []
        for label, source in (("tenth", small_path), ("full", rollouts_path)):
            for mode in ("baseline", "attach"):
                figures = run_measurement(mode, source, workdir / f"out.{mode}.jsonl", capture_dir)
                figures["size"] = label
                results.append(figures)
                print(
                    f"  {mode:8} {label:5} {figures['rows']:>9,} rows {figures['calls']:>10,} calls "
                    f"{figures['seconds']:8.1f} s {figures['rows'] / figures['seconds']:9,.0f} rollouts/s "
                    f"{figures['calls'] / figures['seconds']:10,.0f} calls/s  RSS {figures['rss_at_start_mib']:5.1f} -> "
                    f"max {figures['rss_sampled_max_mib']:5.1f} MiB (ru_maxrss {figures['ru_maxrss_mib']:.1f})",
                    flush=True,
                )
        report(results)
    finally:
        if owned:
            shutil.rmtree(workdir, ignore_errors=True)


def report(results: list[dict[str, Any]]) -> None:
    cell = {(entry["mode"], entry["size"]): entry for entry in results}
    full_attach, full_base = cell[("attach", "full")], cell[("baseline", "full")]
    small_attach = cell[("attach", "tenth")]
    attach_rate = full_attach["rows"] / full_attach["seconds"]
    base_rate = full_base["rows"] / full_base["seconds"]
    growth = full_attach["rss_sampled_max_mib"] - small_attach["rss_sampled_max_mib"]
    print()
    print(f"attach, full size:   {attach_rate:,.0f} rollouts/s ({full_attach['calls'] / full_attach['seconds']:,.0f} calls/s)")
    print(f"baseline, full size: {base_rate:,.0f} rollouts/s; attach takes {base_rate / attach_rate:.1f}x the baseline's time")
    print(
        f"largest RSS of attach: {small_attach['rss_sampled_max_mib']:.1f} MiB at {small_attach['rows']:,} rollouts, "
        f"{full_attach['rss_sampled_max_mib']:.1f} MiB at {full_attach['rows']:,} "
        f"({growth:+.1f} MiB for {full_attach['rows'] / small_attach['rows']:.0f}x the rollouts)"
    )


if __name__ == "__main__":
    main()
