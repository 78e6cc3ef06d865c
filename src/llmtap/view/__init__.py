"""The web viewer behind `llmtap view`: rollouts, their calls on a timeline, each call in full, live.

`discover(paths)` sorts the given paths into sources (capture directories, run capsules,
rollouts files) and `create_app(sources, settings)` builds the read-only ASGI app; `serve`
runs it on loopback with uvicorn. `discover_pair(a, b)` and `ViewerSettings(compare=...)` open it
on the comparison of two runs (`compare`, `compare_pages`).
"""

from __future__ import annotations

from .app import ViewerSettings, create_app
from .sources import SourceSet, ViewPathError, default_paths, discover

__all__ = [
    "SourceSet",
    "ViewPathError",
    "ViewerSettings",
    "create_app",
    "default_paths",
    "discover",
    "serve",
    "serve_app",
]


def serve(sources: SourceSet, *, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve the viewer for `sources` (from `discover`) until interrupted (blocking)."""
    serve_app(sources, ViewerSettings(host=host, port=port))


def serve_app(sources: SourceSet, settings: ViewerSettings) -> None:
    """Serve the viewer for `sources` with `settings` (a comparison to open on, say) until interrupted."""
    import uvicorn

    app = create_app(sources, settings)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning", lifespan="on")
