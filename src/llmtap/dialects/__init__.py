"""API dialects behind one protocol, and the registry that finds one by path or name."""

from __future__ import annotations

from .base import Dialect, Normalized, StreamAssembler, ToolCall, Usage
from .chat import ChatDialect
from .messages import MessagesDialect
from .responses import ResponsesDialect

__all__ = [
    "DIALECTS",
    "Dialect",
    "Normalized",
    "StreamAssembler",
    "ToolCall",
    "Usage",
    "dialect_for_path",
    "get_dialect",
]

DIALECTS: dict[str, Dialect] = {
    dialect.name: dialect for dialect in (ResponsesDialect(), ChatDialect(), MessagesDialect())
}

_BY_PATH: dict[str, Dialect] = {path: dialect for dialect in DIALECTS.values() for path in dialect.paths}


def dialect_for_path(path: str, *, exact: bool = True) -> Dialect | None:
    """Return the dialect that owns `path`, or None.

    Exact matching (`/v1/chat/completions`) is what a model server does. In-process capture sees
    provider URLs such as Azure's `/openai/deployments/x/chat/completions`, so `exact=False`
    matches the dialect's path suffix instead, at a path-segment boundary.
    """
    path = path.split("?", 1)[0]
    found = _BY_PATH.get(path)
    if found is not None or exact:
        return found
    trimmed = path.rstrip("/")
    for dialect in DIALECTS.values():
        for suffix in dialect.path_suffixes:
            if trimmed.endswith(suffix):
                return dialect
    return None


def get_dialect(name: str) -> Dialect:
    """Return the dialect registered under `name` (`responses`, `chat` or `messages`)."""
    try:
        return DIALECTS[name]
    except KeyError:
        raise KeyError(f"Unknown dialect {name!r}: expected one of {sorted(DIALECTS)}.") from None
