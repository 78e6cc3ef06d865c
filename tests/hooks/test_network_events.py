"""network_events.jsonl under `llmtap run`: one event per HTTP request through each hooked library, model API or not,
with method, host, port, path, status, sizes and timing, and never a query value, body or header value."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

SECRET = "sk-do-not-keep"


class _Data(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        status = 404 if self.path.startswith("/missing") else 200
        payload = b'{"rows": [1, 2, 3]}'
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _answer


@pytest.fixture
def data_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Data)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


WORKLOAD = """
import asyncio, os, urllib.request
import aiohttp, httpx, requests, urllib3
base = f"http://127.0.0.1:{os.environ['DATA_PORT']}"
secret = {"Authorization": "Bearer " + os.environ["SECRET"]}
requests.get(base + "/requests/rows?token=" + os.environ["SECRET"], headers=secret)
urllib3.PoolManager().request("POST", base + "/urllib3/rows", body=b"abcdef")
httpx.post(base + "/httpx/rows", content=b"0123456789", headers=secret)
urllib.request.urlopen(base + "/urllib/rows").read()
try:
    urllib.request.urlopen(base + "/missing/rows")
except urllib.error.HTTPError as exc:
    exc.close()

async def fetch():
    async with aiohttp.ClientSession() as session:
        async with session.get(base + "/aiohttp/rows?q=x") as response:
            await response.read()
        async with httpx.AsyncClient() as client:
            await client.get(base + "/httpx-async/rows")

asyncio.run(fetch())
print("done")
"""


def test_every_request_through_every_hooked_library_leaves_one_event(data_port: int, tmp_path: Path) -> None:
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    env = dict(os.environ, DATA_PORT=str(data_port), SECRET=SECRET)
    command = [sys.executable, "-m", "llmtap.cli.run", "--capsule-dir", str(tmp_path / "runs"), "--", sys.executable, str(script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr
    [capsule] = [path for path in (tmp_path / "runs").iterdir() if (path / "capsule.json").exists()]
    text = (capsule / "network_events.jsonl").read_text()
    assert SECRET not in text and "token" not in text and "rows\": [" not in text  # no query, header value or body
    events = [json.loads(line) for line in text.splitlines()]
    seen = {(event["hook"], event["method"], event["path"], event["status"]) for event in events}
    assert seen == {
        ("requests", "GET", "/requests/rows", 200),
        ("urllib3", "POST", "/urllib3/rows", 200),
        ("httpx", "POST", "/httpx/rows", 200),
        ("http.client", "GET", "/urllib/rows", 200),
        ("http.client", "GET", "/missing/rows", 404),
        ("aiohttp", "GET", "/aiohttp/rows", 200),
        ("httpx", "GET", "/httpx-async/rows", 200),
    }
    assert len(events) == len(seen)  # one event per request: a lower hooked layer adds none
    by_path = {event["path"]: event for event in events}
    assert by_path["/urllib3/rows"]["request_bytes"] == 6 and by_path["/httpx/rows"]["request_bytes"] == 10
    assert all(event["response_bytes"] == 19 for event in events)  # the declared length
    assert all(event["host"] == "127.0.0.1" and event["port"] == data_port and event["scheme"] == "http" for event in events)
    assert all(event["duration_ms"] >= 0 and event["error"] is None and event["model_call"] is False for event in events)
    manifest = json.loads((capsule / "capsule.json").read_text())
    assert manifest["counts"]["network_events"] == len(events) and manifest["counts"]["model_calls"] == 0
