"""What the model saw and said, in provider-neutral items: the reading behind trajectory histories.

Each dialect's request input (Responses `instructions` and `input`, Chat `messages`, Messages
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
`encrypted` (reasoning whose text the provider withheld), `choice_index` (chat `n > 1`),
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

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

from . import DIALECTS
from .base import parse_arguments

__all__ = [
    "HISTORY_ITEM_KEYS",
    "HISTORY_ITEM_TYPES",
    "HistoryItem",
    "continued_response_id",
    "fingerprint_outputs",
    "fingerprint_request_items",
    "item_fingerprint",
    "request_items",
    "response_items",
    "response_outputs",
    "served_response_id",
]

HistoryItem = dict[str, Any]

HISTORY_ITEM_TYPES = ("message", "tool_call", "tool_result", "reasoning")
HISTORY_ITEM_KEYS = ("role", "type", "text", "call_id", "name", "arguments")

_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
_RESPONSES_TOOL_RESULT_SUFFIX = "_output"
# Built-in Responses tools the client runs itself: their results come back as `*_call_output` input.
_RESPONSES_CLIENT_CALL_TYPES = frozenset({"computer_call", "local_shell_call", "shell_call", "apply_patch_call"})


def item_fingerprint(item: Mapping[str, Any]) -> bytes:
    """Return bytes equal for two items exactly when their six core keys are equal."""
    return orjson.dumps([item.get(key) for key in HISTORY_ITEM_KEYS], option=orjson.OPT_SORT_KEYS)


def request_items(
    dialect: str | None, request: Any, *, memo: dict[bytes, list[HistoryItem]] | None = None
) -> list[HistoryItem] | None:
    """Return the model-visible input of a request, or None when the dialect or shape is unknown.

    `memo`, one dict kept across the calls of a rollout, lets each replayed message be read once:
    a conversation's every call repeats the messages before it. Items read through a memo are
    shared between calls, so treat them as read-only.
    """
    if not isinstance(request, Mapping):
        return None
    if dialect == "responses":
        return _responses_request(request, memo)
    if dialect == "chat":
        return _chat_request(request, memo)
    if dialect == "messages":
        return _messages_request(request, memo)
    return None


def response_items(dialect: str | None, response: Any) -> list[HistoryItem] | None:
    """Return the model's output in a response, or None when the dialect or shape is unknown."""
    outputs = response_outputs(dialect, response)
    return None if outputs is None else [item for output in outputs for item in output]


def response_outputs(dialect: str | None, response: Any) -> list[list[HistoryItem]] | None:
    """Return the model's output per alternative it served: one list, or one per chat choice.

    A chat response with `n > 1` served several answers, and only one of them can be the one a
    rollout kept; every other dialect serves one. None when the dialect or shape is unknown.
    """
    if not isinstance(response, Mapping):
        return None
    if dialect == "responses":
        output = response.get("output")
        return [_responses_items(output, default_role="assistant")] if isinstance(output, list) else None
    if dialect == "chat":
        return _chat_choices(response)
    if dialect == "messages":
        content = response.get("content")
        if not isinstance(content, (list, str)):
            return None
        return [_with_item_id(_messages_content("assistant", content), _str(response.get("id")))]
    return None


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
    if dialect != "responses" or not isinstance(request, Mapping):
        return None
    value = request.get("previous_response_id")
    return value if isinstance(value, str) and value else None


def fingerprint_request_items(dialect: str | None, request: Any) -> list[Any] | None:
    """Return a request's raw input items as the content fingerprint reads them, or None when unknown.

    Unlike `request_items` this selects the provider's own JSON objects without reading them:
    the fingerprint hashes raw blocks (a refusal block's canonical JSON), so it must see them
    as sent. Responses `instructions`, a string `input` and Messages `system` are not
    model-authored, so they contribute nothing and are left out; elements are not filtered, so
    a non-object element reaches the fingerprint, which calls the list unreadable.
    """
    if not isinstance(request, Mapping):
        return None
    if dialect == "responses":
        prompt_input = request.get("input")
        if prompt_input is None or isinstance(prompt_input, str):
            return []
        return list(prompt_input) if isinstance(prompt_input, list) else None
    if dialect in ("chat", "messages"):
        messages = request.get("messages")
        return list(messages) if isinstance(messages, list) else None
    return None


