"""What the model saw and said, in provider-neutral items: the reading behind trajectory histories.

Each dialect reads its own shapes (its `*_items` module, exposed as the dialect's
`request_items` and `response_outputs`); this module dispatches by dialect name and keeps what
is provider-neutral. Each dialect's request input (Responses `instructions` and `input`, Chat `messages`, Messages
`system` and `messages`) and response output (Responses `output`, Chat `choices`, Messages
`content`) becomes a list of items, each a dict with the same six keys:

    role       "system", "developer", "user", "assistant", "tool", or None when the item has none
    type       "message", "tool_call", "tool_result" or "reasoning"
    text       the visible text (joined with "\\n" when the provider split it into parts), or None
    call_id    the tool call id a `tool_call` or `tool_result` carries
    name       the tool name
    arguments  a `tool_call`'s arguments as a dict (`{"_raw": text}` when not a JSON object)

and, only where they apply, `provider_type` (the provider's own item or block type, when it is
not a plain message, function call, result or reasoning), `non_text_parts` (the type names of
images, files and other parts whose content stays in the payload), `refusal`, `is_error`,
`encrypted` (reasoning whose text the provider withheld), `provider_type` "instructions" or
"system" on the request-level instructions (Responses `instructions`, Messages `system`; see
`is_instructions`), `choice_index` (chat `n > 1`),
`hosted` (a tool call the provider ran itself, such as a web search, and its result), and
`item_id`: the id the model server gave what the item was read from (a Responses item's `id`;
for a Messages response, the message id its blocks came in; chat serves none, so its items have
only their tool call ids). Terminal attribution matches a rollout's final answer against it.

The response of one call and the next call's request read through the same functions, so an
agent that replays a response unchanged produces equal items, which is what lets a trajectory
store each call's input as "the previous call's context plus these new items". Compare items
with `item_fingerprint`, which looks at the six keys only. `response_outputs` keeps chat choices
apart and `served_response_id` reads a response's own id whatever its dialect, so that terminal
attribution never reads provider JSON itself. Nothing here raises on odd JSON: an unreadable
payload gives None (unknown), an empty one [].
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from . import DIALECTS
from .items import HISTORY_ITEM_KEYS, HISTORY_ITEM_TYPES, HistoryItem

__all__ = [
    "HISTORY_ITEM_KEYS",
    "HISTORY_ITEM_TYPES",
    "HistoryItem",
    "continued_response_id",
    "fingerprint_outputs",
    "fingerprint_request_items",
    "is_instructions",
    "item_fingerprint",
    "request_items",
    "response_items",
    "response_outputs",
    "served_response_id",
]

# Provider types of the items read from a request's instructions, given apart from its conversation.
_INSTRUCTION_TYPES = frozenset({"instructions", "system"})


def item_fingerprint(item: Mapping[str, Any]) -> bytes:
    """Return bytes equal for two items exactly when their six core keys are equal."""
    return orjson.dumps([item.get(key) for key in HISTORY_ITEM_KEYS], option=orjson.OPT_SORT_KEYS)


def is_instructions(item: Mapping[str, Any]) -> bool:
    """True for an item read from a request's own instructions field rather than its conversation."""
    return item.get("role") == "system" and item.get("provider_type") in _INSTRUCTION_TYPES


def request_items(
    dialect: str | None, request: Any, *, memo: dict[bytes, list[HistoryItem]] | None = None
) -> list[HistoryItem] | None:
    """Return the model-visible input of a request, or None when the dialect or shape is unknown.

    `memo`, one dict kept across the calls of a rollout, lets each replayed message be read once:
    a conversation's every call repeats the messages before it. Items read through a memo are
    shared between calls, so treat them as read-only.
    """
    found = DIALECTS.get(dialect) if isinstance(dialect, str) else None
    if found is None or not isinstance(request, Mapping):
        return None
    return found.request_items(request, memo)


def response_items(dialect: str | None, response: Any) -> list[HistoryItem] | None:
    """Return the model's output in a response, or None when the dialect or shape is unknown."""
    outputs = response_outputs(dialect, response)
    return None if outputs is None else [item for output in outputs for item in output]


def response_outputs(dialect: str | None, response: Any) -> list[list[HistoryItem]] | None:
    """Return the model's output per alternative it served: one list, or one per chat choice.

    A chat response with `n > 1` served several answers, and only one of them can be the one a
    rollout kept; every other dialect serves one. None when the dialect or shape is unknown.
    """
    found = DIALECTS.get(dialect) if isinstance(dialect, str) else None
    if found is None or not isinstance(response, Mapping):
        return None
    return found.response_outputs(response)


def served_response_id(response: Any) -> str | None:
    """Return the id the model server gave a response object of any registered dialect.

    Each dialect reads the id it knows; the id counts only when those that find one agree, so a
    shape two dialects read differently gives None. Never raises: a failing dialect reads nothing.
    """
    if not isinstance(response, Mapping):
        return None
    found: set[str] = set()
    for dialect in DIALECTS.values():
        try:
            response_id = dialect.normalize(response).response_id
        except Exception:  # one dialect's bug must not hide the id the others read
            continue
        if response_id is not None:
            found.add(response_id)
    return found.pop() if len(found) == 1 else None


def continued_response_id(dialect: str | None, request: Any) -> str | None:
    """Return the response id a request continues server-side (Responses `previous_response_id`).

    Such a request carries only the new input; the model also saw the earlier response's context.
    """
    found = DIALECTS.get(dialect) if isinstance(dialect, str) else None
    if found is None or not isinstance(request, Mapping):
        return None
    return found.continued_response_id(request)


def fingerprint_request_items(dialect: str | None, request: Any) -> list[Any] | None:
    """Return a request's raw input items as the content fingerprint reads them, or None when unknown.

    Unlike `request_items` this selects the provider's own JSON objects without reading them:
    the fingerprint hashes raw blocks (a refusal block's canonical JSON), so it must see them
    as sent. Request-level instructions are not model-authored, so they contribute nothing and
    are left out; elements are not filtered, so a non-object element reaches the fingerprint,
    which calls the list unreadable.
    """
    found = DIALECTS.get(dialect) if isinstance(dialect, str) else None
    if found is None or not isinstance(request, Mapping):
        return None
    return found.fingerprint_request_items(request)


def fingerprint_outputs(dialect: str | None, response: Any) -> list[list[Any]] | None:
    """Return a response's raw output items per alternative served, as the content fingerprint reads them.

    Each dialect selects its own (see its `fingerprint_outputs`). None when the dialect or shape
    is unknown.
    """
    found = DIALECTS.get(dialect) if isinstance(dialect, str) else None
    if found is None or not isinstance(response, Mapping):
        return None
    return found.fingerprint_outputs(response)
