"""Replay cost per call against a direct loopback call, measured in the same run.

An httpx client posts a recorded request (a chat completion, and a chat stream read to its end):

    direct    to a keep-alive loopback server in its own process answering with the recorded
              body in one write, nothing hooked or captured
    replay    the same call inside `llmtap.capture()` with a `Replayer` answering it from a
              recording of those calls (matching, the recorded answer, the capture of the
              replayed call): no socket at all

The arms are interleaved round by round so machine noise hits both alike. Printed: median
microseconds per call of each, and replay / direct.

    /work/main/.venv/bin/python bench/replay_bench.py                 # 15 rounds of 200 calls
    /work/main/.venv/bin/python bench/replay_bench.py --rounds 5 --calls 100
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

import llmtap
from llmtap.replay.live import Replayer, set_replayer
from llmtap.replay.matching import RecordingIndex
from tests.fixtures import fixture

CASES = {"json": "chat/text-basic-gpt4o", "stream": "chat/text-stream-include-usage-gpt4"}
# The direct arm's upstream: a keep-alive loopback server in its own process that answers each
# request with the recorded body in one write (TCP_NODELAY), so the baseline is the HTTP round trip.
UPSTREAM = r"""
import asyncio, socket, sys
from tests.fixtures import fixture
BODIES = {b"json": fixture("chat/text-basic-gpt4o"), b"stream": fixture("chat/text-stream-include-usage-gpt4")}
ANSWERS = {}
for key, recorded in BODIES.items():
    body = recorded.body_text.encode()
    kind = b"text/event-stream" if key == b"stream" else b"application/json"
    ANSWERS[key] = b"HTTP/1.1 200 OK\r\ncontent-type: " + kind + b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
async def handle(reader, writer):
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            break
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await reader.readexactly(length)
        writer.write(ANSWERS[b"stream" if b'"stream":true' in body.replace(b" ", b"") else b"json"])
        await writer.drain()
    writer.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
asyncio.run(main())
"""


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _timed(client: httpx.Client, body: dict, calls: int, stream: bool) -> float:
    """Median microseconds per call over `calls` calls."""
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        if stream:
            with client.stream("POST", "/v1/chat/completions", json=body) as response:
                for _chunk in response.iter_raw():
                    pass
        else:
            client.post("/v1/chat/completions", json=body).read()
        samples.append((time.perf_counter() - started) * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200)
    options = parser.parse_args()
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", UPSTREAM, str(port)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}"),
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        base = f"http://127.0.0.1:{port}"
        print(f"python {platform.python_version()}, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}; "
              f"{options.rounds} rounds x {options.calls} calls per arm")
        with tempfile.TemporaryDirectory() as scratch:
            for case, name in CASES.items():
                body = fixture(name).request_json
                stream = case == "stream"
                recording = Path(scratch) / f"recording-{case}"
                total = options.rounds * options.calls
                with llmtap.capture(capture_dir=recording), httpx.Client(base_url=base) as client:
                    for _ in range(total):  # one recorded call per replayed one: each occurrence is served once
                        _timed(client, body, 1, stream)
                replayer = Replayer(RecordingIndex.from_path(recording))
                direct, replay = [], []
                with httpx.Client(base_url=base) as client:
                    _timed(client, body, 20, stream)  # warm up the keep-alive connection
                    for round_number in range(options.rounds):
                        direct.append(_timed(client, body, options.calls, stream))
                        set_replayer(replayer)
                        with llmtap.capture(capture_dir=Path(scratch) / f"replayed-{case}-{round_number}"):
                            replay.append(_timed(client, body, options.calls, stream))
                        set_replayer(None)
                assert replayer.served == total and not replayer.misses, "every replayed call must be served"
                d, r = statistics.median(direct), statistics.median(replay)
                print(f"{case:7s} direct {d:8.1f} us/call   replay {r:8.1f} us/call   replay/direct {r / d:5.2f}")
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
