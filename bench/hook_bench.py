"""Benchmark of in-process capture: start-up cost of `llmtap run` and added time per captured call.

Both figures are measured against the same thing run without capture, in the same run of this
script, with the two arms interleaved so machine noise hits both alike:

1. Start-up: wall time of `python -c pass` plainly, with only the injected start-up hook
   (what every Python process of a workload pays), and under the whole `llmtap run` (recorder
   process, capsule, finalisation), both through the library call (`run_captured`) and through
   the installed console script (`.venv/bin/llmtap run`, what users type); the same for
   `python -c "import httpx2"`, where the hook loads llmtap's capture machinery. Medians and
   differences in milliseconds.
2. Per call: an httpx client posting a small chat completion to a keep-alive loopback server
   (in its own process),
   without llmtap's hooks, with them but nothing captured, and inside `llmtap.capture()`; the
   median time per call of each, the added microseconds and the ratio. `call` durability (fsync
   before the call returns) is shown too. Then the same without any network (httpx's
   MockTransport), which isolates the work the hook does on the caller's thread.
3. Per call under `llmtap run`: one program (httpx posting to the loopback server in its own
   process, timing each call) run plainly, under `llmtap run` with nothing matching the registry,
   and under `llmtap run` capturing every call; a fresh process per arm and round, interleaved
   (`--only-run` measures just this).

Usage: python bench/hook_bench.py [--rounds 15] [--calls 250] [--call-rounds 20] [--only-startup]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# ThreadingHTTPServer is used by the upstream subprocess, which imports this module by name.
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: F401
from pathlib import Path
from typing import Any, Callable, Iterator

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from llmtap.capsule.runner import site_directory  # noqa: E402

ANSWER = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "bench",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
).encode()
ASK = {"model": "bench", "messages": [{"role": "user", "content": "Say ok."}], "max_tokens": 4}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client reuses one connection
    disable_nagle_algorithm = True  # headers and body go out at once (no 40 ms delayed-ACK stall)

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

    def log_message(self, *args: Any) -> None:
        pass


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000.0


def _time_command(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def bench_startup(rounds: int, runs_dir: Path) -> list[dict[str, Any]]:
    """Interleaved wall times of plain, hook-only and full `llmtap run` starts (library call and console script)."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # measure an ordinary install, bytecode cached
    plain_env = dict(os.environ)
    capsule = runs_dir / "hook-only"
    (capsule / "internal" / "health").mkdir(parents=True, exist_ok=True)
    (capsule / "calls").mkdir(exist_ok=True)
    hook_env = dict(
        os.environ,
        PYTHONPATH=str(site_directory()),
        LLMTAP_RUN_CAPSULE=str(capsule),
        LLMTAP_RUN_RECORDER_PID=str(os.getpid()),  # the program is our child: it captures as a run's main process
    )
    registry = json.loads(json.dumps({"source": "bench", "registry": _registry_data()}))
    (capsule / "url_registry.json").write_text(json.dumps(registry))
    script = _console_script()
    results = []
    for program in ("pass", "import httpx2"):
        python = [sys.executable, "-c", program]
        arms: dict[str, tuple[list[str], dict[str, str]]] = {
            "plain python": (python, plain_env),
            "start-up hook only": (python, hook_env),
            "llmtap run (runner)": ([sys.executable, "-c", _RUNNER, str(runs_dir), *python], plain_env),
        }
        if script is not None:
            arms["llmtap run (script)"] = ([str(script), "run", "-q", "--capsule-dir", str(runs_dir), "--", *python], plain_env)
        samples: dict[str, list[float]] = {name: [] for name in arms}
        for _ in range(3):  # warm the file and bytecode caches, and the registry hand-off
            for command, env in arms.values():
                _time_command(command, env)
        for _ in range(rounds):
            for name, (command, env) in arms.items():
                (capsule / "internal" / "interpreter").unlink(missing_ok=True)
                samples[name].append(_time_command(command, env))
        base = _median_ms(samples["plain python"])
        for name, values in samples.items():
            results.append({"program": program, "arm": name, "median_ms": _median_ms(values), "added_ms": _median_ms(values) - base})
    return results


