"""`llmtap serve --capsule`: the capturing proxy recording into a run capsule, for non-Python agents.

The proxy app is the one `llmtap serve` builds (`server.proxy.build_app`), given a store rooted at
the capsule's `calls/`. Calls that carry no `/ng-rollout/<id>` prefix are filed under the
rollout `default`, the same rule as in-process capture: a thin ASGI shim in front adds that
prefix to dialect paths before the capture middleware strips it again. The capsule is finalised
when the server stops (Ctrl-C or SIGTERM end a server normally, so the status is `success`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ..correlation.ids import ROLLOUT_PREFIX, validate_rollout_id
from .asgi import ASGIApp, Receive, Scope, Send

__all__ = ["DefaultRolloutPrefix", "serve_into_capsule"]

class DefaultRolloutPrefix:
    """ASGI shim: gives un-prefixed dialect calls the `/ng-rollout/<default>` prefix."""

    def __init__(self, app: ASGIApp, *, rollout_id: str = "default") -> None:
        self.app = app
        self.prefix = f"{ROLLOUT_PREFIX}{validate_rollout_id(rollout_id)}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from ..dialects import dialect_for_path

        path = scope.get("path", "")
        if scope["type"] == "http" and not path.startswith(ROLLOUT_PREFIX) and dialect_for_path(path) is not None:
            raw_path = scope.get("raw_path") or path.encode("utf-8")
            scope = {**scope, "path": self.prefix + path, "raw_path": self.prefix.encode("ascii") + raw_path}
        await self.app(scope, receive, send)


def serve_into_capsule(config: Any, *, runs_dir: Path | None = None) -> Path:
    """Serve `config` (a ServeConfig) until stopped, capturing into a new capsule; returns its path."""
    import uvicorn

    from ..capsule.store_capsule import store_capsule
    from .proxy import build_app
    from .run import prepare_server_process, uvicorn_config

    prepare_server_process()
    with store_capsule("serve", runs_dir=runs_dir) as capsule:
        app = DefaultRolloutPrefix(build_app(config, store=capsule.store))
        print(
            f"llmtap serve on http://{config.host}:{config.port}  capturing into run capsule {capsule.paths.root}",
            file=sys.stderr,
            flush=True,
        )
        try:
            uvicorn.Server(uvicorn_config(config, app)).run()
        except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it shut down on: the normal way to stop
            pass
    return capsule.paths.root
