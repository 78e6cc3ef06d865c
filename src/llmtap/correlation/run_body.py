"""Reading one field of an agent's run request or row, whatever object carries it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["run_body_value"]


def run_body_value(body: object, key: str) -> Any:
    """Return one field of a run request or row, or None when absent.

    Reads the field itself (never `model_dump`, which would copy the whole row): a mapping's key, a
    pydantic model's extra field, or an attribute. Pydantic is recognised by its `model_extra`
    dict, so reading a plain mapping never imports it.
    """
    if body is None:
        return None
    if isinstance(body, Mapping):
        return body.get(key)
    extra = getattr(body, "model_extra", None)
    if isinstance(extra, dict) and key in extra:
        return extra[key]
    return getattr(body, key, None)
