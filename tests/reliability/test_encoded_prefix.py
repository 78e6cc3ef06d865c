"""An encoded character in the correlation prefix never sends the upstream's credential elsewhere.

The attack: `/ng-rollout/x%2F@evil:9666/v1/chat/completions` (sent as is, e.g. `curl --path-as-is`)
decodes to a valid-looking prefix, while the raw text after it, appended to a base URL without a
path, turns `evil` into the URL's host. Every variant is sent two ways: through the proxy app with
a `MockTransport` that records where each request would go (http and https bases, with and without a
path), and as raw bytes over a socket to a real `llmtap serve` between a home upstream and a
honeypot that must never see a byte.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

import orjson
import pytest

from llmtap import CaptureStore, read_model_call_records
from llmtap.errors import ConfigError
from llmtap.health import CaptureHealth
from llmtap.server.config import load_serve_config
from llmtap.server.mock_transport import MockRequest, MockResponse, MockTransport
from llmtap.server.proxy import UnsafeRequestTarget, build_app, upstream_url
from tests.e2e.serve_harness import serving
from tests.server.asgi_harness import call_app

KEY = "sk-test-server-key-never-leaves-home"
CHAT = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
ANSWER = b'{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[]}'

# Each raw path names the attacker's authority `EVIL` in some encoded form. `None` as the
# expected status means only "not forwarded anywhere but home" is asserted.
HOSTILE_PATHS = {
    "encoded-slash-in-id": "/ng-rollout/x%2F@EVIL/v1/chat/completions",
    "encoded-slash-lowercase": "/ng-rollout/x%2f@EVIL/v1/chat/completions",
    "double-encoded-slash": "/ng-rollout/x%252F@EVIL/v1/chat/completions",
    "encoded-backslash-in-id": "/ng-rollout/x%5C@EVIL/v1/chat/completions",
    "encoded-dot-id": "/ng-rollout/%2e%2e/v1/chat/completions",
    "encoded-prefix-slash": "/ng-rollout%2Fx%2F@EVIL/v1/chat/completions",
    "encoded-prefix-letter": "/%6Eg-rollout/x/v1/chat/completions",
    "encoded-slash-in-segment": "/ng-rollout/x/ng-sampling/null%2F@EVIL/v1/chat/completions",
    "encoded-slash-segment-alone": "/ng-sampling/null%2F@EVIL/v1/chat/completions",
    "encoded-sampling-prefix": "/ng-rollout/x/ng-sampling%2Fnull%2F@EVIL/v1/chat/completions",
    "dot-segments-after-prefix": "/ng-rollout/x/%2e%2e/%2e%2e/v1/chat/completions",
    "encoded-backslash-after-prefix": "/ng-rollout/x/%5C@EVIL/v1/chat/completions",
}
BASES = ["http://127.0.0.1:HOME", "http://127.0.0.1:HOME/gateway", "https://127.0.0.1:HOME", "https://127.0.0.1:HOME/gateway/v1"]


def _answer_if_forwarded(request: MockRequest) -> MockResponse:
    """What a forwarded request would get: a 200, which the test would see instead of the refusal."""
    return MockResponse(200, [(b"content-type", b"application/json")], ANSWER)


def _scope(raw_path: str) -> dict[str, object]:
    from urllib.parse import unquote

    return {
        "type": "http",
        "method": "POST",
        "path": unquote(raw_path),
        "raw_path": raw_path.encode("latin-1"),
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(CHAT)).encode())],
    }


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("name", sorted(HOSTILE_PATHS))
async def test_no_hostile_path_reaches_another_host(
    name: str, base: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMTAP_TEST_KEY", KEY)
    home = base.replace("HOME", "8000")
    config = load_serve_config(
        settings={
            "upstreams": {"default": {"base_url": home, "api_key_env": "LLMTAP_TEST_KEY"}},
            "observability_enabled": True,
            "model_call_capture_dir": str(tmp_path / "calls"),
        }
    )
    with CaptureStore(tmp_path / "calls") as store:
        transport = MockTransport(_answer_if_forwarded)
        app = build_app(config, store=store, health=CaptureHealth(), transport=transport)
        sent = await call_app(app, _scope(HOSTILE_PATHS[name].replace("EVIL", "evil.example:9666")), CHAT)
    assert sent.status == 400, sent.body
    assert orjson.loads(sent.body)["error"]["code"] in {"invalid_path", "invalid_rollout_id", "invalid_model_sampling"}
    assert transport.requests == []  # nothing forwarded at all, so no credential anywhere


async def test_a_prefix_with_nothing_after_it_leaves_the_root_path() -> None:
    """`/ng-rollout/ab` routes `/`: the whole id comes off, no character of it is left as the path."""
    from llmtap.server.middleware import CaptureMiddleware

    seen: list[dict[str, object]] = []

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        seen.append(scope)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    sent = await call_app(CaptureMiddleware(app, store=None, health=CaptureHealth()), _scope("/ng-rollout/ab"), b"")
    assert sent.status == 204
    assert (seen[0]["path"], seen[0]["raw_path"]) == ("/", b"/")


@pytest.mark.parametrize("base", BASES)
def test_every_joined_url_keeps_the_configured_host_and_path(base: str) -> None:
    home = base.replace("HOME", "8000")
    configured = urlsplit(home)
    for raw in [*HOSTILE_PATHS.values(), "//evil.example:9666/v1/chat/completions", "/v1/x%2F@evil.example:1"]:
        target = raw.replace("EVIL", "evil.example:9666")
        try:
            url = upstream_url(home, target, b"q=@evil.example")
        except UnsafeRequestTarget:
            continue
        parts = urlsplit(url)
        assert (parts.scheme, parts.hostname, parts.port) == (configured.scheme, configured.hostname, configured.port)
        assert parts.path.startswith(configured.path.removesuffix("/v1"))


@pytest.mark.parametrize("target", ["v1/chat/completions", "%2F@evil/v1", "/a\\b", "/a%5cb", "/v1/../x", "/v1/%2E/x", "/.."])
def test_upstream_url_refuses_targets_that_could_leave_the_base(target: str) -> None:
    with pytest.raises(UnsafeRequestTarget):
        upstream_url("http://127.0.0.1:8000", target, b"")


@pytest.mark.parametrize("base", ["http://h:1?x=1", "http://h:1/#f", "http://h:1/a@b", "http:///v1"])
def test_a_base_url_with_a_query_fragment_or_no_host_is_refused(base: str) -> None:
    with pytest.raises(ConfigError, match="must name a host"):
        load_serve_config(settings={"upstreams": {"a": {"base_url": base}}})


# --- a real llmtap serve between a home upstream and a honeypot ---------------------------------


class _Listener:
    """A loopback HTTP/1.1 responder that keeps every byte it is sent (one response per connection)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port: int = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                conn.settimeout(5)
                try:
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    head, _, body = data.partition(b"\r\n\r\n")
                    length = next(
                        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")),
                        0,
                    )
                    while len(body) < length:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        body += chunk
                    data = head + b"\r\n\r\n" + body
                except OSError:
                    pass
                self.received.append(data)
                reply = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: "
                conn.sendall(reply + str(len(ANSWER)).encode() + b"\r\n\r\n" + ANSWER)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def home_and_honeypot() -> Iterator[tuple[_Listener, _Listener]]:
    home, honeypot = _Listener(), _Listener()
    yield home, honeypot
    home.close()
    honeypot.close()


