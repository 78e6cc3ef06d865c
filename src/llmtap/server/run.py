"""Running `llmtap serve` under uvicorn."""

from __future__ import annotations

import importlib.util
import sys

import uvicorn

from .config import ServeConfig
from .proxy import build_app

__all__ = ["run_server", "uvicorn_config"]


def uvicorn_config(config: ServeConfig) -> uvicorn.Config:
    """Return the uvicorn settings llmtap serves with (fast HTTP parser when installed, no access log)."""
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return uvicorn.Config(
        build_app(config),
        host=config.host,
        port=config.port,
        http=http,
        lifespan="on",
        access_log=False,
        log_level=config.log_level,
        timeout_keep_alive=75,
    )


def run_server(config: ServeConfig) -> None:
    """Serve until interrupted, printing where it listens and where it captures."""
    capture = config.model_call_capture_dir if config.observability_enabled else "off"
    upstreams = ", ".join(f"{name}={u.base_url}" for name, u in config.upstreams.items())
    print(
        f"llmtap serve on http://{config.host}:{config.port}  upstreams: {upstreams}  capture: {capture}",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.Server(uvicorn_config(config)).run()
