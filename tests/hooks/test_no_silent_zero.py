"""No silent zero under `llmtap run`: model traffic no hook records is reported, `http.client` is hooked,
and an error response an SDK closes unread (a retried streamed 500) keeps its body."""

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

COMPLETION = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}  # fmt: skip
CHUNK = {"id": "chatcmpl-2", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": None}]}  # fmt: skip


class _Model(BaseHTTPRequestHandler):
    failures_left = 0

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        if body.get("stream"):
            cls = type(self)
            if cls.failures_left > 0:
                cls.failures_left -= 1
                self._send(500, b'{"error": {"message": "boom upstream", "type": "server_error"}}', "application/json")
                return
            events = f"data: {json.dumps(CHUNK)}\n\ndata: [DONE]\n\n".encode()
            self._send(200, events, "text/event-stream")
            return
        self._send(200, json.dumps(COMPLETION).encode(), "application/json")

    def _send(self, status: int, payload: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def model_port() -> Iterator[int]:
    _Model.failures_left = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Model)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def _run(tmp_path: Path, port: int, program: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    registry = tmp_path / "registry.yaml"
    registry.write_text(
        "schema_version: 1\nproviders:\n  - provider: example\n"
        f"    hosts: ['127.0.0.1:{port}']\n    endpoints:\n      - {{path: '**/v1/chat/completions', operation: chat}}\n"
    )
    script = tmp_path / "workload.py"
    script.write_text(program)
    env = dict(os.environ, LLMTAP_URL_REGISTRY=str(registry), MODEL_PORT=str(port))
    command = [sys.executable, "-m", "llmtap.cli.run", "--capsule-dir", str(tmp_path / "runs"), "--", sys.executable, str(script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    [capsule] = [path for path in (tmp_path / "runs").iterdir() if (path / "capsule.json").exists()]
    return done, capsule


def _calls(capsule: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in sorted((capsule / "calls").glob("*.capture.jsonl")) for line in path.read_text().splitlines()]


RAW_SOCKET = """
import json, os, socket
port = int(os.environ["MODEL_PORT"])
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
with socket.create_connection(("127.0.0.1", port)) as conn:
    conn.sendall(b"POST /v1/chat/completions HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: application/json\\r\\n"
                 b"Connection: close\\r\\nContent-Length: " + str(len(body)).encode() + b"\\r\\n\\r\\n" + body)
    answer = b""
    while chunk := conn.recv(65536):
        answer += chunk
print(answer.split(b" ", 2)[1].decode())
"""


def test_a_raw_socket_client_is_reported_and_health_is_not_ok(model_port: int, tmp_path: Path) -> None:
    done, capsule = _run(tmp_path, model_port, RAW_SOCKET)
    assert done.returncode == 0 and done.stdout.strip() == "200", done.stderr
    health = json.loads((capsule / "capture-health.json").read_text())
    assert health["ok"] is False
    assert health["unhooked_model_traffic"] == [{"host": "127.0.0.1", "port": model_port, "module": "__main__", "connections": 1}]
    assert f"1 connection(s) to 127.0.0.1:{model_port} by an unhooked client in module __main__" in done.stderr
    assert _calls(capsule) == []  # nothing was recorded, and the capsule says so rather than `ok`


URLLIB = """
import json, os, urllib.request
port = int(os.environ["MODEL_PORT"])
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions?api-version=1", data=body,
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer sk-secret"})
with urllib.request.urlopen(request) as response:
    print(json.loads(response.read())["choices"][0]["message"]["content"])
"""


def test_urllib_is_recorded_by_the_http_client_hook(model_port: int, tmp_path: Path) -> None:
    done, capsule = _run(tmp_path, model_port, URLLIB)
    assert done.returncode == 0 and done.stdout.strip() == "hi", done.stderr
    [call] = _calls(capsule)
    assert call["status_code"] == 200 and call["response"]["choices"][0]["message"]["content"] == "hi"
    assert call["capture"]["hook"] == "http.client" and "sk-secret" not in json.dumps(call)
    health = json.loads((capsule / "capture-health.json").read_text())
    assert health["ok"] is True and health["unhooked_model_traffic"] == []
    [event] = [json.loads(line) for line in (capsule / "network_events.jsonl").read_text().splitlines()]
    assert event["model_call"] is True and event["path"] == "/v1/chat/completions" and event["status"] == 200


OPENAI_RETRY = """
import os, openai
client = openai.OpenAI(base_url=f"http://127.0.0.1:{os.environ['MODEL_PORT']}/v1", api_key="sk-test", max_retries=2)
stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
print("".join(chunk.choices[0].delta.content or "" for chunk in stream))
"""


def test_a_streamed_500_the_sdk_retries_keeps_its_error_body(model_port: int, tmp_path: Path) -> None:
    _Model.failures_left = 2
    done, capsule = _run(tmp_path, model_port, OPENAI_RETRY)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    calls = _calls(capsule)
    assert [call["status_code"] for call in calls] == [500, 500, 200]
    for failed in calls[:2]:  # closed unread by the SDK before its retry: the record still has the body
        assert "boom upstream" in json.dumps(failed.get("response") or failed.get("response_raw"))
