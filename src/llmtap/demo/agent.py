"""The reference agent: `POST /run` runs a multi-turn tool loop on one arithmetic task.

A task row asks a question and says what answer is right::

    {"question": "What is 17 + 25?", "a": 17, "b": 25, "expected": 42}

The agent asks the model through the real `openai` SDK, offering one tool, `add(a, b)`; the
first turn forces the tool call (small local models rarely choose a tool on their own), later
turns offer it, and the last allowed turn offers no tool so the model has to answer. Each tool
call runs in the agent and goes back to the model as a tool message.

What a custom agent author copies from here:

- every model call goes to `base_url_for_run(model_url, body) + "/v1"`, so `llmtap serve` files
  it under the run's rollout (and applies the run's `_ng_model_sampling`);
- tool calls are timed with `ObservationRecorder` and returned as `ng_agent_observations`,
  with the model-visible conversation and, when the agent knows the model server's `model_ref`,
  a `(model_ref, response_id)` reference per model call for the join to captured calls;
- the result carries `response`, the final model response exactly as the server sent it (the
  chat completion JSON), which terminal attribution joins to one captured call, and `reward`.

Reward: 1.0 when the final answer states the expected number (`expected`, else `a + b`), else
0.0; null when the task gives no way to check. `resolved` is the same verdict as a boolean and
`tool_correct` says whether some `add` call returned the expected number.

Errors: a body that is not a task answers 422; a model call that fails answers 502 with
`{"error": {"type", "message"}}` and the observations recorded so far.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from llmtap.correlation import (
    ATTEMPT_INDEX_KEY,
    ROLLOUT_ID_KEY,
    ROLLOUT_INDEX_KEY,
    TASK_INDEX_KEY,
    base_url_for_run,
    rollout_context,
    rollout_id_from_run_body,
)
from llmtap.dialects.history import request_items
from llmtap.errors import LlmtapError
from llmtap.rollouts.observations import OBSERVATIONS_KEY, InvocationRecorder, ObservationRecorder

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from openai import AsyncOpenAI

__all__ = ["ADD_TOOL", "AGENT_SOURCE", "SYSTEM_PROMPT", "SimpleAgentConfig", "TaskError", "build_app", "check_answer", "run_task"]

logger = logging.getLogger(__name__)

# The observation source recorded with every run: a label in stored data, kept from before the move.
AGENT_SOURCE = "llmtap.agents.simple"

ADD_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers and return their sum.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
_FORCE_ADD = {"type": "function", "function": {"name": "add"}}
SYSTEM_PROMPT = "You are a careful calculator. Use the add tool for sums, then state the result as a number."
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_IDENTITY_KEYS = (TASK_INDEX_KEY, ROLLOUT_INDEX_KEY, ATTEMPT_INDEX_KEY, ROLLOUT_ID_KEY)


@dataclass(frozen=True)
class SimpleAgentConfig:
    """How the agent reaches its model and how long it may loop.

    `model_url` is the model server's base URL (`llmtap serve`, without `/v1`). `model_ref` is
    the `model_ref` that server records (`{"type": "responses_api_models", "name": ...}`); with
    it, the observations name each model call by `(model_ref, response_id)`. `max_turns` counts
    model calls; the last one is offered no tool.
    """

    model_url: str
    model: str = "default"
    api_key: str = "no-key-needed"
    model_ref: Mapping[str, Any] | None = None
    max_turns: int = 4
    max_tokens: int = 64
    temperature: float | None = None
    request_timeout_s: float = 120.0
    max_retries: int = 0
    default_headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_turns < 2:
            raise ValueError(f"max_turns is {self.max_turns}; use 2 or more, so a tool result can reach the model.")


class TaskError(LlmtapError, ValueError):
    """Raised when a `/run` body is not a task this agent can run."""


@dataclass(frozen=True)
class _Task:
    question: str
    expected: float | None
    a: int | None
    b: int | None


def _number(body: Mapping[str, Any], key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TaskError(f"Task field {key!r} is {value!r}; give a number.")
    return float(value)


def _parse_task(body: Any) -> _Task:
    if not isinstance(body, Mapping):
        raise TaskError(f"The /run body is a JSON {type(body).__name__}; send a task object such as {{\"question\": ...}}.")
    question = body.get("question")
    if not isinstance(question, str) or not question.strip():
        raise TaskError("The task has no 'question' string; add one, such as \"What is 17 + 25?\".")
    a, b = _number(body, "a"), _number(body, "b")
    expected = _number(body, "expected")
    if expected is None and a is not None and b is not None:
        expected = a + b
    return _Task(question, expected, int(a) if a is not None else None, int(b) if b is not None else None)


def check_answer(answer: str, expected: float | None) -> float | None:
    """Return 1.0 when `answer` states `expected` as a number, 0.0 when not, None without `expected`."""
    if expected is None:
        return None
    stated = (float(number) for number in _NUMBER.findall(answer.replace(",", "")))
    return 1.0 if any(number == expected for number in stated) else 0.0


def _run_add(arguments: str) -> dict[str, Any]:
    """The `add` tool. Raises ValueError for arguments that are not two integers."""
    try:
        parsed = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        raise ValueError(f"add arguments are not JSON ({exc.msg})") from exc
    if not isinstance(parsed, dict):
        raise ValueError("add arguments are not an object")
    a, b = parsed.get("a"), parsed.get("b")
    if not (isinstance(a, int) and isinstance(b, int)) or isinstance(a, bool) or isinstance(b, bool):
        raise ValueError("add needs integer 'a' and 'b'")
    return {"sum": a + b}


def _model_base_url(model_url: str, body: Mapping[str, Any]) -> str:
    """The SDK base URL of this run: the model server, the run's rollout prefix, then `/v1`."""
    base = model_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base_url_for_run(base, body) + "/v1"


