"""`export_otlp`: every recorded fixture as one span, decoded by a real OTLP/HTTP receiver."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmtap import CaptureStore, read_model_call_records
from llmtap.dialects.history import request_items, response_items
from llmtap.export import attributes as names
from llmtap.export.otlp import export_otlp, traces_endpoint
from llmtap.export.sources import ExportError
from llmtap.export.spans import span_id_for_call, trace_id_for_rollout
from llmtap.records import ModelCallRecord
from tests.export.support import attributes_of, free_port_url, otlp_receiver

Store = tuple[Path, dict[str, list[str]]]


def _records(root: Path) -> dict[str, tuple[str, ModelCallRecord]]:
    store = CaptureStore(root, create=False)
    return {
        record.model_call_id: (rollout_id, record)
        for rollout_id in store.rollouts()
        for record in read_model_call_records(store, rollout_id)
    }


def _finish_reasons(record: ModelCallRecord) -> list[str] | None:
    """The provider's reason; a completed Responses call (no raw reason) falls back to the normalized one."""
    if record.finish_reason is not None:
        return [record.finish_reason]
    if record.finish_reason_normalized is None:
        return None
    return ["tool_call" if record.finish_reason_normalized == "tool_calls" else record.finish_reason_normalized]


def _expected(record: ModelCallRecord) -> dict[str, Any]:
    """The attributes each record must produce, read from the record itself (absent when unknown)."""
    request = record.request or {}
    expected: dict[str, Any] = {
        names.OPERATION_NAME: "chat",
        names.PROVIDER_NAME: "anthropic" if record.dialect == "messages" else "openai",
        names.REQUEST_MODEL: request.get("model"),
        names.RESPONSE_ID: record.response_id,
        names.RESPONSE_MODEL: (record.response or {}).get("model"),
        names.RESPONSE_FINISH_REASONS: _finish_reasons(record),
        names.USAGE_INPUT_TOKENS: record.tokens_in,
        names.USAGE_OUTPUT_TOKENS: record.tokens_out,
        names.USAGE_CACHE_READ_INPUT_TOKENS: record.cached_tokens,
        names.USAGE_CACHE_CREATION_INPUT_TOKENS: record.cache_creation_tokens,
        names.USAGE_REASONING_OUTPUT_TOKENS: record.tokens_reasoning,
        names.ERROR_TYPE: record.error_category,
        names.HTTP_RESPONSE_STATUS_CODE: record.status_code,
        names.MODEL_CALL_ID: record.model_call_id,
        names.CALL_INDEX: record.call_index,
        names.DIALECT: record.dialect,
    }
    if isinstance(request.get("temperature"), (int, float)):
        expected[names.REQUEST_TEMPERATURE] = request["temperature"]
    return {key: value for key, value in expected.items() if value is not None}


def test_every_fixture_becomes_one_span_with_the_records_attributes(fixture_store: Store) -> None:
    root, _ = fixture_store
    records = _records(root)
    with otlp_receiver() as receiver:
        report = export_otlp(root, endpoint=receiver.url, content=False, batch_size=10)
    assert report.ok and report.exported == len(records) == 84 and report.batches == 9
    spans = receiver.spans()
    assert len(spans) == len(records)
    for resource, span in spans:
        attributes = attributes_of(span)
        rollout_id, record = records[attributes[names.MODEL_CALL_ID]]
        assert attributes[names.ROLLOUT_ID] == rollout_id
        for key, value in _expected(record).items():
            assert attributes[key] == value, (record.model_call_id, key)
        for field_name, name in (("tokens_in", names.USAGE_INPUT_TOKENS), ("response_id", names.RESPONSE_ID)):
            if getattr(record, field_name) is None:
                assert name not in attributes  # unknown stays absent, never 0
        assert names.INPUT_MESSAGES not in attributes and names.OUTPUT_MESSAGES not in attributes
        model = (record.request or {}).get("model") or record.model
        assert span.name == f"chat {model}"
        assert span.kind == span.SPAN_KIND_CLIENT
        assert span.start_time_unix_nano == round(record.started_at * 1e9)
        assert span.end_time_unix_nano == round(record.completed_at * 1e9)
        assert span.parent_span_id == b""
        if record.error_category is None:
            assert span.status.code == span.status.STATUS_CODE_UNSET
        else:
            assert span.status.code == span.status.STATUS_CODE_ERROR
            assert span.status.message == record.error_category
        resource_attributes = {a.key: a.value.string_value for a in resource.attributes}
        assert resource_attributes["service.name"] == "llmtap"
    # Errors are in the fixtures: 400s, 401s, 404s and incomplete responses.
    categories = {attributes_of(span).get(names.ERROR_TYPE) for _, span in spans}
    assert {"client_error", "auth", "not_found", "incomplete"} <= categories
    assert any(names.USAGE_INPUT_TOKENS not in attributes_of(span) for _, span in spans)


def test_one_trace_per_rollout_and_ids_derived_from_the_store(fixture_store: Store) -> None:
    root, rollouts = fixture_store
    with otlp_receiver() as receiver:
        export_otlp(root, endpoint=receiver.url)
    by_trace: dict[bytes, set[str]] = {}
    for _, span in receiver.spans():
        attributes = attributes_of(span)
        rollout_id = attributes[names.ROLLOUT_ID]
        assert span.trace_id == trace_id_for_rollout(rollout_id).to_bytes(16, "big")
        assert span.span_id == span_id_for_call(attributes[names.MODEL_CALL_ID]).to_bytes(8, "big")
        by_trace.setdefault(span.trace_id, set()).add(rollout_id)
    assert len(by_trace) == len(rollouts)
    assert all(len(found) == 1 for found in by_trace.values())