def _raw_request(port: int, target: str) -> tuple[int, bytes]:
    """Send a request exactly as written (no client normalizes the path), return status and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(
            f"POST {target} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"content-length: {len(CHAT)}\r\nconnection: close\r\n\r\n".encode("latin-1") + CHAT
        )
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


@pytest.mark.parametrize("with_path", [False, True], ids=["base-without-path", "base-with-path"])
def test_a_real_serve_never_sends_its_key_to_the_honeypot(
    with_path: bool, home_and_honeypot: tuple[_Listener, _Listener], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, honeypot = home_and_honeypot
    monkeypatch.setenv("LLMTAP_TEST_KEY", KEY)
    base = f"http://127.0.0.1:{home.port}" + ("/gateway" if with_path else "")
    evil = f"127.0.0.1:{honeypot.port}"
    with serving(base, tmp_path / "calls", upstream={"api_key_env": "LLMTAP_TEST_KEY"}) as (server, health):
        for name, path in sorted(HOSTILE_PATHS.items()):
            status, body = _raw_request(server.port, path.replace("EVIL", evil))
            assert status == 400, (name, body)
        status, _ = _raw_request(server.port, "/ng-rollout/good-1/v1/chat/completions")
        assert status == 200
    assert honeypot.received == []
    [forwarded] = home.received  # only the well-formed call went upstream, with the key, to home
    request_line = forwarded.split(b"\r\n", 1)[0]
    assert request_line == f"POST {'/gateway' if with_path else ''}/v1/chat/completions HTTP/1.1".encode()
    assert f"authorization: Bearer {KEY}".encode() in forwarded
    with CaptureStore(tmp_path / "calls") as store:
        [record] = read_model_call_records(store, "good-1")
        assert record.status_code == 200 and record.dialect == "chat"
    counts = health.snapshot()
    assert counts["rejected_paths"] == 3 and counts["rejected_rollout_ids"] == 5  # the rest: sampling, or the proxy
