"""Instructions that capture adds to one model call, counted by valgrind: a figure noise cannot move.

`proxy_bench.py` measures time on a shared two-core VM, where the same code's throughput swings by
a factor of two from run to run. This bench counts the instructions (user space, this process) that
`CaptureMiddleware` spends per call around an app replaying one recorded exchange: the same code
and inputs give the same count whatever else the machine runs, so a change of a few percent in
capture's cost shows, which no timed run here can show.

Each fixture is served as `llmtap serve` forwards it: the head, then the JSON body as one chunk or
each SSE event as its own chunk (with a turn of the loop between them), then the end. Calls go 32
at a time, each worker under its own rollout id, into a store on tmpfs, in a process with the
collector settings of `llmtap serve` (`--default-gc` for CPython's own). The sync helper process
is not counted (its CPU is a few percent of capture's, see docs/benchmarks.md).
Each figure is (count at N2 calls - count at N1 calls) / (N2 - N1): start-up and imports cancel.

    .venv/bin/python bench/capture_instructions.py
    .venv/bin/python bench/capture_instructions.py --fixtures chat/text-basic-gpt4o --calls 128 640
    .venv/bin/python bench/capture_instructions.py --fixtures synthetic/long-rollout-chat   # a 32 KB request
    LLMTAP_BENCH_SERVE_METRICS=1 .venv/bin/python bench/capture_instructions.py ...   # with serve's metrics
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.fixtures import RecordedExchange, fixture  # noqa: E402

FIXTURES = (
    "chat/text-basic-gpt4o",
    "chat/text-stream-include-usage-gpt4",
    "messages/text-stream-claude3-haiku",
    "responses/function-call-stream-gpt55",
)
LONG_ROLLOUT = "synthetic/long-rollout-chat"  # not a recording: see `LongRollout`
CONCURRENCY = 32
COLLECTED = re.compile(r"Collected : (\d+)")


class LongRollout:
    """An RL agent's late call: a chat request of 181 messages (60 tool-call turns, 32 KB)
    answered by `chat/text-basic-gpt4o`'s response. What capture costs grows with the request, and
    no recorded fixture has a long one; the same shape as a recorded exchange, for `drive`."""

    request_path = "/v1/chat/completions"

    def __init__(self) -> None:
        answer = fixture("chat/text-basic-gpt4o")
        self.status, self.content_type, self.body_bytes, self.is_stream = 200, answer.content_type, answer.body_bytes, False
        messages: list[dict[str, object]] = [{"role": "system", "content": "You are a helpful assistant. " * 20}]
        for turn in range(60):
            question = f"Question {turn}: what is the weather in city number {turn}? Please answer with detail." * 3
            call = {"id": f"call_{turn}", "type": "function",
                    "function": {"name": "get_weather", "arguments": f'{{"city": "c{turn}", "unit": "C"}}'}}
            messages += [
                {"role": "user", "content": question},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"call_{turn}", "content": '{"temp": 21, "sky": "clear"}'},
            ]
        self.request_json = {"model": "gpt-4o", "messages": messages}


def exchange_for(name: str) -> RecordedExchange | LongRollout:
    return LongRollout() if name == LONG_ROLLOUT else fixture(name)


def replaying_app(recorded: RecordedExchange | LongRollout):  # type: ignore[no-untyped-def]
    """A model server answering every call with `recorded`, chunked as the proxy forwards it."""
    body = recorded.body_bytes
    chunks = [event + b"\n\n" for event in body.split(b"\n\n") if event] if recorded.is_stream else [body]
    headers = [(b"content-type", recorded.content_type.encode())]
    if not recorded.is_stream:
        headers.append((b"content-length", str(len(body)).encode()))

    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": recorded.status, "headers": headers})
        for chunk in chunks:
            await asyncio.sleep(0)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


async def drive(name: str, capture: bool, calls: int) -> None:
    """`calls` calls through the middleware, CONCURRENCY at a time (the counted work)."""
    from llmtap.server.middleware import CaptureMiddleware
    from llmtap.store import CaptureStore

    recorded = exchange_for(name)
    request = orjson.dumps(recorded.request_json)
    directory = tempfile.mkdtemp(dir="/dev/shm" if Path("/dev/shm").is_dir() else None)
    store = CaptureStore(directory) if capture else None
    options = {}
    if os.environ.get("LLMTAP_BENCH_SERVE_METRICS") == "1":  # what `llmtap serve` adds: its Prometheus metrics
        from llmtap.export.prometheus import ServeMetrics

        options["metrics"] = ServeMetrics()
    middleware = CaptureMiddleware(replaying_app(recorded), store=store, **options)

    async def one(rollout_id: str) -> None:
        delivered = False

        async def receive():  # type: ignore[no-untyped-def]
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": request, "more_body": False}
            await asyncio.Event().wait()  # the client stays connected

        async def send(message) -> None:  # type: ignore[no-untyped-def]
            pass

        path = f"/ng-rollout/{rollout_id}{recorded.request_path}"
        scope = {
            "type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
            "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                        (b"authorization", b"Bearer sk-bench"), (b"content-length", str(len(request)).encode())],
        }
        await middleware(scope, receive, send)

    async def worker(index: int) -> None:
        for _ in range(calls // CONCURRENCY):
            await one(f"w{index}")

    try:
        await asyncio.gather(*(worker(index) for index in range(CONCURRENCY)))
    finally:
        if store is not None:
            store.close()
        shutil.rmtree(directory, ignore_errors=True)


def count(name: str, capture: bool, calls: int, gc_mode: str) -> int:
    """Instructions of one run of this script driving `calls` calls, under callgrind."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
               str(Path(__file__).resolve()), "--drive", name, "on" if capture else "off", str(calls), gc_mode]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"valgrind run failed ({' '.join(command)}):\n{done.stderr[-2000:]}")
    return int(found.group(1))


def per_call(name: str, capture: bool, low: int, high: int, gc_mode: str, pool: ThreadPoolExecutor) -> float:
    first, second = pool.submit(count, name, capture, low, gc_mode), pool.submit(count, name, capture, high, gc_mode)
    return (second.result() - first.result()) / (high - low)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fixtures", nargs="+", default=list(FIXTURES))
    parser.add_argument("--calls", nargs=2, type=int, default=[128, 640], metavar=("N1", "N2"))
    parser.add_argument("--default-gc", action="store_true", help="CPython's collector settings, not llmtap serve's")
    parser.add_argument("--drive", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.drive:
        name, capture, calls, gc_mode = args.drive
        if gc_mode == "steady":
            from llmtap.server.run import steady_gc

            steady_gc()
        asyncio.run(drive(name, capture == "on", int(calls)))
        return 0
    gc_mode = "default" if args.default_gc else "steady"
    low, high = args.calls
    if not 0 < low < high or low % CONCURRENCY or high % CONCURRENCY:
        parser.error(f"--calls takes N1 < N2, both multiples of {CONCURRENCY}")
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind); it does the counting.")
    for name in args.fixtures:
        exchange_for(name)  # a wrong name fails here, before any slow run
    print(f"instructions per call, capture off and on ({CONCURRENCY} in flight, N = {low} and {high}, "
          f"{gc_mode} collector); Python {sys.version.split()[0]}")
    print(f"{'fixture':40} {'off':>10} {'on':>10} {'capture':>10}")
    with ThreadPoolExecutor(max_workers=2) as pool:  # one valgrind per core
        for name in args.fixtures:
            off = per_call(name, False, low, high, gc_mode, pool)
            on = per_call(name, True, low, high, gc_mode, pool)
            print(f"{name:40} {off:10.0f} {on:10.0f} {on - off:+10.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
