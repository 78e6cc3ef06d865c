"""`GET /llmtap/metrics`: serve's Prometheus metrics, answered like `/llmtap/health` and never captured.

The middleware answers it before any capture work (no dialect owns `/llmtap/`), in the text
format `export.prometheus.CONTENT_TYPE` names, from `ServeMetrics.render()`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .asgi import Send

if TYPE_CHECKING:
    from ..export.prometheus import ServeMetrics

__all__ = ["METRICS_PATH", "send_metrics"]

METRICS_PATH = "/llmtap/metrics"


async def send_metrics(send: Send, metrics: ServeMetrics, *, head_only: bool = False) -> None:
    """Send every metric as a 200 in the Prometheus text format, never cached by a client."""
    from ..export.prometheus import CONTENT_TYPE

    payload = metrics.render()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", CONTENT_TYPE.encode("latin-1")),
                (b"content-length", str(len(payload)).encode("ascii")),
                (b"cache-control", b"no-store"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": b"" if head_only else payload, "more_body": False})
