"""The proxy's upstream seam: `build_app(transport=...)` with `MockTransport`, no patching, no socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from llmtap import CaptureStore, read_model_call_records
from llmtap.errors import LlmtapError, UpstreamError
from llmtap.health import CaptureHealth
from llmtap.server.config import UpstreamConfig, load_serve_config
from llmtap.server.http1 import UpstreamClosed, UpstreamProtocolError, UpstreamReadTimeout
from llmtap.server.mock_transport import MockRequest, MockResponse, MockTransport
from llmtap.server.proxy import build_app
from llmtap.server.upstream import UpstreamTransport, UpstreamUnreachable
from tests.server.asgi_harness import call_app, http_scope

CHAT = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
EVENTS = [
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"lo"}}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
    b"data: [DONE]\n\n",
]
SSE = [(b"content-type", b"text/event-stream")]


def _config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **upstream: object):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("LLMTAP_MOCK_KEY", "sk-mock-upstream-key")
    return load_serve_config(
        settings={
            "upstreams": {"home": {"base_url": "http://127.0.0.1:9/gateway/v1", "api_key_env": "LLMTAP_MOCK_KEY", **upstream}},
            "observability_enabled": True,
            "model_call_capture_dir": str(tmp_path / "calls"),
        }
    )


async def test_a_streamed_answer_reaches_the_client_chunk_by_chunk_and_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    transport = MockTransport(lambda request: MockResponse(200, SSE, EVENTS))
    with CaptureStore(tmp_path / "calls") as store:
        app = build_app(_config(tmp_path, monkeypatch), store=store, health=CaptureHealth(), transport=transport)
        sent = await call_app(app, http_scope("/ng-rollout/r-1/v1/chat/completions"), CHAT)
        records = read_model_call_records(store, "r-1")
    assert sent.status == 200
    chunks = [m["body"] for m in sent.messages if m["type"] == "http.response.body" and m["body"]]
    assert chunks == EVENTS  # one body message per upstream chunk, none merged or split
    (request,) = transport.requests
    assert request.url == "http://127.0.0.1:9/gateway/v1/chat/completions"
    assert request.body == CHAT
    assert request.header("authorization") == b"Bearer sk-mock-upstream-key"
    assert len(records) == 1 and records[0].stream is True
    assert records[0].finish_reason == "stop" and records[0].response_raw == b"".join(EVENTS).decode()


async def test_an_async_handler_and_an_async_chunk_source_are_awaited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for event in EVENTS:
            await asyncio.sleep(0)
            yield event

    async def answer(request: MockRequest) -> MockResponse:
        return MockResponse(200, SSE, chunks())

    transport = MockTransport(answer)
    app = build_app(_config(tmp_path, monkeypatch), store=None, health=CaptureHealth(), transport=transport)
    sent = await call_app(app, http_scope("/v1/chat/completions"), CHAT)
    assert sent.body == b"".join(EVENTS)


async def test_a_bytes_body_is_sent_with_its_length(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    body = b'{"id":"c1","object":"chat.completion","model":"m","choices":[]}'
    transport = MockTransport(lambda request: MockResponse(201, [(b"content-type", b"application/json")], body))
    app = build_app(_config(tmp_path, monkeypatch), store=None, health=CaptureHealth(), transport=transport)
    sent = await call_app(app, http_scope("/v1/chat/completions"), CHAT)
    assert (sent.status, sent.body) == (201, body)
    assert (b"content-length", str(len(body)).encode()) in sent.messages[0]["headers"]


async def test_an_unreachable_upstream_from_the_handler_is_answered_502_and_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(request: MockRequest) -> MockResponse:
        raise UpstreamUnreachable(ConnectionRefusedError("refused"), timed_out=False)

    with CaptureStore(tmp_path / "calls") as store:
        app = build_app(_config(tmp_path, monkeypatch), store=store, health=CaptureHealth(), transport=MockTransport(refuse))
        sent = await call_app(app, http_scope("/ng-rollout/r-2/v1/chat/completions"), CHAT)
        (record,) = read_model_call_records(store, "r-2")
    assert sent.status == 502
    assert orjson.loads(sent.body)["error"]["type"] == "upstream_unreachable"
    assert record.status_code == 502 and record.error_category == "connection"


async def test_a_transport_factory_makes_one_transport_per_upstream_and_shutdown_closes_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: dict[str, MockTransport] = {}

    def factory(name: str, upstream: UpstreamConfig) -> UpstreamTransport:
        made[name] = MockTransport(lambda request: MockResponse(200, [], name.encode()))
        return made[name]

    config = _config(tmp_path, monkeypatch)
    config.upstreams["other"] = UpstreamConfig(base_url="http://127.0.0.1:10", models=["special"])
    app = build_app(config, store=None, health=CaptureHealth(), transport_factory=factory)
    sent = await call_app(app, http_scope("/v1/chat/completions"), b'{"model":"special"}')
    assert sent.body == b"other" and sorted(made) == ["home", "other"]
    await app.app.aclose()  # type: ignore[attr-defined]
    assert all(transport.closed for transport in made.values())


def test_transport_and_transport_factory_together_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    transport = MockTransport(lambda request: MockResponse())
    with pytest.raises(ValueError, match="not both"):
        build_app(_config(tmp_path, monkeypatch), store=None, transport=transport, transport_factory=lambda n, u: transport)


async def test_a_handler_returning_something_else_is_a_type_error() -> None:
    transport = MockTransport(lambda request: b"not a response")  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="MockResponse"):
        await transport.send("POST", "http://127.0.0.1:9/v1/x", [], b"")


@pytest.mark.parametrize(
    "error",
    [
        UpstreamUnreachable(OSError("x"), timed_out=False),
        UpstreamProtocolError("bad"),
        UpstreamClosed("closed"),
        UpstreamReadTimeout("slow"),
    ],
)
def test_every_upstream_error_is_an_llmtap_error_and_keeps_its_builtin_kind(error: Exception) -> None:
    assert isinstance(error, UpstreamError) and isinstance(error, LlmtapError)
    assert not isinstance(error, UpstreamClosed) or isinstance(error, ConnectionError)
    assert not isinstance(error, UpstreamReadTimeout) or isinstance(error, TimeoutError)


async def test_a_record_that_cannot_be_written_is_counted_in_health_and_metrics_and_the_answer_still_arrives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    body = b'{"id":"c1","object":"chat.completion","model":"m","choices":[]}'
    transport = MockTransport(lambda request: MockResponse(200, [(b"content-type", b"application/json")], body))
    health = CaptureHealth()
    store = CaptureStore(tmp_path / "calls")
    app = build_app(_config(tmp_path, monkeypatch), store=store, health=health, transport=transport)
    store.close()  # every append now fails: the store refuses records after close
    sent = await call_app(app, http_scope("/ng-rollout/r-3/v1/chat/completions"), CHAT.replace(b"true", b"false"))
    scraped = await call_app(app, http_scope("/llmtap/metrics", method="GET"), b"")
    assert (sent.status, sent.body) == (200, body)
    assert health.failures() == {"record_write_failed": 1}
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(scraped.body.decode())
        for sample in family.samples
    }
    assert samples[("llmtap_capture_failures_total", (("kind", "record_write_failed"),))] == 1
    assert not any(name == "llmtap_calls_total" for name, _ in samples)  # a call is counted once its record is durable
