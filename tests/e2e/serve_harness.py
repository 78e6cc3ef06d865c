"""Start `llmtap serve` (in-process, on loopback) in front of a test upstream."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from llmtap.health import CaptureHealth
from llmtap.server.config import load_serve_config
from llmtap.server.proxy import build_app
from llmtap.store import CaptureStore
from tests.support.servers import ServerThread


@contextmanager
def serving(upstream_url: str, capture_dir: Path | None, **settings: Any) -> Iterator[tuple[ServerThread, CaptureHealth]]:
    """Yield a running proxy to `upstream_url`, capturing into `capture_dir` (None: capture off)."""
    config = load_serve_config(
        settings={
            "upstreams": {"default": {"base_url": upstream_url, "model_ref": {"type": "responses_api_models", "name": "policy"},
                                      **settings.pop("upstream", {})}},
            "observability_enabled": capture_dir is not None,
            "model_call_capture_dir": str(capture_dir) if capture_dir is not None else None,
            **settings,
        }
    )
    health = CaptureHealth()
    store = CaptureStore(capture_dir) if capture_dir is not None else None
    # lifespan on: the proxy closes its upstream connection pool at shutdown.
    server = ServerThread(build_app(config, store=store, health=health), lifespan="on")
    with server.start():
        yield server, health
    if store is not None:
        store.close()