def fingerprint_outputs(dialect: str | None, response: Any) -> list[list[Any]] | None:
    """Return a response's raw output items per alternative served, as the content fingerprint reads them.

    Responses: the `output` list; chat: each choice's `message` alone, in index order (a choice
    without an object message serves nothing); Messages: the response object itself, an
    assistant message whose `content` blocks hold its text and `tool_use` calls. None when the
    dialect or shape is unknown.
    """
    if not isinstance(response, Mapping):
        return None
    if dialect == "responses":
        output = response.get("output")
        return [list(output)] if isinstance(output, list) else None
    if dialect == "chat":
        choices = response.get("choices")
        if not isinstance(choices, list):
            return None
        ordered = _choices_in_order(choices)
        return [[choice["message"]] for _, choice in ordered if isinstance(choice.get("message"), dict)]
    if dialect == "messages":
        return [[dict(response)]] if isinstance(response.get("content"), (list, str)) else None
    return None


def _memoized(
    memo: dict[bytes, list[HistoryItem]] | None,
    tag: bytes,
    entry: dict[str, Any],
    read: Callable[[dict[str, Any]], list[HistoryItem]],
) -> list[HistoryItem]:
    """Read one message through the memo, keyed by its exact JSON (and how it is read)."""
    if memo is None:
        return read(entry)
    try:
        key = tag + orjson.dumps(entry)
    except TypeError:
        return read(entry)
    found = memo.get(key)
    if found is None:
        found = memo[key] = read(entry)
    return found


def _item(
    role: str | None,
    kind: str,
    *,
    text: str | None = None,
    call_id: str | None = None,
    name: str | None = None,
    arguments: dict[str, Any] | None = None,
    **extra: Any,
) -> HistoryItem:
    item: HistoryItem = {
        "role": role,
        "type": kind,
        "text": text,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }
    # Optional keys appear only when they say something: no None, False or empty list.
    item.update(
        (key, value) for key, value in extra.items() if value is not None and value is not False and value != []
    )
    return item


def _with_item_id(items: list[HistoryItem], item_id: str | None) -> list[HistoryItem]:
    """Mark items with the server id of what they were read from (kept when already set)."""
    if item_id is not None:
        for item in items:
            item.setdefault("item_id", item_id)
    return items


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _mappings(value: Any) -> list[Mapping[str, Any]]:
    return [entry for entry in value if isinstance(entry, dict)] if isinstance(value, list) else []


def _parts_text(content: Any) -> tuple[str | None, list[str], bool]:
    """Read message content (a string or a list of parts): text, non-text part types, refusal seen."""
    if isinstance(content, str):
        return content, [], False
    texts: list[str] = []
    others: list[str] = []
    refusal = False
    for part in content if isinstance(content, list) else []:
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            continue
        part_type = part.get("type")
        if part_type in _TEXT_PART_TYPES and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif part_type == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
            refusal = True
        else:
            others.append(part_type if isinstance(part_type, str) else "unknown")
    return ("\n".join(texts) if texts else None), others, refusal


def _message(role: str | None, content: Any, **extra: Any) -> HistoryItem:
    text, others, refusal = _parts_text(content)
    return _item(role, "message", text=text, non_text_parts=others, refusal=refusal, **extra)