def _console_script() -> Path | None:
    """The `llmtap` console script installed next to this interpreter, if there is one."""
    script = Path(sys.executable).with_name("llmtap")
    return script if script.is_file() else None


# The capture machinery without the CLI: what `llmtap run` does once its arguments are read.
_RUNNER = (
    "import sys; from llmtap.capsule.runner import run_captured; "
    "sys.exit(run_captured(sys.argv[2:], runs_dir=sys.argv[1]).exit_code)"
)


def _registry_data() -> Any:
    from llmtap.hooks.registry import load_registry, vendored_registry_path

    return load_registry(vendored_registry_path()).data


def _per_call_samples(post: Callable[[], Any], calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        post()
        samples.append(time.perf_counter() - started)
    return samples


def bench_per_call(calls: int, rounds: int) -> list[dict[str, Any]]:
    """Median time per call in three arms, each run as a block of `calls`, interleaved round by round.

    - no hooks: llmtap's patches not installed at all;
    - hooks, nothing captured: patched, but no capture active (what a call outside any capture pays);
    - captured: inside `llmtap.capture()` (background durability, the default), its writer
      working alongside; the writer's backlog is drained between blocks, outside the timing.
    A separate, shorter series shows `call` durability (an fsync before the call returns).
    """
    import httpx

    import llmtap.capture as capture_api
    from llmtap.hooks.install import acquire_hooks, release_hooks
    from llmtap.hooks.session import active_process_session, reset_session, set_process_session, use_session

    server = _upstream_process()
    url = f"http://127.0.0.1:{server.port}/v1/chat/completions"
    body = json.dumps(ASK).encode()
    results = []
    with httpx.Client() as client, tempfile.TemporaryDirectory() as scratch:
        post = lambda: client.post(url, content=body, headers={"content-type": "application/json"})  # noqa: E731
        _per_call_samples(post, 300)  # warm up the connection and every code path once
        samples: dict[str, list[float]] = {"no hooks": [], "hooks, nothing captured": [], "captured (background)": []}
        with capture_api.capture(capture_dir=Path(scratch) / "bench") as run:
            session = run.session
            assert session is not None
            _per_call_samples(post, 300)
            session.flush()
            for _ in range(rounds):
                outside = use_session(None)
                process_capture = active_process_session()
                set_process_session(None)
                try:
                    samples["hooks, nothing captured"] += _per_call_samples(post, calls)
                    release_hooks()
                    samples["no hooks"] += _per_call_samples(post, calls)
                    acquire_hooks()
                finally:
                    reset_session(outside)
                    set_process_session(process_capture)
                samples["captured (background)"] += _per_call_samples(post, calls)
                session.flush()
        with capture_api.capture(capture_dir=Path(scratch) / "durable", durability="call"):
            samples["captured (call durability)"] = _per_call_samples(post, max(calls // 20, 50))
        base = statistics.median(samples["no hooks"])
        for name, values in samples.items():
            median = statistics.median(values)
            results.append(
                {"arm": name, "calls": len(values), "median_us": median * 1e6, "added_us": (median - base) * 1e6, "ratio": median / base}
            )
    server.stop()
    return results


class _UpstreamProcess:
    """The fast upstream in its own process, so it never competes with the client for the GIL."""

    def __init__(self) -> None:
        code = (
            "import sys; sys.path.insert(0, sys.argv[1]); import hook_bench as b; "
            "s = b.ThreadingHTTPServer(('127.0.0.1', 0), b._Handler); print(s.server_port, flush=True); s.serve_forever()"
        )
        self._process = subprocess.Popen(
            [sys.executable, "-c", code, str(Path(__file__).resolve().parent)], stdout=subprocess.PIPE, text=True
        )
        assert self._process.stdout is not None
        self.port = int(self._process.stdout.readline())

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait()


def _upstream_process() -> _UpstreamProcess:
    return _UpstreamProcess()


@contextlib.contextmanager
def _stopping(server: _UpstreamProcess) -> Iterator[None]:
    """Stop the upstream process however the measurement ends."""
    try:
        yield
    finally:
        server.stop()


# The measured program: httpx posts to the loopback upstream, times each call, writes the times.
_RUN_WORKLOAD = """
import json, sys, time
import httpx
url, out, warm, calls = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "Say ok."}], "max_tokens": 4}).encode()
headers = {"content-type": "application/json", "authorization": "Bearer sk-bench-not-a-key"}
samples = []
with httpx.Client() as client:
    for index in range(warm + calls):
        if index == warm:
            cpu_started = time.process_time()
        started = time.perf_counter()
        client.post(url, content=body, headers=headers)
        samples.append(time.perf_counter() - started)
    cpu = time.process_time() - cpu_started
with open(out, "w") as handle:
    json.dump({"samples": samples[warm:], "cpu_per_call": cpu / calls}, handle)
"""

# `llmtap run` with the parent's live spool collector started as soon as the capsule exists, which
# is what the runner does once it starts the collector itself (the bench then drops this arm).
_RUNNER_LIVE = (
    "import sys; from pathlib import Path; import llmtap.capsule.runner as r; from llmtap.spool.collector import SpoolCollector\n"
    "open_capsule = r._open_capsule\n"
    "def open_and_collect(*a, **k):\n"
    "    paths, manifest = open_capsule(*a, **k); SpoolCollector(paths).start(); return paths, manifest\n"
    "r._open_capsule = open_and_collect\n"
    "sys.exit(r.run_captured(sys.argv[2:], runs_dir=Path(sys.argv[1])).exit_code)"
)


def _bench_starts_the_collector() -> bool:
    """True until the runner starts the spool collector itself (and while `_RUNNER_LIVE` can hook it)."""
    from llmtap.capsule import runner

    return "SpoolCollector" not in Path(runner.__file__).read_text(encoding="utf-8") and hasattr(runner, "_open_capsule")


# `llmtap run` with a registry that matches no call: the hooks are in, nothing is captured.
_RUNNER_NO_MATCH = (
    "import sys; from pathlib import Path; from llmtap.capsule.runner import run_captured; "
    "sys.exit(run_captured(sys.argv[3:], runs_dir=Path(sys.argv[1]), registry_path=sys.argv[2]).exit_code)"
)
_NO_MATCH_REGISTRY = (
    "schema_version: 1\nproviders:\n  - provider: nobody\n    hosts: [no-such-host.invalid]\n"
    "    endpoints:\n      - {path: \"**/chat/completions\", operation: chat}\n"
)


def bench_run_per_call(calls: int, rounds: int, warm: int = 200) -> list[dict[str, Any]]:
    """Time per call of one program run plainly and under `llmtap run`, interleaved round by round.

    The program (`_RUN_WORKLOAD`) is a fresh process in each arm of each round: `warm` untimed
    calls, then `calls` timed ones, against the loopback upstream in its own process. Arms: plain
    python; `llmtap run` with a registry that matches nothing (the machinery without capture);
    `llmtap run` capturing every call (the parent turns spool frames into records: live when the
    runner starts its spool collector, else at finalisation); and, until the runner starts the
    collector itself, `llmtap run` with the bench starting it live (`_RUNNER_LIVE`).

    Reported per arm: the median of all its calls, the difference to plain python's median, and
    the median over rounds of that difference taken round by round (paired, so slow drifts of a
    shared machine cancel out); and the program's own CPU time (user + system) per timed call,
    median over rounds, with its difference to plain python's. On this VM the time of one
    loopback call is bimodal (a waiting vCPU is sometimes descheduled by the host: p10 near 0.5
    ms, p90 near 1.1 ms), so a program's median moves by a few hundred microseconds from one run
    to the next; the CPU time a call costs the program is what capture adds to the call itself
    (no thread, lock or I/O wait in the workload), and it hardly moves. The arms' order
    alternates from round to round.
    """
    from importlib.util import find_spec

    server = _upstream_process()
    url = f"http://127.0.0.1:{server.port}/v1/chat/completions"
    results = []
    with _stopping(server), tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "workload.py"
        script.write_text(_RUN_WORKLOAD)
        registry = Path(scratch) / "no-match.yaml"
        registry.write_text(_NO_MATCH_REGISTRY)
        runs_dir = Path(scratch) / "runs"
        arms: dict[str, list[str]] = {
            "plain python": [],
            "llmtap run, nothing captured": [sys.executable, "-c", _RUNNER_NO_MATCH, str(runs_dir), str(registry)],
            "llmtap run": [sys.executable, "-c", _RUNNER, str(runs_dir)],
        }
        if find_spec("llmtap.spool.collector") is not None and _bench_starts_the_collector():
            arms["llmtap run, live collector"] = [sys.executable, "-c", _RUNNER_LIVE, str(runs_dir)]
        samples: dict[str, list[float]] = {name: [] for name in arms}
        round_medians: dict[str, list[float]] = {name: [] for name in arms}
        cpu_per_call: dict[str, list[float]] = {name: [] for name in arms}
        out = Path(scratch) / "samples.json"
        names = list(arms)
        for round_index in range(rounds + 1):
            for name in names if round_index % 2 else names[::-1]:
                command = [*arms[name], sys.executable, str(script), url, str(out), str(warm), str(calls)]
                subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
                if round_index:  # the first round only warms the caches
                    measured = json.loads(out.read_text())
                    samples[name] += measured["samples"]
                    round_medians[name].append(statistics.median(measured["samples"]))
                    cpu_per_call[name].append(measured["cpu_per_call"])
        base = statistics.median(samples["plain python"])
        base_cpu = statistics.median(cpu_per_call["plain python"])
        for name, values in samples.items():
            median = statistics.median(values)
            paired = [arm - plain for arm, plain in zip(round_medians[name], round_medians["plain python"])]
            cpu = statistics.median(cpu_per_call[name])
            results.append(
                {
                    "arm": name,
                    "calls": len(values),
                    "median_us": median * 1e6,
                    "added_us": (median - base) * 1e6,
                    "paired_added_us": statistics.median(paired) * 1e6,
                    "ratio": median / base,
                    "cpu_us": cpu * 1e6,
                    "added_cpu_us": (cpu - base_cpu) * 1e6,
                }
            )
    return results


def bench_hot_path(calls: int, rounds: int, block: int = 200) -> list[dict[str, Any]]:
    """The hook's own cost per call, without a network: httpx over a MockTransport answering at once.

    Arms, interleaved block by block: no hooks; captured with the record writer held back (the
    calls' records are queued and written after the block, so this is only the work done on the
    caller's thread); captured with the writer running alongside (on a busy machine its CPU time
    competes with the caller's).
    """
    import httpx

    import llmtap.capture as capture_api
    from llmtap.hooks.install import acquire_hooks, release_hooks
    from llmtap.hooks.session import active_process_session, reset_session, set_process_session, use_session

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "application/json"}, content=ANSWER)

    body = json.dumps(ASK).encode()
    results = []
    with httpx.Client(transport=httpx.MockTransport(answer)) as client, tempfile.TemporaryDirectory() as scratch:
        url = "http://127.0.0.1:9/v1/chat/completions"
        post = lambda: client.post(url, content=body, headers={"content-type": "application/json"})  # noqa: E731
        samples: dict[str, list[float]] = {"no hooks": [], "captured, writer held back": [], "captured, writer running": []}
        with capture_api.capture(capture_dir=Path(scratch) / "hot") as run:
            session = run.session
            assert session is not None
            _per_call_samples(post, 500)
            writer = session._writer
            for _ in range(rounds * max(calls // block, 1)):
                outside = use_session(None)
                process_capture = active_process_session()
                set_process_session(None)
                release_hooks()
                try:
                    samples["no hooks"] += _per_call_samples(post, block)
                finally:
                    acquire_hooks()
                    reset_session(outside)
                    set_process_session(process_capture)
                held: list[Any] = []
                writer.put = held.append  # type: ignore[method-assign, assignment]  # bench only: queue without writing
                try:
                    samples["captured, writer held back"] += _per_call_samples(post, block)
                finally:
                    del writer.put
                for call in held:
                    writer.put(call)
                session.flush()
                samples["captured, writer running"] += _per_call_samples(post, block)
                session.flush()
        base = statistics.median(samples["no hooks"])
        for name, values in samples.items():
            median = statistics.median(values)
            results.append(
                {"arm": name, "calls": len(values), "median_us": median * 1e6, "added_us": (median - base) * 1e6, "ratio": median / base}
            )
    return results


def _print_run_per_call(calls: int, rounds: int) -> None:
    load_before = os.getloadavg()[0]
    rows = bench_run_per_call(calls, rounds)
    print(
        "per call of one program, plainly and under `llmtap run` (httpx POST, loopback keep-alive server; "
        f"{rounds} interleaved rounds of {calls} calls; load average {load_before:.1f} -> {os.getloadavg()[0]:.1f})"
    )
    print(f"  {'arm':30} {'calls':>6} {'median us':>10} {'added us':>9} {'paired us':>10} {'ratio':>6}"
          f" {'CPU us':>7} {'added CPU us':>12}")
    for row in rows:
        print(
            f"  {row['arm']:30} {row['calls']:6d} {row['median_us']:10.1f} {row['added_us']:9.1f}"
            f" {row['paired_added_us']:10.1f} {row['ratio']:6.2f} {row['cpu_us']:7.1f} {row['added_cpu_us']:12.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="start-up runs per arm (default 15)")
    parser.add_argument("--calls", type=int, default=250, help="calls per arm per round (default 250)")
    parser.add_argument("--call-rounds", type=int, default=20, help="interleaved rounds of calls (default 20)")
    parser.add_argument("--run-calls", type=int, default=300, help="timed calls per program run (default 300)")
    parser.add_argument("--run-rounds", type=int, default=20, help="interleaved rounds of program runs (default 20)")
    parser.add_argument("--only-run", action="store_true", help="measure only the per-call cost under `llmtap run`")
    parser.add_argument("--only-startup", action="store_true", help="measure only the start-up cost of `llmtap run`")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ["PYTHONPATH"]]))
    print(f"python {sys.version.split()[0]} on {os.cpu_count()} CPU(s); medians of interleaved runs\n")
    if args.only_run:
        _print_run_per_call(args.run_calls, args.run_rounds)
        return
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as scratch:
        startup = bench_startup(args.rounds, Path(scratch))
    print(f"start-up (wall time per process; {args.rounds} interleaved runs per arm; load average {load_before:.1f} -> {os.getloadavg()[0]:.1f})")
    print(f"  {'program':16} {'arm':24} {'median ms':>10} {'added ms':>9}")
    for row in startup:
        print(f"  {row['program']:16} {row['arm']:24} {row['median_ms']:10.1f} {row['added_ms']:9.1f}")
    if args.only_startup:
        return
    print("\nper call (httpx POST, loopback keep-alive server)")
    print(f"  {'arm':28} {'calls':>6} {'median us':>10} {'added us':>9} {'ratio':>6}")
    for row in bench_per_call(args.calls, args.call_rounds):
        print(f"  {row['arm']:28} {row['calls']:6d} {row['median_us']:10.1f} {row['added_us']:9.1f} {row['ratio']:6.2f}")
    print()
    _print_run_per_call(args.run_calls, args.run_rounds)
    print("\nper call, hook cost only (httpx over MockTransport: no network)")
    print(f"  {'arm':28} {'calls':>6} {'median us':>10} {'added us':>9} {'ratio':>6}")
    for row in bench_hot_path(args.calls, args.call_rounds):
        print(f"  {row['arm']:28} {row['calls']:6d} {row['median_us']:10.1f} {row['added_us']:9.1f} {row['ratio']:6.2f}")


if __name__ == "__main__":
    main()
