"""`ServeMetrics`: the text it renders, parsed by prometheus_client's own parser, matches what was observed."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from llmtap import CaptureStore, read_model_call_records
from llmtap.export.live import DROP_REASONS
from llmtap.export.prometheus import CONTENT_TYPE, ServeMetrics
from llmtap.health import CaptureHealth

Store = tuple[Path, dict[str, list[str]]]


def _samples(metrics: ServeMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_calls_by_dialect_status_class_and_category_match_the_records(fixture_store: Store) -> None:
    root, _ = fixture_store
    metrics = ServeMetrics()
    expected: dict[tuple[str, str, str], int] = {}
    latencies = 0.0
    store = CaptureStore(root, create=False)
    for rollout_id in store.rollouts():
        for record in read_model_call_records(store, rollout_id):
            metrics.call_started()
            metrics.observe_call(
                record.dialect,
                record.status_code,
                record.error_category,
                latency_seconds=record.latency_total_ms / 1000.0,
                record_bytes=1000,
            )
            metrics.call_finished()
            assert record.status_code is not None
            key = (record.dialect or "", f"{record.status_code // 100}xx", record.error_category or "none")
            expected[key] = expected.get(key, 0) + 1
            latencies += record.latency_total_ms / 1000.0
    samples = _samples(metrics)
    calls = {
        (labels[0][1], labels[2][1], labels[1][1]): value
        for (name, labels), value in samples.items()
        if name == "llmtap_calls_total"
    }
    assert calls == expected
    assert ("2xx" in {key[1] for key in expected}) and ("4xx" in {key[1] for key in expected})
    count = sum(v for (name, _), v in samples.items() if name == "llmtap_call_latency_seconds_count")
    total = sum(v for (name, _), v in samples.items() if name == "llmtap_call_latency_seconds_sum")
    assert count == 84 and abs(total - latencies) < 1e-6
    assert samples[("llmtap_record_size_bytes_count", ())] == 84
    assert samples[("llmtap_record_size_bytes_bucket", (("le", "1000.0"),))] == 84
    assert samples[("llmtap_calls_in_flight", ())] == 0


def test_every_metric_the_issue_lists_is_exposed_before_any_call() -> None:
    metrics = ServeMetrics(health=CaptureHealth())
    names = {family.name for family in text_string_to_metric_families(metrics.render().decode())}
    assert {
        "llmtap_calls",
        "llmtap_capture_failures",
        "llmtap_record_size_bytes",
        "llmtap_sync_latency_seconds",
        "llmtap_call_latency_seconds",
        "llmtap_calls_in_flight",
        "llmtap_otlp_spans_exported",
        "llmtap_otlp_spans_dropped",
        "llmtap_capture_events",
    } <= names
    samples = _samples(metrics)
    for reason in DROP_REASONS:
        assert samples[("llmtap_otlp_spans_dropped_total", (("reason", reason),))] == 0
    assert CONTENT_TYPE.startswith("text/plain")


def test_failures_sync_latency_in_flight_and_spans() -> None:
    health = CaptureHealth()
    metrics = ServeMetrics(health=health)
    metrics.observe_capture_failure("record_write_failed")
    metrics.observe_capture_failure("record_write_failed")
    metrics.observe_capture_failure("stream_record_dropped")
    health.count("records_written", 5)
    health.failure("record_build_failed", "asgi", ValueError())
    for seconds in (0.0002, 0.003, 0.2):
        metrics.observe_sync_latency(seconds)
    metrics.call_started()
    metrics.call_started()
    metrics.call_finished()
    metrics.observe_spans_exported(7)
    metrics.observe_spans_dropped(3, "queue_full")
    samples = _samples(metrics)
    assert samples[("llmtap_capture_failures_total", (("kind", "record_write_failed"),))] == 2
    assert samples[("llmtap_capture_failures_total", (("kind", "stream_record_dropped"),))] == 1
    assert samples[("llmtap_capture_events_total", (("event", "records_written"),))] == 5
    assert samples[("llmtap_capture_events_total", (("event", "record_build_failed"),))] == 1
    assert samples[("llmtap_sync_latency_seconds_count", ())] == 3
    assert samples[("llmtap_sync_latency_seconds_bucket", (("le", "0.0005"),))] == 1
    assert samples[("llmtap_sync_latency_seconds_bucket", (("le", "0.005"),))] == 2
    assert samples[("llmtap_calls_in_flight", ())] == 1
    assert samples[("llmtap_otlp_spans_exported_total", ())] == 7
    assert samples[("llmtap_otlp_spans_dropped_total", (("reason", "queue_full"),))] == 3


def test_label_values_a_client_could_choose_are_folded_so_series_stay_bounded() -> None:
    metrics = ServeMetrics()
    for number in range(50):
        metrics.observe_call(f"dialect-{number}", 200 + number, f"category-{number}")
        metrics.observe_capture_failure(f"kind with spaces {number}\n")
        metrics.observe_spans_dropped(1, f"reason-{number}")
    samples = _samples(metrics)
    calls = [labels for (name, labels), _ in samples.items() if name == "llmtap_calls_total"]
    assert {dict(labels)["dialect"] for labels in calls} == {"other"}
    assert {dict(labels)["error_category"] for labels in calls} == {"other"}
    assert {dict(labels)["status_class"] for labels in calls} == {"2xx"}
    assert samples[("llmtap_capture_failures_total", (("kind", "other"),))] == 50
    assert samples[("llmtap_otlp_spans_dropped_total", (("reason", "other"),))] == 50