def _output_text(value: Any) -> str | None:
    """A tool output: a string as is, text parts joined, anything else as compact JSON."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        text, _others, _refusal = _parts_text(value)
        if text is not None:
            return text
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode("utf-8")
    except TypeError:
        return None


# Responses --------------------------------------------------------------------------------------


def _responses_request(request: Mapping[str, Any], memo: dict[bytes, list[HistoryItem]] | None) -> list[HistoryItem]:
    items: list[HistoryItem] = []
    instructions = request.get("instructions")
    if isinstance(instructions, str) and instructions:
        items.append(_item("system", "message", text=instructions, provider_type="instructions"))
    elif isinstance(instructions, list):  # a prompt template's expanded instructions are input items
        items.extend(_responses_items(instructions, default_role="system"))
    prompt_input = request.get("input")
    if isinstance(prompt_input, str):
        items.append(_item("user", "message", text=prompt_input))
    elif isinstance(prompt_input, list):
        for entry in prompt_input:
            if isinstance(entry, dict):
                items.extend(_memoized(memo, b"responses:", entry, _responses_input_item))
    return items


def _responses_items(entries: Iterable[Any], *, default_role: str) -> list[HistoryItem]:
    items: list[HistoryItem] = []
    for entry in entries:
        if isinstance(entry, dict):
            items.extend(_responses_item(entry, default_role))
    return items


def _responses_item(entry: Mapping[str, Any], default_role: str) -> list[HistoryItem]:
    return _with_item_id(_responses_item_by_type(entry, default_role), _str(entry.get("id")))


def _responses_item_by_type(entry: Mapping[str, Any], default_role: str) -> list[HistoryItem]:
    kind = entry.get("type")
    role = _str(entry.get("role"))
    if kind in (None, "message"):
        return [_message(role or default_role, entry.get("content"))]
    if kind == "function_call":
        return [_responses_call(entry, parse_arguments(entry.get("arguments")))]
    if kind == "custom_tool_call":
        raw = entry.get("input")
        arguments = {"_raw": raw} if isinstance(raw, str) and not raw.strip() else parse_arguments(raw)
        return [_responses_call(entry, arguments, provider_type="custom_tool_call")]
    if kind == "reasoning":
        return [_responses_reasoning(entry)]
    if kind == "item_reference":
        return [_item(None, "message", provider_type="item_reference", item_id=_str(entry.get("id")))]
    if isinstance(kind, str) and kind.endswith(_RESPONSES_TOOL_RESULT_SUFFIX):
        provider_type = None if kind == "function_call_output" else kind
        return [
            _item(
                "tool",
                "tool_result",
                text=_output_text(entry.get("output")),
                call_id=_str(entry.get("call_id")) or _str(entry.get("id")),
                provider_type=provider_type,
            )
        ]
    if isinstance(kind, str) and kind.endswith("_call"):
        return _responses_builtin_call(entry, kind)
    return [_message(role, entry.get("content"), provider_type=kind if isinstance(kind, str) else "unknown")]


def _responses_input_item(entry: dict[str, Any]) -> list[HistoryItem]:
    return _responses_item(entry, "user")


def _responses_call(entry: Mapping[str, Any], arguments: dict[str, Any], **extra: Any) -> HistoryItem:
    return _item(
        "assistant",
        "tool_call",
        call_id=_str(entry.get("call_id")),
        name=_str(entry.get("name")),
        arguments=arguments,
        **extra,
    )


def _responses_reasoning(entry: Mapping[str, Any]) -> HistoryItem:
    texts = [text for part in _mappings(entry.get("summary")) if (text := _str(part.get("text")))]
    texts += [
        text
        for part in _mappings(entry.get("content"))
        if part.get("type") == "reasoning_text" and (text := _str(part.get("text")))
    ]
    return _item(
        "assistant",
        "reasoning",
        text="\n".join(texts) if texts else None,
        encrypted=isinstance(entry.get("encrypted_content"), str),
    )


def _responses_builtin_call(entry: Mapping[str, Any], kind: str) -> list[HistoryItem]:
    """A built-in tool call (web search, code interpreter, MCP, ...) and the result the model saw."""
    call_id = _str(entry.get("call_id")) or _str(entry.get("id"))
    if "arguments" in entry:
        arguments: dict[str, Any] | None = parse_arguments(entry.get("arguments"))
    elif isinstance(entry.get("action"), dict):
        arguments = dict(entry["action"])
    elif isinstance(entry.get("code"), str):
        arguments = {"code": entry["code"]}
    else:
        arguments = None
    call = _item(
        "assistant",
        "tool_call",
        call_id=call_id,
        name=_str(entry.get("name")) or kind[: -len("_call")],
        arguments=arguments,
        provider_type=kind,
        hosted=kind not in _RESPONSES_CLIENT_CALL_TYPES,
    )
    output = entry.get("output")
    if output is None:
        return [call]
    result = _item("tool", "tool_result", text=_output_text(output), call_id=call_id, provider_type=kind, hosted=True)
    return [call, result]


# Chat Completions -------------------------------------------------------------------------------


def _chat_request(request: Mapping[str, Any], memo: dict[bytes, list[HistoryItem]] | None) -> list[HistoryItem] | None:
    messages = request.get("messages")
    if not isinstance(messages, list):
        return None
    items: list[HistoryItem] = []
    for message in messages:
        if isinstance(message, dict):
            items.extend(_memoized(memo, b"chat:", message, _chat_request_message))
    return items


def _chat_request_message(message: dict[str, Any]) -> list[HistoryItem]:
    return _chat_message(message, None)


def _choices_in_order(choices: list[Any]) -> list[tuple[int, Mapping[str, Any]]]:
    """The object choices with their position, ordered by `index` (position when it has none)."""
    return sorted(
        enumerate(_mappings(choices)),
        key=lambda pair: (pair[1].get("index") if isinstance(pair[1].get("index"), int) else pair[0], pair[0]),
    )


def _chat_choices(response: Mapping[str, Any]) -> list[list[HistoryItem]] | None:
    """Each choice's message, in index order; `choice_index` is set only when there are several."""
    choices = response.get("choices")
    if not isinstance(choices, list):
        return None
    ordered = _choices_in_order(choices)
    several = len(ordered) > 1
    outputs: list[list[HistoryItem]] = []
    for position, choice in ordered:
        message = choice.get("message")
        if not isinstance(message, dict):
            continue
        index = choice.get("index") if isinstance(choice.get("index"), int) else position
        outputs.append(_chat_message(message, index if several else None, default_role="assistant"))
    return outputs


