"""Secret scanner throughput on capture files, against each rule's regex run on its own.

The corpus is real capture lines: every recorded exchange (chat, Responses, Messages, streams
included) turned into the line llmtap writes, repeated with fresh call ids up to `--mb`
megabytes, with one request in every few hundred carrying a planted credential from the test
corpus (each format of the pack at least once). The baseline, measured in the same run over the
same text, is the naive scanner: every rule's regex applied on its own, one pass per rule.

Measured:

    scanner        scan_text over the files' text (in ~1 MB pieces cut at line ends)
    baseline       each rule's pattern.finditer over the same pieces, one pass per rule
    redact lines   redact_record_line on every line (JSON-aware, streams reassembled where needed)
    redact dir     redact_capture_dir on the directory (reads, rewrites, fsyncs, proof)

and the recall (planted secrets gone after redaction) and false positives (lines changed that
carried no planted secret).

    /work/main/.venv/bin/python bench/scanner_bench.py              # 50 MB, several minutes (the baseline)
    /work/main/.venv/bin/python bench/scanner_bench.py --mb 5
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from llmtap.trust import redact_capture_dir, redact_record_line, scan_text
from llmtap.trust.rules import RULES
from tests.fixtures import all_fixtures
from tests.trust.corpus import SECRETS
from tests.trust.streams import capture_line

PLANT_EVERY = 300  # one line in this many carries a planted credential


def build_lines(megabytes: float) -> tuple[list[bytes], dict[int, str]]:
    """Capture lines totalling about `megabytes`, and {line number: planted secret}."""
    templates = [capture_line(recorded) for recorded in all_fixtures()]
    target = int(megabytes * 1_000_000)
    lines: list[bytes] = []
    planted: dict[int, str] = {}
    size = 0
    number = 0
    while size < target:
        record = dict(templates[number % len(templates)])
        record["model_call_id"] = f"{number:032x}"
        if number % PLANT_EVERY == 0:
            sample = SECRETS[(number // PLANT_EVERY) % len(SECRETS)]
            request = dict(record["request"] or {})
            request["metadata"] = {"note": f"config follows: {sample.in_context()} (end)"}
            record["request"] = request
            planted[len(lines)] = sample.secret
        line = orjson.dumps(record)
        lines.append(line)
        size += len(line) + 1
        number += 1
    return lines, planted


def pieces(lines: list[bytes], size: int = 1_000_000) -> list[str]:
    """The files' text in pieces of about `size` bytes, cut at line ends."""
    out: list[str] = []
    current: list[bytes] = []
    length = 0
    for line in lines:
        current.append(line)
        length += len(line) + 1
        if length >= size:
            out.append(b"\n".join(current).decode())
            current, length = [], 0
    if current:
        out.append(b"\n".join(current).decode())
    return out


def timed(function: object) -> float:
    start = time.perf_counter()
    function()  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=50.0, help="corpus size in megabytes (default 50)")
    options = parser.parse_args()
    print(f"python {platform.python_version()}, load average {os.getloadavg()[0]:.2f}, rules {len(RULES)}")
    lines, planted = build_lines(options.mb)
    texts = pieces(lines)
    total = sum(len(line) + 1 for line in lines)
    megabytes = total / 1e6
    print(f"corpus: {len(lines)} lines, {megabytes:.1f} MB, {len(planted)} planted secrets")

    findings: list[int] = []
    scanner = timed(lambda: findings.extend(len(scan_text(text)) for text in texts))
    baseline_matches = 0

    def baseline() -> None:
        nonlocal baseline_matches
        for rule in RULES:
            for text in texts:
                baseline_matches += sum(1 for _ in rule.pattern.finditer(text))

    naive = timed(baseline)

    redacted: list[bytes] = []
    redact_lines = timed(lambda: redacted.extend(redact_record_line(line) for line in lines))
    changed = {index for index, (old, new) in enumerate(zip(lines, redacted)) if old is not new}
    leaked = sum(1 for index, secret in planted.items() if secret.encode() in redacted[index])
    false_positives = len(changed - set(planted))

    directory = Path(tempfile.mkdtemp(prefix="llmtap-scanner-bench-"))
    try:
        per_file = max(1, len(lines) // 10)
        for start in range(0, len(lines), per_file):
            (directory / f"r-{start}.capture.jsonl").write_bytes(b"\n".join(lines[start : start + per_file]) + b"\n")
        redact_dir = timed(lambda: redact_capture_dir(directory))
        again = timed(lambda: redact_capture_dir(directory))
    finally:
        shutil.rmtree(directory)

    print()
    print("| measure | seconds | MB/s | vs baseline |")
    print("|---|---|---|---|")
    print(f"| baseline: each rule's regex, one pass per rule | {naive:.2f} | {megabytes / naive:.2f} | 1.0x |")
    print(
        f"| scanner: scan_text (keyword windows) | {scanner:.2f} | {megabytes / scanner:.1f} | {naive / scanner:.0f}x |"
    )
    print(
        f"| redact_record_line, every line | {redact_lines:.2f} | {megabytes / redact_lines:.1f} | {naive / redact_lines:.0f}x |"
    )
    print(
        f"| redact_capture_dir (10 files, first run) | {redact_dir:.2f} | {megabytes / redact_dir:.1f} | {naive / redact_dir:.0f}x |"
    )
    print(
        f"| redact_capture_dir (second run, nothing left) | {again:.2f} | {megabytes / again:.1f} | {naive / again:.0f}x |"
    )
    print()
    print(
        f"scanner findings {sum(findings)}, baseline raw matches {baseline_matches} (before benign checks and overlap)"
    )
    print(
        f"recall: {len(planted) - leaked}/{len(planted)} planted secrets redacted; lines changed without one: {false_positives}"
    )


if __name__ == "__main__":
    main()
