"""A live `llmtap serve` with its observers: OTLP export, `/llmtap/metrics`, and `redact: true`.

Real parts throughout: serve runs under uvicorn on loopback in front of the fault upstream's
recorded answers, the calls come from the real `openai` SDK, spans go to a loopback OTLP
receiver over HTTP, and the metrics text is read with prometheus_client's own parser.
"""

from __future__ import annotations

import random
import string
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmtap.export import attributes as names
from llmtap.server.config import load_serve_config
from llmtap.store import CaptureStore
from llmtap.store.readers import read_model_call_records
from tests.e2e.serve_harness import serving
from tests.export.support import attributes_of, otlp_receiver
from tests.support.faults import FAULT_HEADER, FaultUpstream, refused_port

MESSAGES: list[Any] = [{"role": "user", "content": "Say this is a test"}]


def _client(base_url: str, rollout_id: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/ng-rollout/{rollout_id}/v1", api_key="sk-test", max_retries=0)


def _chat(base_url: str, rollout_id: str, *, stream: bool = False, content: str | None = None) -> str:
    messages = MESSAGES if content is None else [{"role": "user", "content": content}]
    with _client(base_url, rollout_id) as client:
        if stream:
            return "".join(
                chunk.choices[0].delta.content or ""
                for chunk in client.chat.completions.create(model="gpt-4o", messages=messages, stream=True)
                if chunk.choices
            )
        answer = client.chat.completions.create(model="gpt-4o", messages=messages)
        return answer.choices[0].message.content or ""


def _wait_for(condition: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the live exporter")
        time.sleep(0.05)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_each_durable_record_is_exported_as_one_span_that_matches_it(
    fault_upstream: FaultUpstream, tmp_path: Path
) -> None:
    with otlp_receiver() as receiver, serving(
        fault_upstream.url("ok"), tmp_path / "calls", otlp_endpoint=receiver.url
    ) as (server, _health):
        answers = [_chat(server.base_url, "r-1"), _chat(server.base_url, "r-1", stream=True), _chat(server.base_url, "r-2")]
        _wait_for(lambda: len(receiver.spans()) == 3)
        health = httpx.get(server.base_url + "/llmtap/health").json()
    assert all(answers)
    store = CaptureStore(tmp_path / "calls", create=False)
    records = {(rollout, r.model_call_id): r for rollout in ("r-1", "r-2") for r in read_model_call_records(store, rollout)}
    assert len(records) == 3
    spans = {}
    for _resource, span in receiver.spans():
        attributes = attributes_of(span)
        spans[(attributes[names.ROLLOUT_ID], attributes[names.MODEL_CALL_ID])] = attributes
    assert set(spans) == set(records)
    for key, record in records.items():
        assert spans[key][names.RESPONSE_ID] == record.response_id
        assert spans[key][names.HTTP_RESPONSE_STATUS_CODE] == record.status_code == 200
        assert spans[key][names.STREAM] == record.stream
    assert health["otlp_export"]["exported"] == 3 and health["otlp_export"]["dropped_total"] == 0


@pytest.mark.parametrize("collector", ["down", "500"])
def test_a_collector_that_is_down_or_failing_loses_no_answer_and_no_record_and_counts_the_drop(
    fault_upstream: FaultUpstream, tmp_path: Path, collector: str
) -> None:
    with otlp_receiver(status=500) as receiver:
        endpoint = f"http://127.0.0.1:{refused_port()}" if collector == "down" else receiver.url
        with serving(fault_upstream.url("ok"), tmp_path / "calls", otlp_endpoint=endpoint) as (server, _health):
            answers = [_chat(server.base_url, "r-1", stream=n % 2 == 1) for n in range(4)]
            _wait_for(lambda: httpx.get(server.base_url + "/llmtap/health").json()["otlp_export"]["dropped_total"] == 4)
            health = httpx.get(server.base_url + "/llmtap/health").json()
            metrics = _samples(httpx.get(server.base_url + "/llmtap/metrics").text)
    assert all(answers) and len(answers) == 4
    assert len(read_model_call_records(CaptureStore(tmp_path / "calls", create=False), "r-1")) == 4
    assert health["otlp_export"]["dropped"]["export_failed"] == 4 and health["otlp_export"]["exported"] == 0
    assert health["records_written"] == 4 and health["ready"] is True
    assert metrics[("llmtap_otlp_spans_dropped_total", (("reason", "export_failed"),))] == 4
    assert metrics[("llmtap_otlp_spans_exported_total", ())] == 0


def test_metrics_parsed_by_prometheus_match_the_calls_made(fault_upstream: FaultUpstream, tmp_path: Path) -> None:
    with serving(fault_upstream.base_url, tmp_path / "calls") as (server, _health):
        calls = [("ok", False), ("ok", False), ("ok", True), ("status-500", False)]
        statuses = []
        for fault, stream in calls:
            response = httpx.post(
                f"{server.base_url}/ng-rollout/r-1/v1/chat/completions",
                json={"model": "gpt-4o", "messages": MESSAGES, "stream": stream},
                headers={FAULT_HEADER: fault},
            )
            statuses.append(response.status_code)
        scraped = httpx.get(server.base_url + "/llmtap/metrics")
        head = httpx.head(server.base_url + "/llmtap/metrics")
    assert statuses == [200, 200, 200, 500]
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain; version=")
    assert head.status_code == 200 and head.content == b""
    samples = _samples(scraped.text)
    ok = ("llmtap_calls_total", (("dialect", "chat"), ("error_category", "none"), ("status_class", "2xx")))
    assert samples[ok] == 3
    failed = {key: value for key, value in samples.items() if key[0] == "llmtap_calls_total" and ("status_class", "5xx") in key[1]}
    assert list(failed.values()) == [1]
    assert samples[("llmtap_call_latency_seconds_count", (("dialect", "chat"),))] == 4
    assert samples[("llmtap_sync_latency_seconds_count", ())] == 4
    assert samples[("llmtap_calls_in_flight", ())] == 0
    assert samples[("llmtap_capture_events_total", (("event", "records_written"),))] == 4
    assert len(read_model_call_records(CaptureStore(tmp_path / "calls", create=False), "r-1")) == 4  # /metrics was not captured


def test_a_key_pasted_into_a_prompt_never_lands_on_disk_with_redact_true(
    fault_upstream: FaultUpstream, tmp_path: Path
) -> None:
    rng = random.Random(7)
    key = "sk-proj-" + "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(48))
    prompt = f"My key is {key}, please remember it."
    with serving(fault_upstream.url("ok"), tmp_path / "calls", redact=True) as (server, health):
        answers = [_chat(server.base_url, "r-1", content=prompt), _chat(server.base_url, "r-1", content=prompt, stream=True)]
    assert all(answers)
    assert all(key in request.body.decode() for request in fault_upstream.received[-2:])  # the workload is unchanged
    on_disk = b"".join(path.read_bytes() for path in (tmp_path / "calls").iterdir())
    assert key.encode() not in on_disk and key[8:30].encode() not in on_disk
    records = read_model_call_records(CaptureStore(tmp_path / "calls", create=False), "r-1")
    assert len(records) == 2
    assert records[0].request is not None
    assert "[REDACTED:openai-project-key]" in records[0].request["messages"][0]["content"]
    assert health.snapshot()["records_redacted"] == 2


def test_without_redact_the_record_keeps_the_prompt_as_sent(fault_upstream: FaultUpstream, tmp_path: Path) -> None:
    key = "sk-proj-" + "A1b2" * 12
    with serving(fault_upstream.url("ok"), tmp_path / "calls") as (server, _):
        _chat(server.base_url, "r-1", content=f"key {key}")
    (record,) = read_model_call_records(CaptureStore(tmp_path / "calls", create=False), "r-1")
    assert record.request is not None and key in record.request["messages"][0]["content"]


@pytest.mark.parametrize(
    ("settings", "env", "expected"),
    [
        ({}, {}, (False, None)),
        ({"otlp_endpoint": "http://127.0.0.1:4318"}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:1"}, (True, "http://127.0.0.1:4318")),
        ({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, (True, None)),
        ({}, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, (True, None)),
    ],
)
def test_live_export_follows_the_config_key_then_the_standard_variables(
    settings: dict[str, str], env: dict[str, str], expected: tuple[bool, str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = load_serve_config(settings={"upstreams": {"a": {"base_url": "http://127.0.0.1:9"}}, **settings})
    assert config.live_export_endpoint() == expected


def test_the_standard_variable_alone_exports_to_its_collector(
    fault_upstream: FaultUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url.removesuffix("/v1/traces"))
        with serving(fault_upstream.url("ok"), tmp_path / "calls") as (server, _):
            answer = _chat(server.base_url, "r-1")
            _wait_for(lambda: len(receiver.spans()) == 1)
        [(_resource, span)] = receiver.spans()
    assert answer
    (record,) = read_model_call_records(CaptureStore(tmp_path / "calls", create=False), "r-1")
    attributes = attributes_of(span)
    assert (attributes[names.ROLLOUT_ID], attributes[names.MODEL_CALL_ID]) == ("r-1", record.model_call_id)
    assert attributes[names.RESPONSE_ID] == record.response_id


@pytest.mark.parametrize("endpoint", ["ftp://127.0.0.1:4318", "not a url", "http://"])
def test_an_otlp_endpoint_that_is_not_an_http_url_is_refused_at_start(endpoint: str) -> None:
    from llmtap.errors import ConfigError

    with pytest.raises(ConfigError, match="otlp_endpoint"):
        load_serve_config(settings={"upstreams": {"a": {"base_url": "http://127.0.0.1:9"}}, "otlp_endpoint": endpoint})


def test_observe_commit_renders_exactly_what_observe_call_and_observe_sync_latency_do() -> None:
    """The commit path's one-call form of the two observations: the scraped text is the same."""
    from llmtap.export.prometheus import ServeMetrics

    calls = [("chat", 200, None, 0.8, 0.0004), ("chat", 200, None, 2.0, 0.002), ("messages", 529, "overloaded", None, 0.01),
             ("chat", 200, None, 0.01, 0.0001), ("bogus", 99, "weird", 1.5, 0.3)]
    combined, separate = ServeMetrics(), ServeMetrics()
    for dialect, status, category, latency, sync in calls:
        combined.observe_commit(dialect, status, category, latency, sync)
        separate.observe_call(dialect, status, category, latency_seconds=latency)
        separate.observe_sync_latency(sync)
    rendered = {name: _samples(metrics.render().decode()) for name, metrics in (("combined", combined), ("separate", separate))}
    created = {key for key in rendered["separate"] if key[0].endswith("_created")}
    assert {k: v for k, v in rendered["combined"].items() if k not in created} == {
        k: v for k, v in rendered["separate"].items() if k not in created
    }
    assert rendered["combined"][("llmtap_sync_latency_seconds_count", ())] == 5
    assert rendered["combined"][("llmtap_calls_total", (("dialect", "other"), ("error_category", "other"), ("status_class", "none")))] == 1
