"""`LiveExporter`: a bounded background queue in front of a real loopback OTLP receiver."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmtap import CaptureStore, read_model_call_records
from llmtap.export import attributes as names
from llmtap.export.live import LiveExporter
from llmtap.export.otlp import span_exporter
from llmtap.export.prometheus import ServeMetrics
from llmtap.export.spans import span_attributes
from tests.export.support import attributes_of, free_port_url, otlp_receiver

Store = tuple[Path, dict[str, list[str]]]


def _lines(root: Path) -> list[dict[str, Any]]:
    store = CaptureStore(root, create=False)
    return [line for rollout_id in store.rollouts() for _, line in store.read(rollout_id).entries]


def _dropped(metrics: ServeMetrics) -> dict[str, float]:
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        if family.name == "llmtap_otlp_spans_dropped":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    found[sample.labels["reason"]] = sample.value
    return found


def test_every_submitted_line_arrives_as_the_span_the_batch_export_sends(fixture_store: Store) -> None:
    root, _ = fixture_store
    lines = _lines(root)
    metrics = ServeMetrics()
    with otlp_receiver() as receiver:
        live = LiveExporter(span_exporter(receiver.url), batch_size=16, flush_interval=0.05, counter=metrics).start()
        assert all(live.submit(line) for line in lines)
        live.close(timeout=10)
    counts = live.counts()
    assert counts["submitted"] == counts["exported"] == len(lines) == 84
    assert sum(counts["dropped"].values()) == 0
    received = {attributes_of(span)[names.MODEL_CALL_ID]: attributes_of(span) for _, span in receiver.spans()}
    store = CaptureStore(root, create=False)
    for rollout_id in store.rollouts():
        for record in read_model_call_records(store, rollout_id):
            expected = span_attributes(record, rollout_id)
            expected.pop(names.CALL_INDEX)  # a live call has no reader's index yet
            assert received[record.model_call_id] == expected
    exported = [f for f in text_string_to_metric_families(metrics.render().decode()) if f.name == "llmtap_otlp_spans_exported"]
    assert exported[0].samples[0].value == 84


def test_records_read_from_the_store_can_be_submitted_too(fixture_store: Store) -> None:
    root, rollouts = fixture_store
    store = CaptureStore(root, create=False)
    rollout_id = next(iter(rollouts))
    records = read_model_call_records(store, rollout_id)
    with otlp_receiver() as receiver:
        live = LiveExporter(span_exporter(receiver.url), flush_interval=0.05).start()
        for record in records:
            live.submit(record, rollout_id)
        live.close()
    assert [attributes_of(span)[names.CALL_INDEX] for _, span in receiver.spans()] == [r.call_index for r in records]


@pytest.mark.parametrize("collector", ["down", "500"])
def test_a_collector_that_is_down_or_failing_loses_the_spans_counted_and_logs_once(
    fixture_store: Store, collector: str, caplog: pytest.LogCaptureFixture
) -> None:
    root, _ = fixture_store
    lines = _lines(root)
    metrics = ServeMetrics()
    caplog.set_level(logging.WARNING, logger="llmtap.export")
    with otlp_receiver(status=500) as receiver:
        url = free_port_url() if collector == "down" else receiver.url
        live = LiveExporter(span_exporter(url, timeout=0.5), batch_size=10, flush_interval=0.05, counter=metrics).start()
        accepted = sum(live.submit(line) for line in lines)
        live.close(timeout=30)
    counts = live.counts()
    assert accepted == counts["submitted"] == 84
    assert counts["exported"] == 0 and counts["dropped"]["export_failed"] == 84
    assert counts["failed_batches"] == counts["batches"] == 9
    assert _dropped(metrics)["export_failed"] == 84
    warnings = [r for r in caplog.records if r.name == "llmtap.export"]
    assert len(warnings) == 1 and "export_failed" in warnings[0].getMessage()


def test_a_slow_collector_never_holds_the_caller_and_the_queue_stays_bounded(fixture_store: Store) -> None:
    root, _ = fixture_store
    lines = _lines(root)
    metrics = ServeMetrics()
    with otlp_receiver(delay=2.0) as receiver:
        live = LiveExporter(
            span_exporter(receiver.url, timeout=5), max_queue=4, batch_size=2, flush_interval=0.05, counter=metrics
        ).start()
        results = [live.submit(line) for line in lines]
        # Every submit has returned while the collector is still sitting on its first request.
        assert receiver.requests == []
        counts = live.counts()
        assert counts["queued"] <= 4
        live.close(timeout=0.1)
    counts = live.counts()
    assert results.count(True) == counts["submitted"] <= 4 + 2  # the queue, plus one batch taken off it
    assert counts["dropped"]["queue_full"] == results.count(False) >= 84 - 6
    assert _dropped(metrics)["queue_full"] == results.count(False)
    settled = counts["exported"] + counts["dropped"]["export_failed"] + counts["dropped"]["closed"]
    assert counts["submitted"] == settled + counts["queued"] + counts["exporting"]


def test_submit_after_close_is_dropped_not_raised(fixture_store: Store) -> None:
    root, _ = fixture_store
    live = LiveExporter(span_exporter(free_port_url(), timeout=0.2)).start()
    live.close()
    assert live.submit(_lines(root)[0]) is False
    assert live.counts()["dropped"]["closed"] == 1


def test_a_line_without_rollout_or_times_is_dropped_and_the_worker_goes_on(fixture_store: Store) -> None:
    root, _ = fixture_store
    good = _lines(root)[0]
    with otlp_receiver() as receiver:
        live = LiveExporter(span_exporter(receiver.url), flush_interval=0.05).start()
        live.submit({k: v for k, v in good.items() if k != "rollout_id"})
        live.submit({"model_call_id": "x", "rollout_id": "r"})  # no times: nothing to place a span at
        live.submit({"not": "a record"})
        live.submit(good)
        live.close()
    counts = live.counts()
    assert counts["dropped"]["no_rollout"] == 1 and counts["dropped"]["unreadable"] == 2
    assert counts["exported"] == 1 and len(receiver.spans()) == 1


def test_submits_from_many_threads_are_all_accounted_for(fixture_store: Store) -> None:
    root, _ = fixture_store
    lines = _lines(root)
    with otlp_receiver() as receiver:
        live = LiveExporter(span_exporter(receiver.url), max_queue=50, batch_size=25, flush_interval=0.05).start()
        threads = [threading.Thread(target=lambda: [live.submit(line) for line in lines]) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        live.close(timeout=10)
    counts = live.counts()
    assert counts["submitted"] + counts["dropped"]["queue_full"] == 4 * 84
    assert counts["exported"] == counts["submitted"] == len(receiver.spans())


def test_large_content_is_sent_in_requests_bounded_by_size(fixture_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = fixture_store
    import llmtap.export.live as live_module

    monkeypatch.setattr(live_module, "MAX_BATCH_BYTES", 20_000)
    with otlp_receiver() as receiver:
        live = LiveExporter(span_exporter(receiver.url), batch_size=84, flush_interval=0.05, content=True).start()
        for line in _lines(root):
            live.submit(line)
        live.close(timeout=10)
    assert live.counts()["exported"] == 84 and len(receiver.spans()) == 84
    assert len(receiver.requests) > 3
