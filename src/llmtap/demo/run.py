"""The main job, end to end on this machine: a real local model, `llmtap serve` in front of it,
and a small tool-using agent run under two rollout ids, then each rollout's calls and metrics.

Nothing here needs an API key or the network: the model is Gemma 3 270M served by llama.cpp.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from ..cli.display import calls_table, metrics_line
from ..correlation import base_url_for_run
from ..store import CaptureStore
from ..store.readers import aggregate_model_call_metrics, read_rollout_calls
from .agent import ADD_TOOL
from .localmodel import LocalModelServer

__all__ = ["AgentRun", "ServeProcess", "run_demo", "run_tool_agent"]

@dataclass
class AgentRun:
    """What the demo agent did in one rollout: the tool results and the final answer."""

    rollout_id: str
    tool_results: list[dict[str, Any]] = field(default_factory=list)
    answer: str = ""


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class ServeProcess:
    """`llmtap serve` run as its own process, the way a user runs it, stopped on exit."""

    def __init__(self, upstream: str, capture_dir: Path, *, port: int | None = None) -> None:
        self.port = port or _free_port()
        self.command = [
            sys.executable, "-m", "llmtap", "serve",
            "--upstream", upstream,
            "--capture-dir", str(capture_dir),
            "--model-ref", "policy_model",
            "--port", str(self.port),
        ]  # fmt: skip
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServeProcess:
        self._process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        with httpx.Client(trust_env=False, timeout=2) as client:
            while True:
                if self._process.poll() is not None:
                    output = self._process.stderr.read().decode(errors="replace") if self._process.stderr else ""
                    raise RuntimeError(f"llmtap serve exited during start-up:\n{output[-2000:]}")
                try:
                    client.get(self.base_url + "/v1/models")
                    return self
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"llmtap serve did not answer on {self.base_url} within 30 s.") from None
                    time.sleep(0.1)

    def __exit__(self, *exc_info: object) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            if self._process.stderr:
                self._process.stderr.close()


def _stream_turn(client: Any, messages: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
    """Run one streamed chat turn and return the assistant message it produced."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    stream = client.chat.completions.create(model="gemma", messages=messages, stream=True, **options)
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                content.append(delta.content)
            for tool_call in delta.tool_calls or []:
                slot = calls.setdefault(tool_call.index or 0, {"id": None, "name": "", "arguments": ""})
                slot["id"] = tool_call.id or slot["id"]
                if tool_call.function is not None:
                    slot["name"] = tool_call.function.name or slot["name"]
                    slot["arguments"] += tool_call.function.arguments or ""
    # Always a string: llama.cpp's chat templates reject an assistant message without content.
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for _, c in sorted(calls.items())
        ]
    return message


def run_tool_agent(proxy_url: str, rollout_id: str, question: tuple[int, int]) -> AgentRun:
    """A small agent: ask, force a tool call, run the tool, feed the result back, get the answer.

    Every model call goes through `proxy_url` under the rollout's `/ng-rollout/` prefix, made by
    the real `openai` SDK: two streamed turns (the forced tool call, the answer to its result)
    and a last non-streamed one.
    """
    import openai

    run = AgentRun(rollout_id)
    base_url = base_url_for_run(proxy_url, {"_ng_rollout_id": rollout_id}) + "/v1"
    a, b = question
    with openai.OpenAI(base_url=base_url, api_key="no-key-needed", max_retries=0) as client:
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"What is {a} + {b}? Use the add tool."}]
        reply = _stream_turn(
            client, messages, tools=[ADD_TOOL], tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=48
        )
        messages.append(reply)
        for call in reply.get("tool_calls", []):
            result: dict[str, Any]
            try:
                arguments = json.loads(call["function"]["arguments"] or "{}")
                result = {"sum": int(arguments.get("a", 0)) + int(arguments.get("b", 0))}
            except (ValueError, TypeError, AttributeError) as exc:
                result = {"error": f"bad arguments: {type(exc).__name__}"}
            run.tool_results.append({"call_id": call["id"], "arguments": call["function"]["arguments"], "result": result})
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})
        final = _stream_turn(client, messages, max_tokens=40)
        messages.append(final)
        messages.append({"role": "user", "content": "Say that answer again in one short sentence."})
        # One call without streaming: llama.cpp reports usage only there, so the record shows
        # real token counts beside the streamed calls' unknown (null, never 0) ones.
        again = client.chat.completions.create(model="gemma", messages=messages, max_tokens=32)
        run.answer = (again.choices[0].message.content or final["content"]).strip()
    return run


def run_demo(capture_dir: Path | None = None, *, console: Console | None = None) -> dict[str, dict[str, Any]]:
    """Start the local model and `llmtap serve`, run the agent under two rollouts, print what was captured.

    Returns each rollout's metrics. The capture directory defaults to `./.llmtap/demo-calls`.
    """
    console = console or Console()
    capture_dir = (capture_dir or Path(".llmtap/demo-calls")).resolve()
    capture_dir.mkdir(parents=True, exist_ok=True)
    store = CaptureStore(capture_dir)
    rollouts = {"demo-0": (17, 25), "demo-1": (40, 2)}
    for rollout_id in rollouts:
        store.clear(rollout_id)
    console.print("[bold]llmtap demo[/]: starting the local model (Gemma 3 270M on llama.cpp)...")
    with LocalModelServer() as model:
        console.print(f"model at {model.base_url}; starting llmtap serve in front of it...")
        with ServeProcess(model.base_url, capture_dir) as serve:
            console.print(f"llmtap serve at {serve.base_url}, capturing into {capture_dir}\n")
            runs = [run_tool_agent(serve.base_url, rollout_id, q) for rollout_id, q in rollouts.items()]
    metrics: dict[str, dict[str, Any]] = {}
    for run in runs:
        calls = read_rollout_calls(store, run.rollout_id)
        metrics[run.rollout_id] = aggregate_model_call_metrics(calls.records)
        console.print(calls_table(f"rollout {run.rollout_id}  (agent answered: {run.answer!r})", calls.records))
        for tool in run.tool_results:
            console.print(f"  tool add({tool['arguments']}) -> {tool['result']}")
        console.print("  " + metrics_line(metrics[run.rollout_id]) + "\n")
    console.print(f"Raw records: {capture_dir}/<rollout>.capture.jsonl  (llmtap records show {capture_dir} demo-0)")
    store.close()
    return metrics
