"""The `/ng-rollout/<rollout_id>` prefix that ties a model call to its rollout, and helpers for agents.

An agent puts the prefix in front of every model call it makes for a rollout; the model server
strips it before routing and files the call under that rollout. The id comes from the run body:
an explicit `_ng_rollout_id`, else `{_ng_task_index}-{_ng_rollout_index}`, plus `-a<n>` for a
retry attempt. Ids are checked with the rules of `llmtap.correlation.ids`, so an id accepted here
is always one the store can file. A call whose token ids a training framework captures carries
`/training-token-capture` after the prefix (`token_capture=True`); where the run body carries
sampling values (`_ng_model_sampling`), the helpers add `/ng-sampling/<segment>` after both.

Unlike the reference system, nothing here is gated on a configuration flag: an id present means
a prefix.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NamedTuple, Optional, TypeAlias

from pydantic import BaseModel

from llmtap.correlation.ids import (
    ROLLOUT_ID_PATTERN,
    ROLLOUT_PREFIX,
    TRAINING_TOKEN_CAPTURE_SEGMENT,
    validate_explicit_rollout_id,
    validate_rollout_id,
)
from llmtap.correlation.run_body import run_body_value
from llmtap.correlation.sampling import (
    MODEL_SAMPLING_HEADER,
    MODEL_SAMPLING_PREFIX,
    encode_model_sampling,
    model_sampling_from_run_body,
    model_sampling_path_segment,
    resolve_sampling_segment,
    split_sampling_segment,
    with_model_sampling_segment,
)
from llmtap.errors import InvalidRolloutIdError

__all__ = [
    "ATTEMPT_INDEX_KEY",
    "ROLLOUT_ID_KEY",
    "ROLLOUT_ID_PATTERN",
    "ROLLOUT_INDEX_KEY",
    "ROLLOUT_PREFIX",
    "TASK_INDEX_KEY",
    "CorrelatedPath",
    "base_url_for_run",
    "current_rollout_id",
    "resolve_model_base_url",
    "rollout_context",
    "rollout_id_from_run",
    "rollout_id_from_run_body",
    "rollout_path_prefix",
    "split_correlation_path",
    "split_rollout_prefix",
    "split_token_capture_segment",
    "url_path_for_request",
    "url_path_for_run",
]

ROLLOUT_ID_KEY = "_ng_rollout_id"
TASK_INDEX_KEY = "_ng_task_index"
ROLLOUT_INDEX_KEY = "_ng_rollout_index"
ATTEMPT_INDEX_KEY = "_ng_attempt_index"

_DIGITS = re.compile(r"[0-9]+")
_ROLLOUT_ID: ContextVar[Optional[str]] = ContextVar("llmtap_rollout_id", default=None)

RunBody: TypeAlias = BaseModel | Mapping[str, Any] | None


def _index(body: RunBody, key: str) -> str | None:
    """Read a non-negative index as the digits the caller wrote: an int, or a string of ASCII digits
    kept as it is (`"01"` stays `01`, as the reference system builds it); bools and anything else raise."""
    value = run_body_value(body, key)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        return value
    raise ValueError(
        f"{key} is {type(value).__name__} {value!r}, not a non-negative integer: set it to a number "
        "such as 0 or \"2\"."
    )


def rollout_id_from_run_body(body: RunBody) -> str | None:
    """Return the rollout id a run request or row carries, or None when it carries none.

    An explicit `_ng_rollout_id` wins and is validated (`validate_explicit_rollout_id`), never
    sanitized (None counts as absent); a pydantic run request may hold it under that alias.
    Otherwise the id is `{_ng_task_index}-{_ng_rollout_index}` with the caller's digits, and None
    when either is missing. `_ng_attempt_index` above 0 appends `-a<n>` (as a number: `"02"` is
    `-a2`), so a retry never mixes with an earlier attempt. Raises InvalidRolloutIdError for a bad
    explicit id or an id too long to file, ValueError for a bad index.

    >>> rollout_id_from_run_body({"_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_attempt_index": "2"})
    '3-1-a2'
    """
    explicit = run_body_value(body, ROLLOUT_ID_KEY)
    if explicit is not None:
        base = validate_explicit_rollout_id(explicit)
    else:
        task, rollout = _index(body, TASK_INDEX_KEY), _index(body, ROLLOUT_INDEX_KEY)
        if task is None or rollout is None:
            return None
        base = validate_rollout_id(f"{task}-{rollout}")
    attempt = _index(body, ATTEMPT_INDEX_KEY)
    if attempt is None or int(attempt) == 0:
        return base
    return validate_rollout_id(f"{base}-a{int(attempt)}")


def rollout_id_from_run(body: RunBody) -> str | None:
    """Return the rollout id for an agent's `/run` body, for harnesses that thread it through layers.

    Same rule as `rollout_id_from_run_body`; pair it with `resolve_model_base_url`.
    """
    return rollout_id_from_run_body(body)


def rollout_path_prefix(
    rollout_id: str | None, sampling_segment: str | None = None, *, token_capture: bool = False
) -> str:
    """Return `/ng-rollout/<id>[/training-token-capture][/ng-sampling/<segment>]`, or "" for none.

    `token_capture` adds the training segment, and only after an id: without one there is no
    rollout to capture token ids for.
    """
    prefix = ""
    if rollout_id is not None:
        prefix = f"{ROLLOUT_PREFIX}{validate_rollout_id(rollout_id)}"
        if token_capture:
            prefix += TRAINING_TOKEN_CAPTURE_SEGMENT
    return prefix + model_sampling_path_segment(sampling_segment)


def split_rollout_prefix(path: str) -> tuple[str | None, str]:
    """Split a leading `/ng-rollout/<id>` off a path; `(None, path)` when it has none.

    The rest always starts with "/". A prefixed path whose id is empty or invalid raises
    InvalidRolloutIdError, so a server answers a clear 4xx instead of silently not capturing.
    """
    if not path.startswith(ROLLOUT_PREFIX):
        return None, path
    path_only, mark, query = path.partition("?")
    rollout_id, slash, rest = path_only[len(ROLLOUT_PREFIX) :].partition("/")
    if not rollout_id:
        raise InvalidRolloutIdError(rollout_id, f"path {path!r} has an empty id after {ROLLOUT_PREFIX}")
    validate_rollout_id(rollout_id)
    return rollout_id, (f"/{rest}{mark}{query}" if slash else f"/{mark}{query}")


def split_token_capture_segment(rest: str) -> tuple[bool, str]:
    """Split a leading `/training-token-capture` off the rest of a prefixed path: `(True, rest)` when
    it is there (followed by `/`, `?` or nothing), else `(False, rest)` unchanged."""
    if not rest.startswith(TRAINING_TOKEN_CAPTURE_SEGMENT):
        return False, rest
    after = rest[len(TRAINING_TOKEN_CAPTURE_SEGMENT) :]
    if after[:1] not in ("", "/", "?"):
        return False, rest  # `/training-token-captured/...`: another path, not the segment
    return True, after if after.startswith("/") else f"/{after}"


class CorrelatedPath(NamedTuple):
    """A request path taken apart: its rollout id, its sampling segment, the path to route, and
    whether it carried the training token-capture segment."""

    rollout_id: str | None
    sampling_segment: str | None
    rest: str
    token_capture: bool = False


def split_correlation_path(path: str) -> CorrelatedPath:
    """Take `/ng-rollout/<id>`, `/training-token-capture` (only after an id) and then
    `/ng-sampling/<segment>` off a path, each optional.

    Raises InvalidRolloutIdError or ValueError for a malformed id or segment.

    >>> split_correlation_path("/ng-rollout/3-1/training-token-capture/ng-sampling/null/v1/responses")
    CorrelatedPath(rollout_id='3-1', sampling_segment='null', rest='/v1/responses', token_capture=True)
    """
    rollout_id, rest = split_rollout_prefix(path)
    token_capture, rest = split_token_capture_segment(rest) if rollout_id is not None else (False, rest)
    segment, rest = split_sampling_segment(rest)
    return CorrelatedPath(rollout_id, segment, rest, token_capture)


@contextmanager
def rollout_context(rollout_id: str | None) -> Iterator[None]:
    """Make `rollout_id` the current rollout inside the block (None: no rollout).

    An invalid id raises InvalidRolloutIdError on entry.
    """
    if rollout_id is not None:
        validate_rollout_id(rollout_id)
    token = _ROLLOUT_ID.set(rollout_id)
    try:
        yield
    finally:
        _ROLLOUT_ID.reset(token)


def current_rollout_id() -> str | None:
    """Return the rollout id set by the enclosing `rollout_context`, or None."""
    return _ROLLOUT_ID.get()


def _segment_from_run_body(body: RunBody) -> str | None:
    sampling = model_sampling_from_run_body(body)
    return encode_model_sampling(sampling) if sampling is not None else None


def _already_correlated(url_path: str) -> bool:
    return url_path.startswith(ROLLOUT_PREFIX) or url_path.startswith(MODEL_SAMPLING_PREFIX)


def _prefixed(url_path: str, rollout_id: str | None, segment: str | None, token_capture: bool = False) -> str:
    """Put the rollout prefix (and training segment), then the sampling segment (generation paths
    only), on a path."""
    if _already_correlated(url_path):
        return url_path
    if not url_path.startswith("/"):
        url_path = f"/{url_path}"
    if rollout_id is not None:
        url_path = f"{rollout_path_prefix(rollout_id, token_capture=token_capture)}{url_path}"
    return with_model_sampling_segment(url_path, segment)


def url_path_for_run(url_path: str, body: RunBody, *, token_capture: bool = False) -> str:
    """Return the path for a model call made while serving a run: prefixed with the run's rollout.

    Without an id the path is returned unchanged, unless the body carries sampling values, which
    still add their segment to a generation path. A path that already carries a prefix is left
    alone, so nothing is prefixed twice. `token_capture=True` (an agent a training framework
    captures token ids for) adds `/training-token-capture` after the id.

    >>> url_path_for_run("/v1/responses", {"_ng_task_index": 3, "_ng_rollout_index": 1})
    '/ng-rollout/3-1/v1/responses'
    """
    return _prefixed(url_path, rollout_id_from_run_body(body), _segment_from_run_body(body), token_capture)


def _inbound_paths(request: Any) -> Iterator[str]:
    """The paths a request-like object may hold, most specific first: a string, `url.path`, the scope."""
    if isinstance(request, str):
        yield request
        return
    url = getattr(request, "url", None)
    path = getattr(url, "path", None)
    if isinstance(path, str):
        yield path
    scope = getattr(request, "scope", None)
    if isinstance(scope, Mapping):
        if isinstance(scope.get("path"), str):
            yield scope["path"]
        raw = scope.get("raw_path")
        if isinstance(raw, bytes):
            yield raw.decode("latin-1")


def _inbound_header(request: Any) -> str | None:
    get = getattr(getattr(request, "headers", None), "get", None)
    value = get(MODEL_SAMPLING_HEADER) if callable(get) else None
    return value if isinstance(value, str) else None


def url_path_for_request(url_path: str, request: Any) -> str:
    """Carry an inbound request's `/ng-rollout/<id>[/training-token-capture][/ng-sampling/<segment>]`
    onto a downstream path.

    `request` is a path string, a Starlette-like request (its `path_params["rollout_id"]` when the
    route declares it, else `url.path`, `scope["path"]`, `scope["raw_path"]`), or None. A sampling
    segment sent in the `x-ng-sampling` header is carried too. Without an inbound prefix the path
    is returned unchanged. An invalid inbound id raises InvalidRolloutIdError.
    """
    if request is None:
        return url_path
    rollout_id: str | None = None
    segment: str | None = None
    token_capture = False
    params = getattr(request, "path_params", None)
    if isinstance(params, Mapping) and params.get("rollout_id") is not None:
        rollout_id = validate_rollout_id(params["rollout_id"])
    for path in _inbound_paths(request):
        found = split_correlation_path(path)
        if found.rollout_id is not None or found.sampling_segment is not None:
            rollout_id = rollout_id or found.rollout_id
            segment, token_capture = found.sampling_segment, found.token_capture
            break
    segment = resolve_sampling_segment(segment, _inbound_header(request))
    return _prefixed(url_path, rollout_id, segment, token_capture)


def base_url_for_run(base_url: str, body: RunBody, *, token_capture: bool = False) -> str:
    """Return an SDK base URL for a run: trailing "/" stripped, then `rollout_path_prefix`'s prefix.

    The caller (or SDK) appends `/v1`. Without an id or sampling values, `base_url` is returned
    exactly as given. `token_capture=True` adds `/training-token-capture` after the id.

    >>> base_url_for_run("http://127.0.0.1:8000/", {"_ng_rollout_id": "job-7"})
    'http://127.0.0.1:8000/ng-rollout/job-7'
    """
    prefix = rollout_path_prefix(
        rollout_id_from_run_body(body), _segment_from_run_body(body), token_capture=token_capture
    )
    return f"{base_url.rstrip('/')}{prefix}" if prefix else base_url


def resolve_model_base_url(
    base_url_or_name: str,
    rollout_id: str | None = None,
    *,
    sampling_segment: str | None = None,
    token_capture: bool = False,
) -> str:
    """Return `<base>[/ng-rollout/<id>[/training-token-capture]][/ng-sampling/<segment>]/v1`, for an SDK.

    `base_url_or_name` is a URL (`http://host:port`, optionally ending in `/v1`, which moves after
    the prefix) or a bare `host:port`. Raises ValueError for anything else, and
    InvalidRolloutIdError or ValueError for a bad id or segment.

    >>> resolve_model_base_url("127.0.0.1:8000", "3-1")
    'http://127.0.0.1:8000/ng-rollout/3-1/v1'
    """
    base = base_url_or_name.strip()
    if "://" not in base:
        host, _, port = base.partition(":")
        if not host or not (port.isascii() and port.isdigit()) or "/" in base:
            raise ValueError(
                f"Model server {base_url_or_name!r} is neither a URL nor host:port: pass its base URL, "
                "such as 'http://127.0.0.1:8000'."
            )
        base = f"http://{base}"
    base = base.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return f"{base}{rollout_path_prefix(rollout_id, sampling_segment, token_capture=token_capture)}/v1"
