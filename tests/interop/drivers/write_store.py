"""Reference driver: NeMo Gym's own capture middleware and store write a capture directory.

Runs in the reference venv. Reads {"capture_dir": str, "model_server_name": str, "calls": [...]},
each call {"path", "request_body", "status", "content_type", "response_body"}: a tiny ASGI model
server answers each with the given bytes, behind the reference's `_CaptureMiddleware`, driven by
httpx over ASGI. Prints what each client received.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx
from nemo_gym.base_responses_api_model import CaptureStore, _CaptureMiddleware


def _model_server(calls: list[dict[str, Any]]) -> Any:
    by_path = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        call = by_path[scope["path"]].pop(0)
        headers = [(b"content-type", call["content_type"].encode())]
        await send({"type": "http.response.start", "status": call["status"], "headers": headers})
        await send({"type": "http.response.body", "body": call["response_body"].encode(), "more_body": False})

    for call in calls:
        inner = "/" + call["path"].split("/", 3)[3]  # what the middleware routes once it strips the prefix
        by_path.setdefault(inner, []).append(call)
    return app


async def main() -> None:
    request = json.load(sys.stdin)
    store = CaptureStore(request["capture_dir"])
    app = _CaptureMiddleware(_model_server(request["calls"]), store=store, model_server_name=request["model_server_name"])
    received = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://model") as client:
        for call in request["calls"]:
            answer = await client.post(
                call["path"], content=call["request_body"].encode(), headers={"content-type": "application/json"}
            )
            received.append({"status": answer.status_code, "body": answer.text})
    json.dump(received, sys.stdout)


if __name__ == "__main__":
    asyncio.run(main())
