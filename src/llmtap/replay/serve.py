"""`llmtap serve --replay CAPSULE_OR_DIR`: the proxy answers from a recording, for agents in any language.

`ReplayTransport` implements the proxy's upstream seam (`server.upstream.UpstreamTransport`):
instead of sending a request it asks the recording (the same `Replayer` and matching as the
in-process replay), per rollout, and answers with the recorded status, headers and body (streams
event by event, at the recorded pace scaled by `speed`). Nothing is sent anywhere: a request
the recording does not hold gets a 404 JSON error of type `replay_miss` whose message names the
closest recorded call and the differing fields (with `x-should-retry: false`, which the openai
and anthropic SDKs honour, so a miss is not retried).

The rollout a request belongs to is its `/ng-rollout/<id>` prefix, which the capture middleware
strips before the proxy sees the request; `RolloutNoting`, in front of the middleware, notes it
for the request's task. A request without the prefix is looked up under rollout `default`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from ..correlation.rollout import split_rollout_prefix
from ..errors import InvalidRolloutIdError
from .answers import RecordedAnswer
from .live import Replayer, ReplayMissError
from .matching import RecordingIndex

__all__ = ["ReplayTransport", "RolloutNoting", "build_replay_app"]

DEFAULT_ROLLOUT = "default"
MISS_STATUS = 404
_ROLLOUT: ContextVar[str] = ContextVar("llmtap_replay_rollout", default=DEFAULT_ROLLOUT)


class _RecordedResponse:
    """A recorded answer in the shape of an upstream response (`server.upstream.UpstreamResponse`)."""

    def __init__(self, answer: RecordedAnswer) -> None:
        self.status = answer.status
        self.headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in answer.headers]
        self._answer = answer

    async def chunks(self) -> AsyncIterator[bytes]:
        for delay, chunk in self._answer.chunks:
            if delay > 0:
                await asyncio.sleep(delay)
            if chunk:
                yield chunk

    async def aclose(self) -> None:
        return None


def _miss_answer(error: ReplayMissError) -> RecordedAnswer:
    payload = orjson.dumps(
        {"error": {"type": "replay_miss", "message": error.miss.describe(), "miss": error.miss.to_dict()}}
    )
    headers = (
        ("content-type", "application/json"),
        ("content-length", str(len(payload))),
        ("x-should-retry", "false"),
        ("x-llmtap-replay", "miss"),
    )
    return RecordedAnswer(MISS_STATUS, headers, ((0.0, payload),), False)


class ReplayTransport:
    """An `UpstreamTransport` that answers every request from a recording and sends nothing."""

    def __init__(self, replayer: Replayer) -> None:
        self.replayer = replayer

    async def send(self, method: str, url: str, headers: list[tuple[bytes, bytes]], body: bytes) -> _RecordedResponse:
        try:
            answer = self.replayer.answer(_ROLLOUT.get(), urlsplit(url).path, body)
        except ReplayMissError as error:
            answer = _miss_answer(error)
        assert answer is not None  # on_miss is "error": a miss raised above
        return _RecordedResponse(answer)

    async def aclose(self) -> None:
        return None


class RolloutNoting:
    """ASGI shim: notes a request's `/ng-rollout/<id>` for `ReplayTransport` before the middleware strips it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        raw = scope.get("raw_path")
        path = raw.decode("latin-1") if isinstance(raw, bytes) and raw else str(scope.get("path", ""))
        try:
            rollout_id, _ = split_rollout_prefix(path)
        except InvalidRolloutIdError:
            rollout_id = None  # the capture middleware answers it with a 400
        token = _ROLLOUT.set(rollout_id or DEFAULT_ROLLOUT)
        try:
            await self.app(scope, receive, send)
        finally:
            _ROLLOUT.reset(token)


def build_replay_app(config: Any, recording: str | Path, *, speed: float = 0.0, events_path: Path | None = None) -> Any:
    """The `llmtap serve` app with every upstream's transport replaced by one `ReplayTransport` over `recording`."""
    from ..server.proxy import build_app

    replayer = Replayer(RecordingIndex.from_path(Path(recording)), speed=speed, events_path=events_path)
    transport = ReplayTransport(replayer)
    app = build_app(config)
    proxy = app.app  # type: ignore[attr-defined]  # CaptureMiddleware(ProxyApp)
    for upstream in proxy.upstreams.values():
        upstream.transport = transport
    return RolloutNoting(app)


def serve_replay(config: Any, recording: str | Path, *, speed: float = 0.0) -> None:
    """Serve the replaying proxy until interrupted (one process: the recording's served calls are counted in it)."""
    import sys

    import uvicorn

    from ..server.run import prepare_server_process, uvicorn_config

    app = build_replay_app(config, recording, speed=speed)
    prepare_server_process()
    print(f"llmtap serve on http://{config.host}:{config.port}  replaying: {recording}  (nothing is sent upstream)", file=sys.stderr, flush=True)
    uvicorn.Server(uvicorn_config(config, app)).run()
