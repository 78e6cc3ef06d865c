"""A capture directory built from every recorded fixture, and a loopback OTLP/HTTP receiver."""

from __future__ import annotations

import gzip
import http.server
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from llmtap.exchange import Exchange
from llmtap.records import raw_line_from_exchange
from llmtap.store import CaptureStore
from tests.fixtures import RecordedExchange, all_fixtures

BASE_TIME = 1_767_225_600.0  # 2026-01-01T00:00:00Z: every call's start is fixed, so rows compare exactly


def rollout_of(index: int, recorded: RecordedExchange) -> str:
    """Fixtures spread over one rollout per dialect and pair of fixtures, so rollouts hold several calls."""
    return f"{recorded.dialect}-{index // 2}"


def line_for(recorded: RecordedExchange, *, call_id: str, rollout_id: str, started_at: float) -> dict[str, Any]:
    """The persisted line of one recorded exchange, through the real capture pipeline."""
    exchange = Exchange(
        method="POST",
        path=recorded.request_path,
        request_body=json.dumps(recorded.request_json).encode(),
        model_call_id=call_id,
        rollout_id=rollout_id,
        model_ref={"type": "responses_api_models", "name": "policy_model"},
    )
    exchange.started_at = started_at
    exchange.status_code = recorded.status
    exchange.response_headers = {"content-type": recorded.content_type}
    body = recorded.body_bytes
    step = max(1, len(body) // 3)
    for start in range(0, len(body), step):
        exchange.add_response_chunk(body[start : start + step])
    exchange.finish()
    return raw_line_from_exchange(exchange)


def build_fixture_store(root: Path) -> dict[str, list[str]]:
    """Append every recorded fixture to a capture store at `root`; return rollout id -> call ids."""
    rollouts: dict[str, list[str]] = {}
    per_dialect: dict[str, int] = {}
    with CaptureStore(root) as store:
        for number, recorded in enumerate(all_fixtures()):
            index = per_dialect.get(recorded.dialect, 0)
            per_dialect[recorded.dialect] = index + 1
            rollout_id = rollout_of(index, recorded)
            call_id = f"mc-{number:03d}"
            # Spread the calls over two days and many hours, so date partitions and hourly queries have work.
            line = line_for(recorded, call_id=call_id, rollout_id=rollout_id, started_at=BASE_TIME + number * 1500.0)
            store.append(rollout_id, line)
            rollouts.setdefault(rollout_id, []).append(call_id)
    return rollouts


@dataclass
class Receiver:
    """What the loopback collector received, and how it answers."""

    status: int = 200
    delay: float = 0.0
    requests: list[ExportTraceServiceRequest] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def spans(self) -> list[tuple[Any, Any]]:
        """Every received span with its resource, in arrival order."""
        with self.lock:
            found = []
            for request in self.requests:
                for resource_spans in request.resource_spans:
                    for scope_spans in resource_spans.scope_spans:
                        for span in scope_spans.spans:
                            found.append((resource_spans.resource, span))
            return found


def attributes_of(span: Any) -> dict[str, Any]:
    """A decoded span's attributes as plain Python values."""
    values: dict[str, Any] = {}
    for attribute in span.attributes:
        values[attribute.key] = _value(attribute.value)
    return values


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None


@contextmanager
def otlp_receiver(*, status: int = 200, delay: float = 0.0) -> Iterator[Receiver]:
    """Serve OTLP/HTTP protobuf at http://127.0.0.1:<port>/v1/traces, decoding every request."""
    receiver = Receiver(status=status, delay=delay)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # the http.server hook name
            length = int(self.headers.get("content-length", "0"))
            body = self.rfile.read(length)
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            if receiver.delay:
                time.sleep(receiver.delay)
            if self.path != "/v1/traces" or receiver.status != 200:
                self.send_response(404 if self.path != "/v1/traces" else receiver.status)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            with receiver.lock:
                receiver.requests.append(request)
                receiver.headers.append({key.lower(): value for key, value in self.headers.items()})
            payload = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:  # a quiet test server
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def free_port_url() -> str:
    """The URL of a loopback port nothing listens on (a collector that is down)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"
