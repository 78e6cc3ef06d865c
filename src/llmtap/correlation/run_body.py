"""Reading one field of an agent's run request or row, whatever object carries it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["run_body_value"]

# Per pydantic model class: its fields' aliases, each mapped to the attribute that holds the value.
_ALIASES: dict[type, dict[str, str]] = {}
_ALIASES_KEPT = 1024


def run_body_value(body: object, key: str) -> Any:
    """Return one field of a run request or row, or None when absent.

    Reads the field itself (never `model_dump`, which would copy the whole row): a mapping's key, a
    pydantic model's field declared under `key` as its alias (the reference system's run requests
    keep `_ng_rollout_id` in a field named `capture_rollout_id`, because pydantic fields cannot
    start with `_`), its extra field, or an attribute. Pydantic is recognised by the class's
    `model_fields` and the instance's `model_extra`, so reading a plain mapping never imports it.
    """
    if body is None:
        return None
    if isinstance(body, Mapping):
        return body.get(key)
    field_name = _aliases(type(body)).get(key)
    if field_name is not None:
        return getattr(body, field_name, None)
    extra = getattr(body, "model_extra", None)
    if isinstance(extra, dict) and key in extra:
        return extra[key]
    return getattr(body, key, None)


def _aliases(model_class: type) -> dict[str, str]:
    """The aliases a pydantic model class's fields are read under: `alias`, a string `validation_alias`
    and the string choices of an `AliasChoices`; empty for any other class."""
    found = _ALIASES.get(model_class)
    if found is not None:
        return found
    found = {}
    fields = getattr(model_class, "__pydantic_fields__", None)
    if isinstance(fields, dict):
        for name, info in fields.items():
            for alias in (getattr(info, "alias", None), getattr(info, "validation_alias", None)):
                choices = getattr(alias, "choices", None)
                for candidate in choices if isinstance(choices, list) else [alias]:
                    if isinstance(candidate, str) and candidate != name:
                        found.setdefault(candidate, name)
    if len(_ALIASES) >= _ALIASES_KEPT:
        _ALIASES.clear()
    _ALIASES[model_class] = found
    return found
