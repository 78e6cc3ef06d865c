"""Fuzz capture at volume: hostile calls per dialect through the stream tracker and record builder.

Runs the cases of `tests/reliability/fuzz_cases.py` (mutated recordings and generated streams,
half each) from a seeded generator, `--count` per dialect, and prints per dialect: cases run,
failures found (capture raised, a line the strict reader refuses, altered bytes, a tracked record
that differs from one rebuilt from the bytes), and cases per second. As a baseline measured in
the same run, the recorded fixtures unmutated go through the same check, so the ratio says what
the hostile cases cost against real traffic. Exits 1 when anything failed, printing the first
failures with the seed that reproduces each.

    .venv/bin/python bench/fuzz.py                 # 100,000 per dialect
    .venv/bin/python bench/fuzz.py --count 5000    # a short run
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from tests.fixtures import fixtures_for
from tests.reliability.fuzz_cases import (
    DIALECT_NAMES,
    CallCase,
    FuzzFailure,
    check_case,
    generated_case,
    mutated_case,
)


def recorded_cases(dialect: str) -> list[CallCase]:
    """The dialect's recordings as they are, each in three chunkings: the baseline."""
    cases = []
    for recorded in fixtures_for(dialect):
        body = recorded.body_bytes
        for pieces in (1, 3, 9):
            size = max(1, -(-len(body) // pieces))
            chunks = [body[at : at + size] for at in range(0, len(body), size)]
            request = json.dumps(recorded.request_json).encode()
            cases.append(CallCase(dialect, request, recorded.status,
                                  recorded.content_type or "application/json", chunks))
    return cases


def run_baseline(dialect: str, minimum: int) -> tuple[int, float]:
    cases = recorded_cases(dialect)
    done, started = 0, time.perf_counter()
    while done < minimum:
        for case in cases:
            check_case(case)
            done += 1
    return done, time.perf_counter() - started


def run_fuzz(dialect: str, count: int, seed: int) -> tuple[int, float, collections.Counter[str], list[str]]:
    failures: collections.Counter[str] = collections.Counter()
    examples: list[str] = []
    started = time.perf_counter()
    for index in range(count):
        rng = random.Random(f"{seed}:{dialect}:{index}")
        make = mutated_case if index % 2 else generated_case
        case = make(rng, dialect)
        try:
            check_case(case)
        except FuzzFailure as failure:
            kind = str(failure).split(" (", 1)[0][:100]
            failures[kind] += 1
            if len(examples) < 5:
                examples.append(f"  seed {seed}:{dialect}:{index} via {make.__name__}: {failure}")
    return count, time.perf_counter() - started, failures, examples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=100_000, help="cases per dialect (default 100,000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dialects", nargs="+", default=list(DIALECT_NAMES), choices=DIALECT_NAMES)
    options = parser.parse_args()

    print(f"bench/fuzz.py  count {options.count:,} per dialect  seed {options.seed}  "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'dialect':<10} {'cases':>9} {'failures':>9} {'cases/s':>9} {'recorded/s':>11} {'ratio':>6}")
    total_failures = 0
    all_examples: list[str] = []
    for dialect in options.dialects:
        base_done, base_seconds = run_baseline(dialect, minimum=max(200, options.count // 50))
        done, seconds, failures, examples = run_fuzz(dialect, options.count, options.seed)
        rate, base_rate = done / seconds, base_done / base_seconds
        total_failures += sum(failures.values())
        all_examples += examples
        print(f"{dialect:<10} {done:>9,} {sum(failures.values()):>9,} {rate:>9,.0f} {base_rate:>11,.0f} "
              f"{rate / base_rate:>6.2f}")
        for kind, seen in failures.most_common():
            print(f"    {seen:>7,}  {kind}")
    print("ratio: hostile cases per second / recorded cases per second (the baseline, same run)")
    print(f"target: 0 failures  found: {total_failures:,}")
    for example in all_examples:
        print(example)
    return 1 if total_failures else 0


if __name__ == "__main__":
    sys.exit(main())
