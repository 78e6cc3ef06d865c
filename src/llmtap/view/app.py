"""The viewer's Starlette app: server-rendered pages, live updates by server-sent events, static assets.

Every route only reads. Path parameters are checked before use: a source id must name a
source given at start (ids never become paths), a rollout id must pass the store's rollout id
validation, a call index must be a number of that rollout. Templates autoescape everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlencode

import orjson
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..cli.display import format_value, tokens_per_second
from ..errors import InvalidRolloutIdError
from ..store import validate_rollout_id
from .call_view import build_call_view
from .compare_pages import ComparePages, compare_url
from .guard import ViewerGuard, allowed_hosts
from .query import PER_PAGE_CHOICES, SORTS, STATUSES, Query, run_query
from .rollout_view import load_rollout, neighbours, read_rollout_lines
from .sources import Source, SourceSet
from .summary import OUTCOMES, call_outcome
from .timeline import format_ms

__all__ = ["ViewerSettings", "create_app"]

MAX_EVENT_STREAMS = 32  # open live connections at once; more get 503 and the browser retries
EVENT_STREAM_SECONDS = 600.0  # a live connection ends after this; EventSource reconnects by itself
HEARTBEAT_SECONDS = 15.0


class ViewerSettings:
    """How the app runs: where it listens (for the Host check), how often it looks for changes, what `/` opens."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 8765,
        poll_seconds: float = 1.0,
        background: bool = True,
        compare: tuple[str, str] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.poll_seconds = poll_seconds
        self.background = background
        self.compare = compare  # two source ids: the home page opens on their comparison


