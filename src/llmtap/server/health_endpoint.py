"""`GET /llmtap/health`: what an operator or a load balancer asks a capturing server.

The answer is JSON, never captured, and outside every model path (no dialect owns `/llmtap/`):

    {"ready": true, "capture": {"enabled": true, "dir": "/abs/model-calls", "dir_writable": true},
     "records_written": 12, "capture_failures": {"record_write_failed": 1}, "capture_failures_total": 1,
     "sync_latency_ms": {"p50": 0.41, "p99": 3.2, "samples": 12}, "in_flight": 3, "counts": {...},
     "otlp_export": {"exported": 10, "queued": 2, "dropped": {"queue_full": 0, "export_failed": 0, ...},
                     "dropped_total": 0, ...}}

`ready` is false when capture is on and its directory is gone or no longer writable: calls would
still be served, but not recorded. Null means unknown: the latencies are null before any sync, and `otlp_export` is null when serve
exports no spans (no `otlp_endpoint`). `/llmtap/metrics` (`metrics_endpoint`) is routed the same way.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from ..health import CaptureHealth
from .asgi import Send

__all__ = ["HEALTH_PATH", "health_report", "send_health"]

HEALTH_PATH = "/llmtap/health"


def health_report(
    health: CaptureHealth, capture_dir: Path | None, in_flight: int, *, otlp_export: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Return the health document for a server capturing into `capture_dir` (None: capture off).

    `otlp_export` is the live exporter's `counts()`, when serve exports spans.
    """
    writable = None if capture_dir is None else _writable_directory(capture_dir)
    failures = health.failures()
    counts = health.snapshot()
    return {
        "ready": writable is not False,
        "capture": {
            "enabled": capture_dir is not None,
            "dir": None if capture_dir is None else str(capture_dir),
            "dir_writable": writable,
        },
        "records_written": counts.get("records_written", 0),
        "capture_failures": failures,
        "capture_failures_total": sum(failures.values()),
        "sync_latency_ms": health.sync_latency_ms(),
        "in_flight": in_flight,
        "counts": counts,
        "otlp_export": None if otlp_export is None else {
            **otlp_export, "dropped_total": sum(otlp_export.get("dropped", {}).values())
        },
    }


def _writable_directory(path: Path) -> bool:
    # A cheap check (two system calls) that the directory the store writes into is still there.
    return path.is_dir() and not path.is_symlink() and os.access(path, os.W_OK | os.X_OK)


async def send_health(send: Send, report: dict[str, Any], *, head_only: bool = False) -> None:
    """Send the report as a 200 JSON response (503 when not ready), never cached by a client."""
    payload = orjson.dumps(report)
    await send(
        {
            "type": "http.response.start",
            "status": 200 if report["ready"] else 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode("ascii")),
                (b"cache-control", b"no-store"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": b"" if head_only else payload, "more_body": False})
