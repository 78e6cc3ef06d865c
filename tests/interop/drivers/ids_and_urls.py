"""Reference driver: the rollout ids and URLs NeMo Gym's own helpers build for run bodies.

Runs in the reference venv. Reads {"bodies": [...], "base_url": str, "path": str} and prints, per
body, the id its correlation function derives from the body as a dict and as its own run-request
model, and what its agent's URL helpers build with evaluation capture on and with training token
capture on. An exception is reported by its class name.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Any

from nemo_gym.base_resources_server import BaseRunRequest
from nemo_gym.base_responses_api_agent import SimpleResponsesAPIAgent
from nemo_gym.rollout_correlation import maybe_rollout_id_from_run_body


class _Agent(SimpleResponsesAPIAgent):
    async def responses(self, body: Any = None) -> Any:
        raise NotImplementedError

    async def run(self, body: Any = None) -> Any:
        raise NotImplementedError


def _agent(token_capture: bool) -> _Agent:
    config = {"observability_enabled": True}
    if token_capture:
        config["token_id_capture"] = {"enabled": True, "all_agents": True}
    return _Agent.model_construct(
        config=SimpleNamespace(token_id_capture=False, name="agent"),
        server_client=SimpleNamespace(global_config_dict=config),
    )


def _outcome(function: Any, *args: Any) -> dict[str, Any]:
    try:
        return {"value": function(*args)}
    except Exception as exc:  # noqa: BLE001 - the class name is the answer
        return {"error": type(exc).__name__}


def main() -> None:
    request = json.load(sys.stdin)
    eval_agent, token_agent = _agent(False), _agent(True)
    results = []
    for body in request["bodies"]:
        model = _outcome(lambda b: BaseRunRequest.model_validate({**b, "responses_create_params": {"input": "hi"}}), body)
        results.append(
            {
                "dict_id": _outcome(maybe_rollout_id_from_run_body, body),
                "model_id": _outcome(maybe_rollout_id_from_run_body, model["value"]) if "value" in model else model,
                "url_path": _outcome(eval_agent.url_path_for_run, request["path"], body),
                "token_url_path": _outcome(token_agent.url_path_for_run, request["path"], body),
                "base_url": _outcome(eval_agent.base_url_for_run, request["base_url"], body),
                "token_base_url": _outcome(token_agent.base_url_for_run, request["base_url"], body),
            }
        )
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
