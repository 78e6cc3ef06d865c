"""The latency `llmtap mcp-proxy` adds per tools/call, against a direct session in the same run.

    .venv/bin/python bench/mcp_bench.py            # 3 interleaved rounds of 300 calls per cell
    .venv/bin/python bench/mcp_bench.py --quick    # 1 round of 100

Cells (their order rotated each round), each a fresh session of the `mcp` SDK's own client
calling the test server's `echo` tool
one call at a time: stdio direct, stdio through the proxy counting only (no file), stdio through
the proxy recording to a file on disk (fsynced before each answer is released), and the same for
streamable HTTP. Prints p50 and p99 per call, and each proxied cell's
added p50 and its ratio to the direct cell of its transport. Binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parent.parent
SERVER = str(ROOT / "tests" / "mcp" / "tool_server.py")
PROXY = [sys.executable, "-m", "llmtap", "mcp-proxy"]


async def _calls(client_target: object, calls: int) -> list[float]:
    async with Client(client_target, mode="legacy") as client:  # type: ignore[arg-type]
        for _ in range(10):  # warm-up
            await client.call_tool("echo", {"text": "warm"})
        timings = []
        for index in range(calls):
            started = time.perf_counter()
            await client.call_tool("echo", {"text": f"call {index}"})
            timings.append((time.perf_counter() - started) * 1000.0)
        return timings


def _stdio(command: list[str]) -> StdioServerParameters:
    return StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for(port: int) -> None:
    for _ in range(6000):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.01)
    raise RuntimeError(f"nothing listens on {port}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _summary(timings: list[float]) -> tuple[float, float]:
    ordered = sorted(timings)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 round of 100 calls per cell")
    options = parser.parse_args()
    if options.quick:
        options.calls, options.rounds = 100, 1
    print(f"load average {os.getloadavg()[0]:.2f}; {options.rounds} round(s) x {options.calls} calls per cell")

    work = Path(tempfile.mkdtemp(prefix="llmtap-mcp-bench-", dir=Path.cwd()))  # on disk, not tmpfs
    port = _free_port()
    server = subprocess.Popen([sys.executable, SERVER, "http", str(port)], stderr=subprocess.DEVNULL)
    upstream = f"http://127.0.0.1:{port}/mcp"
    recording = subprocess.Popen(
        [*PROXY, "--record", str(work / "http.jsonl"), "--upstream", upstream, "--port", "0"], stderr=subprocess.PIPE
    )
    counting = subprocess.Popen([*PROXY, "--upstream", upstream, "--port", "0"], stderr=subprocess.PIPE)
    urls = []
    for proxy in (recording, counting):
        assert proxy.stderr is not None
        while (found := re.search(r"http://\S+", proxy.stderr.readline().decode())) is None:
            pass
        urls.append(found.group(0))
    _wait_for(port)
    server_cmd = [sys.executable, SERVER, "stdio"]
    cells: dict[str, object] = {
        "stdio direct": _stdio(server_cmd),
        "stdio proxy, counting": _stdio([*PROXY, "--", *server_cmd]),
        "stdio proxy, recording": _stdio([*PROXY, "--record", str(work / "stdio.jsonl"), "--", *server_cmd]),
        "http direct": upstream,
        "http proxy, counting": urls[1],
        "http proxy, recording": urls[0],
    }
    results: dict[str, list[float]] = {name: [] for name in cells}
    env_without_file = os.environ.pop("LLMTAP_TOOL_CALLS_FILE", None)
    try:
        names = list(cells)
        for round_index in range(options.rounds):
            shift = round_index % len(names)  # rotate the order, so that noise lands on every cell alike
            for name in names[shift:] + names[:shift]:
                results[name] += asyncio.run(_calls(cells[name], options.calls))
    finally:
        _stop(recording)
        _stop(counting)
        _stop(server)
        if env_without_file is not None:
            os.environ["LLMTAP_TOOL_CALLS_FILE"] = env_without_file
    records = sum(len((work / name).read_bytes().splitlines()) for name in ("stdio.jsonl", "http.jsonl"))
    for path in work.iterdir():
        path.unlink()
    work.rmdir()

    print(f"{'cell':<26}{'p50 ms':>9}{'p99 ms':>9}{'added p50 ms':>14}{'ratio':>8}")
    for name, timings in results.items():
        p50, p99 = _summary(timings)
        base = _summary(results["stdio direct" if name.startswith("stdio") else "http direct"])[0]
        added = "" if "direct" in name else f"{p50 - base:14.3f}"
        ratio = "" if "direct" in name else f"{p50 / base:8.2f}"
        print(f"{name:<26}{p50:9.3f}{p99:9.3f}{added:>14}{ratio:>8}")
    print(f"records written: {records}")


if __name__ == "__main__":
    main()