def _chat_message(
    message: Mapping[str, Any], choice_index: int | None, *, default_role: str | None = None
) -> list[HistoryItem]:
    role = _str(message.get("role")) or default_role
    if role == "tool":
        return [
            _item(
                "tool",
                "tool_result",
                text=_output_text(message.get("content")),
                call_id=_str(message.get("tool_call_id")),
                choice_index=choice_index,
            )
        ]
    if role == "function":  # the legacy function-calling result
        return [
            _item(
                "tool",
                "tool_result",
                text=_output_text(message.get("content")),
                name=_str(message.get("name")),
                provider_type="function",
            )
        ]
    items: list[HistoryItem] = []
    reasoning = _str(message.get("reasoning_content")) or _str(message.get("reasoning"))
    if reasoning is not None:
        items.append(_item(role, "reasoning", text=reasoning, choice_index=choice_index))
    calls = [_chat_tool_call(call, choice_index) for call in _mappings(message.get("tool_calls"))]
    legacy = message.get("function_call")
    # Some servers (llama.cpp) mirror the first tool call into the legacy field: the same call again.
    if isinstance(legacy, dict) and not calls:
        calls.append(
            _item(
                role,
                "tool_call",
                name=_str(legacy.get("name")),
                arguments=parse_arguments(legacy.get("arguments")),
                provider_type="function_call",
                choice_index=choice_index,
            )
        )
    content = message.get("content")
    refusal = _str(message.get("refusal"))
    if refusal is not None:
        items.append(_item(role, "message", text=refusal, refusal=True, choice_index=choice_index))
    elif content not in (None, "", []) or not calls:
        items.append(_message(role, content, choice_index=choice_index))
    for call in calls:
        call["role"] = role
    items.extend(calls)
    return items