def test_re_export_sends_identical_spans(fixture_store: Store) -> None:
    root, _ = fixture_store
    with otlp_receiver() as first, otlp_receiver() as second:
        export_otlp(root, endpoint=first.url)
        export_otlp(root, endpoint=second.url)
    def key(pair: tuple[Any, Any]) -> bytes:
        return bytes(pair[1].span_id)

    sent_first = sorted(first.spans(), key=key)
    sent_second = sorted(second.spans(), key=key)
    assert [span.SerializeToString(deterministic=True) for _, span in sent_first] == [
        span.SerializeToString(deterministic=True) for _, span in sent_second
    ]


def test_message_content_only_with_the_switch(fixture_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = fixture_store
    records = _records(root)
    monkeypatch.setenv(names.CONTENT_SWITCH_ENV, "True")
    with otlp_receiver() as receiver:
        export_otlp(root, endpoint=receiver.url)
    with_content = 0
    for _, span in receiver.spans():
        attributes = attributes_of(span)
        _, record = records[attributes[names.MODEL_CALL_ID]]
        inputs = request_items(record.dialect, record.request) or []
        outputs = response_items(record.dialect, record.response) or []
        if inputs:
            messages = json.loads(attributes[names.INPUT_MESSAGES])
            texts = [part.get("content") for message in messages for part in message["parts"] if part["type"] == "text"]
            assert [item["text"] or "" for item in inputs if item["type"] == "message"] == texts
            with_content += 1
        if outputs:
            messages = json.loads(attributes[names.OUTPUT_MESSAGES])
            calls = [part["name"] for message in messages for part in message["parts"] if part["type"] == "tool_call"]
            assert calls == [item["name"] for item in outputs if item["type"] == "tool_call"]
            roles = [item.get("role") or "assistant" for item in outputs]
            assert {message["role"] for message in messages} == set(roles)
    assert with_content >= 60
    monkeypatch.setenv(names.CONTENT_SWITCH_ENV, "false")
    with otlp_receiver() as receiver:
        export_otlp(root, endpoint=receiver.url)
    assert all(names.INPUT_MESSAGES not in attributes_of(span) for _, span in receiver.spans())


def test_standard_variables_choose_endpoint_headers_and_resource(
    fixture_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = fixture_store
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-team=rl,x-cluster=a1")
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=train")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "trainer-proxy")
        report = export_otlp(root)
    assert report.ok and report.exported == 84
    assert receiver.headers[0]["x-team"] == "rl" and receiver.headers[0]["x-cluster"] == "a1"
    resource, _ = receiver.spans()[0]
    resource_attributes = {a.key: a.value.string_value for a in resource.attributes}
    assert resource_attributes["service.name"] == "trainer-proxy"
    assert resource_attributes["deployment.environment"] == "train"


@pytest.mark.parametrize("status", [500, 400])
def test_a_collector_that_fails_stops_the_export_and_counts_what_was_not_sent(fixture_store: Store, status: int) -> None:
    root, _ = fixture_store
    with otlp_receiver(status=status) as receiver:
        report = export_otlp(root, endpoint=receiver.url, batch_size=20, timeout=0.5)
    assert not report.ok
    assert report.exported == 0 and report.failed == 20 and report.not_sent == 64
    assert report.errors and "not accepted" in report.errors[0]


def test_a_collector_that_is_down_fails_with_counts(fixture_store: Store) -> None:
    root, _ = fixture_store
    report = export_otlp(root, endpoint=free_port_url(), batch_size=50, timeout=0.5)
    assert (report.exported, report.failed, report.not_sent) == (0, 50, 34)


def test_a_capsule_is_read_through_its_calls_directory(fixture_store: Store, tmp_path: Path) -> None:
    root, _ = fixture_store
    capsule = tmp_path / "run"
    capsule.mkdir()
    (capsule / "capsule.json").write_text("{}")
    (capsule / "calls").symlink_to(root)  # a link to calls/ is refused: nothing is read through it
    with pytest.raises(ExportError):
        export_otlp(capsule / "calls", endpoint="http://127.0.0.1:9")
    (capsule / "calls").unlink()
    import shutil

    shutil.copytree(root, capsule / "calls")
    with otlp_receiver() as receiver:
        report = export_otlp(capsule, endpoint=receiver.url)
    assert report.ok and report.exported == 84


def test_endpoint_forms() -> None:
    assert traces_endpoint("http://c:4318") == "http://c:4318/v1/traces"
    assert traces_endpoint("http://c:4318/") == "http://c:4318/v1/traces"
    assert traces_endpoint("https://c/otlp/v1/traces") == "https://c/otlp/v1/traces"
    assert traces_endpoint(None) is None
    with pytest.raises(ExportError):
        traces_endpoint("c:4318")


def test_large_message_content_splits_batches_by_size(fixture_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = fixture_store
    import llmtap.export.otlp as otlp_module

    monkeypatch.setattr(otlp_module, "MAX_BATCH_BYTES", 20_000)
    with otlp_receiver() as receiver:
        report = export_otlp(root, endpoint=receiver.url, content=True)
    assert report.ok and report.exported == 84 and report.batches > 3
    assert len(receiver.requests) == report.batches
    for request in receiver.requests:
        spans = [span for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]
        weights = [
            1024 + sum(len(attributes_of(span).get(name, "")) for name in (names.INPUT_MESSAGES, names.OUTPUT_MESSAGES))
            for span in spans
        ]
        assert sum(weights[:-1]) < 20_000  # a batch closes at the span that reaches the bound
