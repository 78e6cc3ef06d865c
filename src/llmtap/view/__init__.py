"""The web viewer behind `llmtap view`: rollouts, their calls on a timeline, each call in full, live.

`discover(paths)` sorts the given paths into sources (capture directories, run capsules,
rollouts files) and `create_app(sources, settings)` builds the read-only ASGI app; `serve`
runs it on loopback with uvicorn.
"""

from __future__ import annotations

from .app import ViewerSettings, create_app
from .sources import SourceSet, ViewPathError, default_paths, discover

__all__ = ["SourceSet", "ViewPathError", "ViewerSettings", "create_app", "default_paths", "discover", "serve"]


def serve(sources: SourceSet, *, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve the viewer for `sources` (from `discover`) until interrupted (blocking)."""
    import uvicorn

    app = create_app(sources, ViewerSettings(host=host, port=port))
    uvicorn.run(app, host=host, port=port, log_level="warning", lifespan="on")
