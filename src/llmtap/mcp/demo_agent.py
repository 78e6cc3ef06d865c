"""The reference agent with its tool served over MCP: `add(a, b)` runs in an MCP server, not in the agent.

The same arithmetic task loop as `llmtap.demo.agent` (the first turn forces the tool, the last
offers none), but each tool call the model asks for is made with the `mcp` SDK's own client to a
streamable-HTTP MCP server, through `llmtap mcp-proxy --upstream ... --capture-dir DIR` at
`<mcp_url base>/ng-rollout/<rollout_id>/mcp`, so the proxy files the call beside the rollout's
model calls. The agent reports no tool observations of its own: the trajectory's tool attempts
take their status and timing from the MCP records (`rollouts.wire_tools`).

    python -m llmtap.mcp.demo_agent server PORT      # the MCP server with the `add` tool

`build_app(config, mcp_url)` returns the agent's ASGI app (`POST /run`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from llmtap.demo.agent import ADD_TOOL, SYSTEM_PROMPT, check_answer

__all__ = ["ADD_TOOL", "McpAgentConfig", "build_app", "main", "mcp_url_for_run"]



class McpAgentConfig:
    """Where the agent's model and its MCP tools are; `max_turns` counts model calls (the last offers no tool)."""

    def __init__(self, model_url: str, mcp_url: str, *, max_turns: int = 3, max_tokens: int = 24) -> None:
        if max_turns < 2:
            raise ValueError(f"max_turns is {max_turns}; use 2 or more, so a tool result can reach the model.")
        self.model_url = model_url.rstrip("/")
        self.mcp_url = mcp_url.rstrip("/")
        self.max_turns = max_turns
        self.max_tokens = max_tokens


def mcp_url_for_run(mcp_url: str, rollout_id: str | None) -> str:
    """The MCP endpoint of one run: `/ng-rollout/<id>` put before the endpoint's path."""
    from urllib.parse import urlsplit, urlunsplit

    if rollout_id is None:
        return mcp_url
    parts = urlsplit(mcp_url)
    return urlunsplit(parts._replace(path=f"/ng-rollout/{rollout_id}{parts.path}"))


async def _call_tool(url: str, name: str, arguments: str) -> tuple[str, bool]:
    """Run one tool call over MCP; returns (text for the model, is_error). Arguments that are not JSON go as `{}`."""
    from mcp import Client

    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:  # a small model's cut-off arguments: the server says what is wrong with them
        parsed = {}
    async with Client(url, mode="legacy") as client:
        result = await client.call_tool(name, parsed if isinstance(parsed, dict) else {})
    text = "".join(getattr(item, "text", "") for item in result.content)
    return text, bool(result.is_error)


async def run_task(client: Any, config: McpAgentConfig, body: Mapping[str, Any]) -> dict[str, Any]:
    """Run one task; the result carries `response` (the last model response as sent), `reward` and `turns`."""
    from llmtap.correlation import base_url_for_run, rollout_id_from_run_body

    question = body.get("question")
    if not isinstance(question, str):
        raise ValueError("The task has no 'question' string.")
    rollout_id = rollout_id_from_run_body(body)
    model = client.with_options(base_url=base_url_for_run(config.model_url, body) + "/v1")
    tools_url = mcp_url_for_run(config.mcp_url, rollout_id)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
    response: dict[str, Any] = {}
    turns = 0
    for turn in range(config.max_turns):
        options: dict[str, Any] = {"max_tokens": config.max_tokens}
        if turn < config.max_turns - 1:
            options["tools"] = [ADD_TOOL]
            options["tool_choice"] = {"type": "function", "function": {"name": "add"}} if turn == 0 else "auto"
        raw = await model.chat.completions.with_raw_response.create(model="default", messages=messages, **options)
        response = json.loads(raw.http_response.content)
        turns = turn + 1
        message = (response.get("choices") or [{}])[0].get("message") or {}
        calls = list(message.get("tool_calls") or [])
        replay: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
        if calls:
            replay["tool_calls"] = [{"id": c.get("id"), "type": "function", "function": dict(c.get("function") or {})} for c in calls]
        messages.append(replay)
        if not calls:
            break
        for call in calls:
            function = call.get("function") or {}
            text, _ = await _call_tool(tools_url, str(function.get("name")), function.get("arguments") or "")
            messages.append({"role": "tool", "tool_call_id": str(call.get("id")), "content": text})
    answer = str(messages[-1].get("content") or "") if messages[-1]["role"] == "assistant" else ""
    expected = body.get("expected")
    reward = check_answer(answer, float(expected)) if isinstance(expected, (int, float)) else None
    keys = ("_ng_task_index", "_ng_rollout_index", "_ng_attempt_index", "_ng_rollout_id")
    return {**{k: body[k] for k in keys if body.get(k) is not None}, "response": response, "reward": reward, "turns": turns}


def build_app(config: McpAgentConfig) -> Starlette:
    """The agent as an ASGI app: `POST /run` with a task row."""
    import openai

    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        state["client"] = openai.AsyncOpenAI(base_url=config.model_url + "/v1", api_key="no-key-needed", max_retries=0)
        try:
            yield
        finally:
            await state.pop("client").close()

    async def run(request: Request) -> JSONResponse:
        try:
            body = await request.json()
            return JSONResponse(await run_task(state["client"], config, body))
        except ValueError as exc:
            return JSONResponse({"error": {"type": "invalid_task", "message": str(exc)}}, status_code=422)
        except openai.APIError as exc:
            return JSONResponse({"error": {"type": "model_call_failed", "message": type(exc).__name__}}, status_code=502)

    return Starlette(routes=[Route("/run", run, methods=["POST"])], lifespan=lifespan)


def main(argv: list[str] | None = None) -> None:
    """`server PORT`: serve the `add` tool over streamable HTTP on 127.0.0.1."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "server" or not args[1].isdigit():
        raise SystemExit("usage: python -m llmtap.mcp.demo_agent server PORT")
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("llmtap-demo-tools")

    @server.tool()
    def add(a: int, b: int) -> str:
        """Add two integers and return their sum."""
        return json.dumps({"sum": a + b})

    server.run("streamable-http", host="127.0.0.1", port=int(args[1]))


if __name__ == "__main__":
    main()
