"""How much memory `llmtap serve` needs for one large request body: peak RSS over the body's size.

A static upstream (its own process) reads each request whole and answers a small chat completion.
Two `python -m llmtap serve` processes forward to it: capture off (the baseline: what forwarding
alone holds) and capture on (forwarding plus the record). For each, one small call warms the
process up, its peak RSS is reset (`/proc/PID/clear_refs`, 5), and one call with a body of SIZE MB
(a chat request whose message is SIZE MB of text) goes through; the peak RSS minus the RSS before
is printed, as bytes and as copies of the body. Each is repeated `--repeat` times, each time in a
fresh server process (a warm heap reuses what an earlier call freed, which would hide the cost),
and the median is printed.

    /work/main/.venv/bin/python bench/body_memory_bench.py            # 50 MB, 3 repeats
    /work/main/.venv/bin/python bench/body_memory_bench.py --size-mb 20 --repeat 1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

_ANSWER = orjson.dumps(
    {"id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "gpt-4",
     "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
     "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
)


async def _serve_upstream(port: int) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                remaining = length
                while remaining:  # read and drop: the upstream holds no copy
                    remaining -= len(await reader.read(min(remaining, 1 << 20)))
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                             + str(len(_ANSWER)).encode() + b"\r\n\r\n" + _ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"Nothing listened on port {port} within {timeout} s.")


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise SystemExit(f"/proc/{pid}/status has no {field}.")


def _post(port: int, body: bytes) -> int:
    """Send one request over a raw socket (no client-side copies to speak of); return the status."""
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(b"POST /ng-rollout/big/v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
                     b"\r\nconnection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n")
        view = memoryview(body)
        for start in range(0, len(view), 1 << 20):
            sock.sendall(view[start : start + (1 << 20)])
        answer = b""
        while piece := sock.recv(65536):
            answer += piece
    return int(answer.split(b" ", 2)[1])


def _measure(pid: int, port: int, body: bytes) -> int:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset the peak RSS to the current RSS
    before = _status_kib(pid, "VmRSS")
    status = _post(port, body)
    if status != 200:
        raise SystemExit(f"The proxied call answered {status}, not 200.")
    return (_status_kib(pid, "VmHWM") - before) * 1024


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Peak RSS of llmtap serve for one large request body.")
    parser.add_argument("--size-mb", type=float, default=50.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--upstream-server", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.upstream_server:
        asyncio.run(_serve_upstream(args.upstream_server))
        return
    size = int(args.size_mb * 1e6)
    content = b"x" * size
    body = b'{"model":"gpt-4","messages":[{"role":"user","content":"' + content + b'"}]}'
    del content
    small = b'{"model":"gpt-4","messages":[{"role":"user","content":"hi"}]}'
    upstream_port = _free_port()
    processes = [subprocess.Popen([sys.executable, __file__, "--upstream-server", str(upstream_port)])]
    try:
        _wait_for(upstream_port)
        print(f"body {len(body):,} bytes; peak RSS growth during one call to a fresh server, median of {args.repeat}")
        with tempfile.TemporaryDirectory() as capture_dir:
            for name, extra in (("off", []), ("on", ["--capture-dir", capture_dir])):
                growths = []
                for _ in range(args.repeat):
                    port = _free_port()
                    process = subprocess.Popen(
                        [sys.executable, "-m", "llmtap", "serve", "--upstream", f"http://127.0.0.1:{upstream_port}",
                         "--port", str(port), *extra], stderr=subprocess.DEVNULL)
                    try:
                        _wait_for(port)
                        _post(port, small)
                        growths.append(_measure(process.pid, port, body))
                    finally:
                        process.terminate()
                        process.wait(10)
                growth = statistics.median(growths)
                print(f"  capture {name:3}  {growth / 1e6:8.1f} MB  {growth / len(body):5.2f} copies of the body"
                      f"  (runs: {', '.join(f'{g / 1e6:.1f}' for g in growths)} MB)")
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(10)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
