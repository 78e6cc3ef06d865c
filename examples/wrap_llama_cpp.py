"""Capture every call of an existing ASGI model server: llama.cpp's own FastAPI app, wrapped in-process.

    python examples/wrap_llama_cpp.py /abs/model.gguf /abs/model-calls --port 8080

Agents then call `http://127.0.0.1:8080/ng-rollout/<rollout_id>/v1/chat/completions` (an SDK's
base_url of `http://127.0.0.1:8080/ng-rollout/<rollout_id>/v1`); the prefix is stripped before
llama.cpp routes the call, and each call lands in `<capture_dir>/<rollout_id>.capture.jsonl`.
"""

from __future__ import annotations

import argparse
from typing import Any

from llmtap import CaptureMiddleware, CaptureStore


def build_app(model_path: str, capture_dir: str, *, n_ctx: int = 2048) -> Any:
    """llama.cpp's server app, unchanged, inside llmtap's capture middleware."""
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    model_server = create_app(
        server_settings=ServerSettings(host="127.0.0.1"),
        model_settings=[ModelSettings(model=model_path, chat_format="gemma", n_ctx=n_ctx, verbose=False)],
    )
    return CaptureMiddleware(
        model_server,
        store=CaptureStore(capture_dir),
        model_ref={"type": "responses_api_models", "name": "policy_model"},
    )


if __name__ == "__main__":
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_path")
    parser.add_argument("capture_dir")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    uvicorn.run(build_app(args.model_path, args.capture_dir), host="127.0.0.1", port=args.port)