def create_app(sources: SourceSet, settings: ViewerSettings | None = None) -> Any:
    """Build the viewer as an ASGI app (the guard wrapped around the Starlette routes).

    Usage::

        app = create_app(discover([".llmtap/runs"]), ViewerSettings(port=8765))
        uvicorn.run(app, host="127.0.0.1", port=8765)
    """
    settings = settings or ViewerSettings()
    viewer = _Viewer(sources, settings)
    routes = [
        Route("/", viewer.home),
        Route("/s/{sid}", viewer.source_page),
        Route("/s/{sid}/rows", viewer.rows_fragment),
        Route("/s/{sid}/events", viewer.source_events),
        Route("/s/{sid}/r/{rid}", viewer.rollout_page),
        Route("/s/{sid}/r/{rid}/live", viewer.rollout_fragment),
        Route("/s/{sid}/r/{rid}/events", viewer.rollout_events),
        Route("/s/{sid}/r/{rid}/c/{index}", viewer.call_page),
        Route("/compare", viewer.compare.choose),
        Route("/compare/{a}/{b}", viewer.compare.summary),
        Route("/compare/{a}/{b}/live", viewer.compare.summary_fragment),
        Route("/compare/{a}/{b}/events", viewer.compare.summary_events),
        Route("/compare/{a}/{b}/r/{key:path}", viewer.compare.rollout),
        Mount("/static", StaticFiles(packages=[("llmtap.view", "static")]), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=viewer.lifespan)
    app.state.viewer = viewer
    return ViewerGuard(app, hosts=allowed_hosts(settings.host, settings.port))


def _clock_time(mtime_ns: int) -> str:
    """A file time as `YYYY-MM-DD HH:MM:SS` UTC."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(mtime_ns / 1e9))


class _NotFound(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _Viewer:
    """The routes' shared state: sources, templates, the summariser thread and the live-connection count."""

    def __init__(self, sources: SourceSet, settings: ViewerSettings) -> None:
        self.sources = sources
        self.settings = settings
        self.env = Environment(
            loader=PackageLoader("llmtap.view", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
        )
        self.env.filters.update(
            num=format_value,
            ms=format_ms,
            qs=urlencode,
            outcome=call_outcome,
            tokens_per_second=tokens_per_second,
            timefmt=_clock_time,
        )
        self.env.globals.update(
            OUTCOMES=OUTCOMES, SORTS=SORTS, STATUSES=STATUSES, PER_PAGE_CHOICES=PER_PAGE_CHOICES, compare_url=compare_url
        )
        self.streams = 0
        self._stop = threading.Event()
        self.compare = ComparePages(self)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        worker = None
        if self.settings.background:
            worker = threading.Thread(target=self._summarise_forever, name="llmtap-view-summaries", daemon=True)
            worker.start()
        if self.settings.compare is not None:
            await run_in_threadpool(self.compare.open_quietly, *self.settings.compare)  # the summary starts now
        try:
            yield
        finally:
            self._stop.set()
            if worker is not None:
                worker.join(timeout=5)
            self.compare.close()

    def _summarise_forever(self) -> None:
        """Keep listings fresh and summarise every rollout in the background, a batch at a time."""
        while not self._stop.is_set():
            busy = False
            for source in list(self.sources.sources.values()):
                source.refresh(max_age=self._poll_for(source, look_inside=True), look_inside=True)
                if source.captures is not None and source.captures.summarise_some(200):
                    busy = True
            self._stop.wait(0.01 if busy else self.settings.poll_seconds)

    def _poll_for(self, source: Source, *, look_inside: bool = False) -> float:
        """The listing's age allowed: the poll interval, or four times what a listing takes on a big directory."""
        index = source.captures
        took = 0.0 if index is None else index.look_seconds if look_inside else index.scan_seconds
        return min(30.0, max(self.settings.poll_seconds, 4 * took))

    # --- rendering --------------------------------------------------------------------------

    def _render(self, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        return HTMLResponse(self.env.get_template(name).render(**context), status_code=status)

    def _not_found(self, message: str) -> HTMLResponse:
        return self._render("error.html", 404, title="Not found", message=message)

    def _source(self, request: Request) -> Source:
        source = self.sources.get(request.path_params["sid"])
        if source is None:
            raise _NotFound("There is no such source here; the home page lists what this viewer shows.")
        return source

    def _rollout_id(self, request: Request) -> str:
        try:
            return validate_rollout_id(request.path_params["rid"])
        except InvalidRolloutIdError:
            raise _NotFound("That is not a valid rollout id.") from None

    async def _page(self, request: Request, build: Callable[[Request], Response]) -> Response:
        try:
            return await run_in_threadpool(build, request)
        except _NotFound as missing:
            return self._not_found(missing.message)

    # --- routes -----------------------------------------------------------------------------

    async def home(self, request: Request) -> Response:
        return await self._page(request, self._home)

    def _home(self, request: Request) -> Response:
        if self.settings.compare is not None:
            return RedirectResponse(compare_url(*self.settings.compare), status_code=307)
        self.sources.rescan()
        sources = list(self.sources.sources.values())
        for source in sources:
            source.refresh(max_age=self._poll_for(source))
        if len(sources) == 1:
            return self._source_response(request, sources[0])
        return self._render("home.html", sources=sources, title="llmtap view")

    async def source_page(self, request: Request) -> Response:
        return await self._page(request, lambda r: self._source_response(r, self._source(r)))

    def _source_response(self, request: Request, source: Source, template: str = "source.html") -> Response:
        source.refresh(max_age=self._poll_for(source))
        query = Query.from_params(request.query_params)
        rows = source.rows.rows if source.rows is not None else None
        order = source.rows.order if source.rows is not None else None
        page = run_query(source.captures, query, rows, order)
        models: set[str] = set()
        categories: set[str] = set()
        if source.captures is not None:
            for summary in list(source.captures.summaries.values())[:20000]:
                models.update(summary.models)
                categories.update(summary.errors)
        return self._render(
            template, source=source, query=query, page=page, rows=rows or {}, models=sorted(models),
            categories=sorted(categories), title=source.label, single=len(self.sources.sources) == 1,
            # A rollouts file's rows carry their own summaries: only a bare capture directory waits for them.
            summarised=source.captures.summarised if source.captures is not None and rows is None else page.listed,
            listed=len(source.captures.files) if source.captures is not None and rows is None else page.listed,
        )  # fmt: skip

    async def rows_fragment(self, request: Request) -> Response:
        return await self._page(request, lambda r: self._source_response(r, self._source(r), "_rows.html"))

    async def rollout_page(self, request: Request) -> Response:
        return await self._page(request, lambda r: self._rollout_response(r, "rollout.html"))

    async def rollout_fragment(self, request: Request) -> Response:
        return await self._page(request, lambda r: self._rollout_response(r, "_rollout_live.html"))

    def _rollout_response(self, request: Request, template: str) -> Response:
        source = self._source(request)
        rollout_id = self._rollout_id(request)
        source.refresh(max_age=self._poll_for(source))
        view = load_rollout(source, rollout_id)
        if view is None:
            raise _NotFound(f"This source holds no rollout {rollout_id!r}.")
        return self._render(template, source=source, view=view, title=f"rollout {rollout_id}")

    async def call_page(self, request: Request) -> Response:
        return await self._page(request, self._call)

    def _call(self, request: Request) -> Response:
        source = self._source(request)
        rollout_id = self._rollout_id(request)
        text = request.path_params["index"]
        if not text.isdigit() or len(text) > 9:
            raise _NotFound("A call is named by its call_index, a number.")
        index = int(text)
        source.refresh(max_age=self._poll_for(source))
        lines, _, has_payloads, _ = read_rollout_lines(source, rollout_id)
        line = next((line for line in lines if line.call_index == index), None)
        if line is None:
            raise _NotFound(f"Rollout {rollout_id!r} has no call {index} here.")
        before, after = neighbours(lines, index)
        call = (
            build_call_view(line.line or {}, line.record) if line.record is not None and line.line is not None else None
        )
        return self._render(
            "call.html", source=source, rollout_id=rollout_id, line=line, record=line.record, call=call,
            before=before, after=after, has_payloads=has_payloads, count=len(lines),
            title=f"call {index} of {rollout_id}",
        )  # fmt: skip

    # --- live -------------------------------------------------------------------------------

    async def source_events(self, request: Request) -> Response:
        try:
            source = self._source(request)
        except _NotFound as missing:
            return self._not_found(missing.message)

        def version() -> tuple[int, int]:
            source.refresh(max_age=self._poll_for(source, look_inside=True), look_inside=True)
            return (
                source.captures.version if source.captures is not None else 0,
                source.rows.version if source.rows is not None else 0,
            )

        return await self._events(request, version)

    async def rollout_events(self, request: Request) -> Response:
        try:
            source = self._source(request)
            rollout_id = self._rollout_id(request)
        except _NotFound as missing:
            return self._not_found(missing.message)

        def version() -> tuple[int, int]:
            # Only this rollout's file is looked at; the summary reads just the lines appended.
            summary = source.captures.summary_now(rollout_id) if source.captures is not None else None
            rows = source.rows.version if source.rows is not None else 0
            if source.rows is not None:
                source.rows.refresh()
            return (summary.next_index if summary is not None else -1, rows)

        return await self._events(request, version)

    async def _events(self, request: Request, version: Callable[[], tuple[int, int]]) -> Response:
        if self.streams >= MAX_EVENT_STREAMS:
            return Response(
                "Too many live pages are open; close some and reload.", status_code=503, media_type="text/plain"
            )
        self.streams += 1
        poll = self.settings.poll_seconds

        async def stream() -> AsyncIterator[bytes]:
            try:
                last = await run_in_threadpool(version)
                yield b"retry: 2000\n\n"
                ends = time.monotonic() + EVENT_STREAM_SECONDS
                quiet_since = time.monotonic()
                while time.monotonic() < ends:
                    await asyncio.sleep(poll)
                    if await request.is_disconnected():
                        return
                    current = await run_in_threadpool(version)
                    if current != last:
                        last = current
                        quiet_since = time.monotonic()
                        yield b"event: changed\ndata: " + orjson.dumps({"version": list(current)}) + b"\n\n"
                    elif time.monotonic() - quiet_since > HEARTBEAT_SECONDS:
                        quiet_since = time.monotonic()
                        yield b": still here\n\n"
            finally:
                self.streams -= 1

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"x-accel-buffering": "no"})
