"""The home table's server-side sorting, filtering and paging over a `CaptureIndex`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .index import CaptureIndex, natural_key
from .rows import RowInfo
from .summary import RolloutSummary

__all__ = ["SORTS", "STATUSES", "Page", "Query", "run_query"]

PER_PAGE_CHOICES = (25, 50, 100, 250)
STATUSES = ("ok", "error", "empty", "incomplete", "unattributed", "collect_error")
MAX_TEXT = 200
CACHED_QUERIES = 8  # the last few orders computed per index, valid while its version stays the same
SUMMARISE_FIRST = 2000  # with at most this many rollouts unsummarised, a query summarises them before answering

# Sort name -> key on the summary (None: unknown, sorted last either way); "id" and "recent" need none.
_SUMMARY_SORTS: dict[str, Callable[[RolloutSummary], Any]] = {
    "calls": lambda s: s.calls,
    "errors": lambda s: s.num_errors + s.unreadable,
    "tokens_in": lambda s: s.tokens_in,
    "tokens_out": lambda s: s.tokens_out,
    "reasoning": lambda s: s.tokens_reasoning,
    "cached": lambda s: s.cached_tokens,
    "wall": lambda s: s.wall_ms,
    "ttft": lambda s: s.ttft_p50,
}
SORTS = ("id", "recent", *_SUMMARY_SORTS, "reward")


@dataclass(frozen=True)
class Query:
    """What the home table was asked for, every value checked (unknown values fall back to defaults)."""

    sort: str = "id"
    descending: bool = False
    status: str = ""
    category: str = ""
    model: str = ""
    text: str = ""
    page: int = 1
    per_page: int = 50

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> Query:
        """Read a query string's values; anything unexpected is ignored, never an error page."""
        sort = params.get("sort", "id")
        per_page = _int(params.get("per_page"), 50)
        return cls(
            sort=sort if sort in SORTS else "id",
            descending=params.get("order") == "desc",
            status=params.get("status", "") if params.get("status", "") in STATUSES else "",
            category=params.get("category", "")[:MAX_TEXT],
            model=params.get("model", "")[:MAX_TEXT],
            text=params.get("q", "")[:MAX_TEXT],
            page=max(1, min(_int(params.get("page"), 1), 1_000_000)),
            per_page=per_page if per_page in PER_PAGE_CHOICES else 50,
        )

    def params(self, **changes: Any) -> dict[str, str]:
        """The query string for this query with some values changed (defaults left out)."""
        values = {
            "sort": self.sort, "order": "desc" if self.descending else "asc", "status": self.status,
            "category": self.category, "model": self.model, "q": self.text, "page": str(self.page),
            "per_page": str(self.per_page),
        }  # fmt: skip
        values.update({key: str(value) for key, value in changes.items()})
        defaults = {"sort": "id", "order": "asc", "page": "1", "per_page": "50"}
        return {key: value for key, value in values.items() if value and defaults.get(key) != value}

    @property
    def filtered(self) -> bool:
        """True when some rows may be left out: a status, error category, model or text filter."""
        return bool(self.status or self.category or self.model or self.text)

    @property
    def needs_summaries(self) -> bool:
        """True when the answer depends on parsed summaries, not only on the directory listing."""
        return self.sort in _SUMMARY_SORTS or bool(self.status or self.category or self.model)


@dataclass
class Page:
    """One page of rows and what the caller needs to draw the pager and the caveats."""

    ids: list[str]
    total: int  # rows matching the filters (over what could be judged)
    listed: int  # rollouts in the source
    pages: int
    unjudged: int  # rollouts left out or put last because they were not summarised yet
    summaries: dict[str, RolloutSummary | None] = field(default_factory=dict)