def _assistant_message(message: Mapping[str, Any]) -> dict[str, Any]:
    # Always a string: llama.cpp's chat templates reject an assistant message without content.
    replay: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        replay["tool_calls"] = [
            {"id": call.get("id"), "type": "function", "function": dict(call.get("function") or {})}
            for call in message["tool_calls"]
        ]
    return replay


@dataclass
class _Loop:
    """One run's state: the messages so far, what the tools returned, the last response."""

    messages: list[dict[str, Any]]
    tool_results: list[dict[str, Any]] = field(default_factory=list)
    response: dict[str, Any] | None = None
    turns: int = 0


async def _model_turn(
    client: AsyncOpenAI, config: SimpleAgentConfig, loop: _Loop, main: InvocationRecorder, turn: int
) -> list[dict[str, Any]]:
    """Make one model call; return the tool calls it asked for."""
    options: dict[str, Any] = {"max_tokens": config.max_tokens}
    if config.temperature is not None:
        options["temperature"] = config.temperature
    if turn < config.max_turns - 1:
        options["tools"] = [ADD_TOOL]
        options["tool_choice"] = _FORCE_ADD if turn == 0 else "auto"
    messages: Any = loop.messages  # plain dicts in the SDK's message shapes
    raw = await client.chat.completions.with_raw_response.create(model=config.model, messages=messages, **options)
    response: dict[str, Any] = json.loads(raw.http_response.content)  # exactly what the server sent
    loop.response, loop.turns = response, turn + 1
    if config.model_ref is not None and isinstance(response.get("id"), str):
        main.model_call(model_ref=config.model_ref, response_id=response["id"])
    choices = response.get("choices") or [{}]
    message = choices[0].get("message") or {}
    loop.messages.append(_assistant_message(message))
    return list(message.get("tool_calls") or [])


def _run_tool_call(call: Mapping[str, Any], loop: _Loop, main: InvocationRecorder) -> None:
    """Run one tool call under a timer and append its result for the model."""
    function = call.get("function") or {}
    name, call_id = function.get("name"), str(call.get("id"))
    with main.tool_call(call_id, name) as timer:
        if name == "add":
            try:
                output: dict[str, Any] = _run_add(function.get("arguments") or "")
            except ValueError as exc:
                output = {"error": str(exc)}
                timer.status = "failed"
        else:
            output = {"error": f"unknown tool {name!r}; the only tool is 'add'"}
            timer.status = "failed"
        timer.output = output
    loop.tool_results.append({"call_id": call_id, "name": name, "arguments": function.get("arguments"), "output": output})
    loop.messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps(output)})