def _chat_tool_call(call: Mapping[str, Any], choice_index: int | None) -> HistoryItem:
    function = call.get("function")
    custom = call.get("custom")
    if isinstance(custom, dict):
        raw = custom.get("input")
        arguments = {"_raw": raw} if isinstance(raw, str) and not raw.strip() else parse_arguments(raw)
        return _item(
            "assistant",
            "tool_call",
            call_id=_str(call.get("id")),
            name=_str(custom.get("name")),
            arguments=arguments,
            provider_type="custom",
            choice_index=choice_index,
        )
    function = function if isinstance(function, dict) else {}
    return _item(
        "assistant",
        "tool_call",
        call_id=_str(call.get("id")),
        name=_str(function.get("name")),
        arguments=parse_arguments(function.get("arguments")),
        choice_index=choice_index,
    )


# Anthropic Messages -----------------------------------------------------------------------------

_MESSAGES_CALL_TYPES = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})
_MESSAGES_INLINE_TYPES = frozenset({"text", "image", "document", "search_result"})


def _messages_request(
    request: Mapping[str, Any], memo: dict[bytes, list[HistoryItem]] | None
) -> list[HistoryItem] | None:
    messages = request.get("messages")
    if not isinstance(messages, list):
        return None
    items: list[HistoryItem] = []
    system = request.get("system")
    if isinstance(system, (str, list)) and system:
        items.append(_message("system", system))
    for message in messages:
        if isinstance(message, dict) and isinstance(message.get("content"), (str, list)):
            items.extend(_memoized(memo, b"messages:", message, _messages_message))
    return items


def _messages_message(message: dict[str, Any]) -> list[HistoryItem]:
    return _messages_content(_str(message.get("role")), message["content"])


def _messages_content(role: str | None, content: str | list[Any]) -> list[HistoryItem]:
    """One message's blocks: adjacent text, image and document blocks form one message item."""
    if isinstance(content, str):
        return [_item(role, "message", text=content)]
    items: list[HistoryItem] = []
    inline: list[Any] = []

    def flush() -> None:
        if inline:
            items.append(_message(role, list(inline)))
            inline.clear()

    for block in content:
        if isinstance(block, str):
            inline.append(block)
            continue
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind in _MESSAGES_INLINE_TYPES:
            inline.append(block)
            continue
        flush()
        items.append(_messages_block(role, block, kind))
    flush()
    return items


def _messages_block(role: str | None, block: Mapping[str, Any], kind: Any) -> HistoryItem:
    provider_type = kind if isinstance(kind, str) else "unknown"
    if kind in _MESSAGES_CALL_TYPES:
        return _item(
            role,
            "tool_call",
            call_id=_str(block.get("id")),
            name=_str(block.get("name")),
            arguments=parse_arguments(block.get("input")),
            provider_type=None if kind == "tool_use" else provider_type,
            hosted=kind != "tool_use",
        )
    if kind == "thinking":
        return _item(role, "reasoning", text=_str(block.get("thinking")))
    if kind == "redacted_thinking":
        return _item(role, "reasoning", encrypted=True, provider_type=provider_type)
    if isinstance(kind, str) and kind.endswith("tool_result"):
        return _item(
            "tool",
            "tool_result",
            text=_output_text(block.get("content")),
            call_id=_str(block.get("tool_use_id")),
            is_error=block.get("is_error") is True,
            provider_type=None if kind == "tool_result" else provider_type,
            hosted=kind != "tool_result",
        )
    return _item(role, "message", provider_type=provider_type)
