"""Capsule finalisation cost per call, with redaction and its proof, against finalisation without them.

A capsule is built on disk as `llmtap run` leaves it when its workload exits: `calls/` holding
N real capture lines (every recorded exchange in turn, streams included, fresh call ids), a
stdout of N log lines, a `running` manifest. Each measurement finalises a fresh copy of it.

    full        finalise_capsule as it runs: tamper sweep, projection into model-calls.jsonl,
                health, env.lock, redaction of every file, redaction-proof.json, manifest last
    baseline    the same with the redaction step replaced by writing the manifest as it is
                (finalisation before redaction ran in it), measured in the same run

Printed: milliseconds per call for both, their ratio, and what redaction adds per call.

    /work/main/.venv/bin/python bench/finalise_bench.py                 # 16, 128 and 1024 calls
    /work/main/.venv/bin/python bench/finalise_bench.py --calls 128 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from llmtap.capsule import finalise
from llmtap.capsule.finalise import CaptureOutcome, finalise_capsule
from llmtap.capsule.manifest import manifest_bytes, start_manifest
from llmtap.capsule.writer import CapsulePaths, create_capsule
from tests.fixtures import all_fixtures
from tests.trust.streams import capture_line


def build_template(directory: Path, calls: int) -> tuple[CapsulePaths, dict[str, Any]]:
    """A capsule whose workload has just exited, holding `calls` capture lines."""
    templates = [capture_line(recorded) for recorded in all_fixtures() if recorded.status == 200]
    paths = create_capsule(directory, run_id="01JTEMPLATE0000000000000000")
    manifest = start_manifest(
        paths,
        capture_mode="run",
        command=["python", "agent.py"],
        cwd=str(directory),
        started_at=time.time(),
        registry_source=None,
    )
    lines = []
    for number in range(calls):
        record = dict(templates[number % len(templates)])
        record["model_call_id"] = f"{number:032x}"
        lines.append(orjson.dumps(record) + b"\n")
    (paths.calls / "default.capture.jsonl").write_bytes(b"".join(lines))
    log = "".join(f"2026-12-01T20:00:00Z INFO step {n}: call {n:032x} answered\n" for n in range(calls))
    paths.stdout.write_text(log)
    paths.stderr.write_text("")
    return paths, manifest


def finalise_copy(template: CapsulePaths, manifest: dict[str, Any], scratch: Path, number: int) -> float:
    """Finalise a fresh copy of the template capsule; return the seconds it took."""
    copy = CapsulePaths(scratch / f"01JCOPY{number:020d}")
    shutil.copytree(template.root, copy.root)
    started = time.perf_counter()
    final = finalise_capsule(copy, json.loads(json.dumps(manifest)), CaptureOutcome("success", exit_code=0))
    elapsed = time.perf_counter() - started
    assert final["status"] == "success"
    shutil.rmtree(copy.root)
    return elapsed


def without_redaction(paths: CapsulePaths, manifest: dict[str, Any], tampered: list[Any], health: Any) -> bytes:
    """The baseline's redaction step: the manifest as it is, no scan, no proof."""
    if tampered:
        manifest["capture_tampered"] = tampered
    manifest["files"].pop("redaction_proof", None)
    return manifest_bytes(manifest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, nargs="+", default=[16, 128, 1024], help="calls per capsule")
    parser.add_argument("--repeat", type=int, default=5, help="finalisations per variant (median kept)")
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}; median of {args.repeat}, variants interleaved")
    print(
        f"{'calls':>6} {'MB':>6} {'baseline ms/call':>17} {'full ms/call':>13} {'ratio':>6} {'redaction ms/call':>18}"
    )
    full_redact = finalise._redact
    for calls in args.calls:
        with tempfile.TemporaryDirectory() as scratch_name:
            scratch = Path(scratch_name)
            template, manifest = build_template(scratch / "template", calls)
            size = (template.calls / "default.capture.jsonl").stat().st_size / 1e6
            timings: dict[str, list[float]] = {"baseline": [], "full": []}
            for number in range(args.repeat):
                for variant in ("baseline", "full"):
                    finalise._redact = without_redaction if variant == "baseline" else full_redact  # type: ignore[assignment]
                    timings[variant].append(
                        finalise_copy(template, manifest, scratch, number * 2 + (variant == "full"))
                    )
            finalise._redact = full_redact
            base = statistics.median(timings["baseline"]) * 1000 / calls
            full = statistics.median(timings["full"]) * 1000 / calls
            print(f"{calls:>6} {size:>6.1f} {base:>17.3f} {full:>13.3f} {full / base:>6.2f} {full - base:>18.3f}")


if __name__ == "__main__":
    main()