async def run_task(client: AsyncOpenAI, config: SimpleAgentConfig, body: Mapping[str, Any]) -> dict[str, Any]:
    """Run one task to its answer and return the `/run` result.

    `client` is any `openai.AsyncOpenAI`; this run's base URL replaces its own. Raises
    TaskError for a body that is not a task, and the SDK's `openai.APIError` when a model call
    fails (with `.observations` set to what was recorded up to then).
    """
    task = _parse_task(body)
    try:
        rollout_id = rollout_id_from_run_body(body)
        model = client.with_options(base_url=_model_base_url(config.model_url, body))
    except ValueError as exc:  # a bad `_ng_*` key, InvalidRolloutIdError included
        raise TaskError(str(exc)) from exc
    recorder = ObservationRecorder(source=AGENT_SOURCE)
    if config.model_ref is None:
        recorder.gap("model_call_reference_unavailable", "the agent was not told the model server's model_ref")
    loop = _Loop([{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.question}])
    try:
        with rollout_context(rollout_id), recorder.invocation("main", agent="simple") as main:
            try:
                for turn in range(config.max_turns):
                    tool_calls = await _model_turn(model, config, loop, main, turn)
                    if not tool_calls:
                        break
                    for call in tool_calls:
                        _run_tool_call(call, loop, main)
            finally:  # what the model saw, also when a call failed midway
                main.items(request_items("chat", {"messages": loop.messages}) or [])
    except Exception as exc:
        exc.observations = recorder.to_dict()  # type: ignore[attr-defined]
        raise
    answer = str(loop.messages[-1].get("content") or "") if loop.messages[-1]["role"] == "assistant" else ""
    reward = check_answer(answer, task.expected)
    result: dict[str, Any] = {key: body[key] for key in _IDENTITY_KEYS if body.get(key) is not None}
    result.update(
        {
            "response": loop.response,
            "reward": reward,
            "resolved": None if reward is None else reward == 1.0,
            "answer": answer,
            "expected": task.expected,
            "tool_correct": any(r["output"].get("sum") == task.expected for r in loop.tool_results),
            "tool_results": loop.tool_results,
            "turns": loop.turns,
            OBSERVATIONS_KEY: recorder.to_dict(),
        }
    )
    return result


def _error(kind: str, message: str, status: int, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message}, **extra}, status_code=status)


def build_app(config: SimpleAgentConfig) -> Starlette:
    """Return the agent as an ASGI app: `POST /run`, and `GET /` describing the agent.

    Usage::

        app = build_app(SimpleAgentConfig(model_url="http://127.0.0.1:8787"))
        uvicorn.run(app, port=8900)
    """
    import openai

    state: dict[str, AsyncOpenAI] = {}

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        state["client"] = openai.AsyncOpenAI(
            base_url=_model_base_url(config.model_url, {}),
            api_key=config.api_key,
            max_retries=config.max_retries,
            timeout=config.request_timeout_s,
            default_headers=dict(config.default_headers) or None,
        )
        try:
            yield
        finally:
            await state.pop("client").close()

    async def run(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return _error("invalid_task", "The /run body is not JSON; send a task object.", 422)
        try:
            result = await run_task(state["client"], config, body)
        except TaskError as exc:
            return _error("invalid_task", str(exc), 422)
        except openai.APIError as exc:
            logger.warning("A model call failed during a run (%s).", type(exc).__name__)
            observations = getattr(exc, "observations", None)
            return _error("model_call_failed", f"{type(exc).__name__}: {exc}", 502, **{OBSERVATIONS_KEY: observations})
        return JSONResponse(result)

    async def describe(_: Request) -> JSONResponse:
        return JSONResponse({"agent": "simple", "model_url": config.model_url, "max_turns": config.max_turns})

    return Starlette(routes=[Route("/run", run, methods=["POST"]), Route("/", describe)], lifespan=lifespan)
