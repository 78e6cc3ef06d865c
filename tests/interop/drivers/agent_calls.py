"""Reference driver: model calls made the way NeMo Gym's agents make them, to a given server.

Runs in the reference venv. Reads {"server_url": str, "calls": [...]}, each call {"body": run
body, "token_capture": bool, "via": "sdk" | "url_path", "path": dialect path, "request": JSON}.
The URL comes from the reference agent's own helpers (`base_url_for_run` for an SDK client, the
openai SDK; `url_path_for_run` for a raw POST with httpx), with evaluation capture on and, for
`token_capture`, training token capture on for every agent. Prints each call's URL and answer.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Any

import httpx
import openai
from nemo_gym.base_responses_api_agent import SimpleResponsesAPIAgent


class _Agent(SimpleResponsesAPIAgent):
    async def responses(self, body: Any = None) -> Any:
        raise NotImplementedError

    async def run(self, body: Any = None) -> Any:
        raise NotImplementedError


def _agent(token_capture: bool) -> _Agent:
    config: dict[str, Any] = {"observability_enabled": True}
    if token_capture:
        config["token_id_capture"] = {"enabled": True, "all_agents": True}
    return _Agent.model_construct(
        config=SimpleNamespace(token_id_capture=False, name="agent"),
        server_client=SimpleNamespace(global_config_dict=config),
    )


def _sdk_call(base_url: str, path: str, request: dict[str, Any]) -> dict[str, Any]:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    if path == "/v1/chat/completions":
        raw = client.chat.completions.with_raw_response.create(**request)
    else:
        raw = client.responses.with_raw_response.create(**request)
    return {"status": raw.status_code, "body": raw.http_response.json()}


def main() -> None:
    request = json.load(sys.stdin)
    results = []
    for call in request["calls"]:
        agent = _agent(call["token_capture"])
        if call["via"] == "sdk":
            base_url = agent.base_url_for_run(request["server_url"], call["body"])
            answer = _sdk_call(base_url, call["path"], call["request"])
            url = f"{base_url}/v1"
        else:
            url = request["server_url"] + agent.url_path_for_run(call["path"], call["body"])
            response = httpx.post(url, json=call["request"], timeout=60)
            streamed = response.headers.get("content-type", "").startswith("text/event-stream")
            answer = {"status": response.status_code, "body": response.text if streamed else response.json()}
        results.append({"url": url, **answer})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