def run_query(
    index: CaptureIndex | None,
    query: Query,
    rows: Mapping[str, RowInfo] | None = None,
    row_order: list[str] | None = None,
) -> Page:
    """Filter, sort and cut one page; summaries are read for the shown rows only.

    `rows` (from a rollouts file) adds reward and attribution; with rows, the rollouts listed are
    the rows' ids (`row_order`), and their capture files are looked up in `index` when given.
    """
    if query.sort == "recent" and index is not None and len(index.files) <= SUMMARISE_FIRST:
        index.refresh(max_age=1.0, look_inside=True)  # file times for all: cheap on a small directory
    key = (query.sort, query.descending, query.status, query.category, query.model, query.text)
    cache = index.query_cache if index is not None and rows is None else None  # a rows file changes in place
    cached = cache.get(key) if cache is not None else None
    if cached is not None and index is not None and cached[0] == index.version:
        ids, listed, unjudged = cached[1]
    else:
        ids, listed, unjudged = _matching_ids(index, query, rows, row_order)
        if cache is not None and index is not None:
            cache[key] = (index.version, (ids, listed, unjudged))
            while len(cache) > CACHED_QUERIES:
                del cache[next(iter(cache))]
    total = len(ids)
    pages = max(1, -(-total // query.per_page))
    page = min(query.page, pages)
    shown = ids[(page - 1) * query.per_page : page * query.per_page]
    result = Page(shown, total, listed, pages, unjudged)
    for rid in shown:
        result.summaries[rid] = index.summary(rid) if index is not None else None
        if result.summaries[rid] is None and rows is not None and rid in rows:
            result.summaries[rid] = rows[rid].summary
    return result


def _matching_ids(
    index: CaptureIndex | None, query: Query, rows: Mapping[str, RowInfo] | None, row_order: list[str] | None
) -> tuple[list[str], int, int]:
    """Every matching id in order, how many were listed, and how many could not be judged yet."""
    if row_order is not None:
        ids = list(row_order)
    else:
        ids = list(index.order) if index is not None else []
    listed = len(ids)
    if query.text:
        needle = query.text.lower()
        ids = [rid for rid in ids if needle in rid.lower()]
    unjudged = 0
    if query.needs_summaries and index is not None and len(index.files) - index.summarised <= SUMMARISE_FIRST:
        while index.summarise_some(500):  # a small directory is answered exactly, without waiting for the background
            pass
    summaries = index.summaries if index is not None else {}
    if query.needs_summaries:
        judged = [rid for rid in ids if _summary(rid, summaries, rows) is not None]
        unjudged = len(ids) - len(judged)
        ids = [rid for rid in judged if _matches(rid, query, _summary(rid, summaries, rows), index, rows)]
        if query.sort in _SUMMARY_SORTS:
            key = _SUMMARY_SORTS[query.sort]
            ids = _sorted_nulls_last(ids, lambda rid: key(_summary(rid, summaries, rows)), query.descending, index)  # type: ignore[arg-type]
        else:
            ids = _ordered(ids, query, index, rows)
    elif query.status in ("unattributed", "collect_error"):
        ids = [rid for rid in ids if _matches(rid, query, None, index, rows)]
        ids = _ordered(ids, query, index, rows)
    else:
        ids = _ordered(ids, query, index, rows)
    return ids, listed, unjudged


def _summary(
    rid: str, summaries: Mapping[str, RolloutSummary], rows: Mapping[str, RowInfo] | None
) -> RolloutSummary | None:
    found = summaries.get(rid)
    if found is None and rows is not None and rid in rows:
        return rows[rid].summary
    return found


def _matches(
    rid: str,
    query: Query,
    summary: RolloutSummary | None,
    index: CaptureIndex | None,
    rows: Mapping[str, RowInfo] | None,
) -> bool:
    row = rows.get(rid) if rows is not None else None
    if query.status == "unattributed":
        return row is not None and not row.attributed
    if query.status == "collect_error":
        return row is not None and row.collect_error is not None
    if summary is None:
        return False
    if query.status == "incomplete":
        entry = index.entry(rid) if index is not None else None
        if not (entry is not None and entry.incomplete) and not (
            row is not None and "model_call_capture_incomplete" in row.gaps
        ):
            return False
    elif query.status and summary.status != query.status:
        return False
    if query.category and query.category not in summary.errors:
        return False
    return not (query.model and query.model not in summary.models)


def _ordered(ids: list[str], query: Query, index: CaptureIndex | None, rows: Mapping[str, RowInfo] | None) -> list[str]:
    if query.sort == "recent" and index is not None:
        files = index.files

        def mtime(rid: str) -> int | None:
            entry = files.get(rid)  # None also when nothing looked at the file yet: its time is unknown
            return entry.state.mtime_ns if entry is not None and entry.state is not None else None

        return _sorted_nulls_last(ids, mtime, not query.descending, index)  # newest first unless asked otherwise
    if query.sort == "reward" and rows is not None:
        return _sorted_nulls_last(ids, lambda rid: rows[rid].reward if rid in rows else None, query.descending, None)
    if index is not None and rows is None and not query.descending:
        return ids  # the index keeps ids in natural order already
    return sorted(ids, key=natural_key, reverse=query.descending)


def _sorted_nulls_last(
    ids: list[str], key: Callable[[str], Any], descending: bool, index: CaptureIndex | None
) -> list[str]:
    """Sort by `key`, ties in id order, unknown (None) values last whichever the direction."""
    known: list[tuple[Any, int, str]] = []
    unknown: list[str] = []
    rank = index.rank if index is not None else {rid: n for n, rid in enumerate(sorted(ids, key=natural_key))}
    for rid in ids:
        value = key(rid)
        if value is None:
            unknown.append(rid)
        else:
            tie = rank.get(rid, 0)
            known.append((value, -tie if descending else tie, rid))
    known.sort(key=lambda item: (item[0], item[1]), reverse=descending)
    return [rid for _, _, rid in known] + unknown


def _int(text: str | None, default: int) -> int:
    if text is None or not text.isdigit() or len(text) > 9:
        return default
    return int(text)
