"""The compare pages: two runs' summary and gate, and one rollout's calls side by side.

`/compare/{a}/{b}` names two sources by their viewer ids (never paths); a rollout is named by a
key both runs were listed with, checked against that list. Comparisons are kept for the last few
pairs of runs opened (`MAX_COMPARISONS`); the oldest is closed when another is opened.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ..diff.gate import GateOptions, evaluate_gate, parse_fraction
from ..errors import LlmtapError
from .compare import CompareRuns, rollout_page

if TYPE_CHECKING:
    from .app import _Viewer

__all__ = ["ComparePages", "compare_url"]

MAX_COMPARISONS = 4
ROLLOUTS_PER_PAGE = 50
FILTERS = ("differing", "all", "changed", "added", "removed", "unchanged")
MAX_KEY_CHARS = 512


def compare_url(sid_a: str, sid_b: str) -> str:
    """The compare page of two sources."""
    return f"/compare/{quote(sid_a, safe='')}/{quote(sid_b, safe='')}"


def gate_options(params: Mapping[str, str]) -> tuple[GateOptions, list[str]]:
    """The gate's options from a query string, and a note for each threshold that is not one (it is ignored)."""
    notes: list[str] = []
    thresholds: dict[str, float | None] = {}
    for name in ("max_token_increase", "max_latency_p95_increase"):
        text = params.get(name, "").strip()[:32]
        thresholds[name] = None
        if text:
            try:
                thresholds[name] = parse_fraction(text)
            except ValueError as exc:
                notes.append(str(exc))
    return GateOptions(params.get("allow_added") == "1", **thresholds), notes


def _page_number(text: str | None) -> int:
    return int(text) if text is not None and text.isdigit() and len(text) <= 9 else 1


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ComparePages:
    """The compare routes, sharing the viewer's templates, sources and live-update machinery."""

    def __init__(self, viewer: _Viewer) -> None:
        self.viewer = viewer
        self._runs: OrderedDict[tuple[str, str], CompareRuns] = OrderedDict()
        self._lock = threading.Lock()

    def runs(self, sid_a: str, sid_b: str) -> CompareRuns:
        """The comparison of two sources, opened (and its summary started) on first use."""
        key = (sid_a, sid_b)
        with self._lock:
            found = self._runs.get(key)
            if found is not None:
                self._runs.move_to_end(key)
                return found
        source_a, source_b = self.viewer.sources.get(sid_a), self.viewer.sources.get(sid_b)
        if source_a is None or source_b is None:
            raise _BadRequest(404, "There is no such source here; the home page lists what this viewer shows.")
        try:
            opened = CompareRuns(sid_a, sid_b, source_a.path, source_b.path)
        except LlmtapError as exc:
            raise _BadRequest(400, f"These two runs cannot be compared: {exc}") from None
        with self._lock:
            raced = self._runs.get(key)
            if raced is not None:
                opened.close()
                return raced
            self._runs[key] = opened
            while len(self._runs) > MAX_COMPARISONS:
                _, oldest = self._runs.popitem(last=False)
                oldest.close()
        opened.start()
        return opened

    def open_quietly(self, sid_a: str, sid_b: str) -> None:
        """Open a comparison ahead of its first page; a problem is shown by that page instead."""
        try:
            self.runs(sid_a, sid_b)
        except _BadRequest:
            pass

    def close(self) -> None:
        """Close every comparison kept."""
        with self._lock:
            for runs in self._runs.values():
                runs.close()
            self._runs.clear()

    async def _page(self, request: Request, build: Callable[[Request], Response]) -> Response:
        """Draw a page off the event loop; a comparison that cannot be made becomes an error page."""

        def run(r: Request) -> Response:
            try:
                return build(r)
            except _BadRequest as problem:
                return self.viewer._render(
                    "error.html", problem.status, title="Cannot compare", message=problem.message
                )

        return await self.viewer._page(request, run)

    # --- routes -----------------------------------------------------------------------------

    async def choose(self, request: Request) -> Response:
        """`/compare?a=&b=` (the home page's form): on to the compare page of those two sources."""
        a, b = request.query_params.get("a", ""), request.query_params.get("b", "")
        if self.viewer.sources.get(a) is None or self.viewer.sources.get(b) is None:
            return self.viewer._render(
                "error.html", 404, title="Not found", message="Choose two sources the home page lists."
            )
        return RedirectResponse(compare_url(a, b), status_code=303)

    async def summary(self, request: Request) -> Response:
        return await self._page(request, lambda r: self._summary(r, "compare.html"))

    async def summary_fragment(self, request: Request) -> Response:
        return await self._page(request, lambda r: self._summary(r, "_compare_live.html"))

    def _summary(self, request: Request, template: str) -> Response:
        runs = self.runs(request.path_params["a"], request.path_params["b"])
        summary = runs.summary  # read once: the thread may finish while this page is drawn
        params = request.query_params
        shown = params.get("status", "") if summary is not None else "all"  # statuses are not known yet
        if shown not in FILTERS:
            shown = "differing"
        keys = runs.keys
        if shown == "differing":
            keys = [key for key in keys if key in runs.differing]
        elif shown != "all":
            keys = [key for key in keys if runs.status_of(key) == shown]
        pages = max(1, -(-len(keys) // ROLLOUTS_PER_PAGE))
        page = min(_page_number(params.get("page")), pages)
        options, option_notes = gate_options(params)
        gate = None if summary is None else evaluate_gate(summary, options)
        per_rollout: dict[str, int] = {}
        for reason in gate.reasons if gate is not None else []:
            if reason.rollout is not None:
                per_rollout[reason.rollout] = per_rollout.get(reason.rollout, 0) + 1
        return self.viewer._render(
            template, runs=runs, summary=summary, source_a=self.viewer.sources.get(runs.sid_a),
            source_b=self.viewer.sources.get(runs.sid_b), base=compare_url(runs.sid_a, runs.sid_b),
            keys=keys[(page - 1) * ROLLOUTS_PER_PAGE : page * ROLLOUTS_PER_PAGE], total=len(keys), page=page,
            pages=pages, shown=shown, FILTERS=FILTERS, gate=gate, options=options, option_notes=option_notes,
            per_rollout=per_rollout, params=dict(params), title=f"compare {runs.sid_a} · {runs.sid_b}",
        )  # fmt: skip

    async def summary_events(self, request: Request) -> Response:
        try:
            runs = await run_in_threadpool(self.runs, request.path_params["a"], request.path_params["b"])
        except _BadRequest as problem:
            return self.viewer._render("error.html", problem.status, title="Cannot compare", message=problem.message)

        def version() -> tuple[int, int]:
            return (runs.loaded[0], int(runs.done))

        return await self.viewer._events(request, version)

    async def rollout(self, request: Request) -> Response:
        return await self._page(request, self._rollout)

    def _rollout(self, request: Request) -> Response:
        runs = self.runs(request.path_params["a"], request.path_params["b"])
        key = request.path_params["key"]
        if len(key) > MAX_KEY_CHARS or key not in runs.known:
            raise _BadRequest(404, "Neither run holds a rollout by that key; the compare page lists them.")
        aligned = runs.aligned(key)
        page = rollout_page(aligned, _page_number(request.query_params.get("page")))
        return self.viewer._render(
            "compare_rollout.html", runs=runs, key=key, view=page, comparison=aligned.comparison,
            source_a=self.viewer.sources.get(runs.sid_a), source_b=self.viewer.sources.get(runs.sid_b),
            base=compare_url(runs.sid_a, runs.sid_b), rollout_status=runs.status_of(key) or aligned.comparison.status,
            title=f"compare {key}",
        )  # fmt: skip
