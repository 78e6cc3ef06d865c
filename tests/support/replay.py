"""A replay upstream: serves the recorded real exchanges byte for byte over loopback.

Which recording answers a request:

1. the header `x-replay-fixture: <dialect>/<name>` (for example `chat/text-basic-gpt4o`), or else
2. the one recording whose `request.json` equals the request body as JSON (key order ignored),
   among the recordings whose `request.path` ends the request path (so a base URL may carry a
   prefix such as `/ng-rollout/r1`).

No match, an ambiguous match, or a recording recorded for another path gives a 404 JSON body
`{"error": {"type": "replay_no_match", "message": ...}}` whose message names the problem.

The answer is the recorded status, the recorded content-type and `body_text` encoded as UTF-8.
JSON bodies go out in one piece with a content-length; event streams go out chunked, cut at
arbitrary byte offsets (mid-line, even mid-character) into several pieces with `piece_delay`
seconds between them, so that stream reassembly downstream really runs. The cuts are derived
from `seed` and the recording's id, so a failing test sees the same pieces when re-run.

Every request is kept in `received`, so tests can check a call reached upstream exactly once.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from tests.fixtures import RecordedExchange, all_fixtures
from tests.support.servers import ServerThread, StopsOnExit

__all__ = ["FIXTURE_HEADER", "ReceivedRequest", "ReplayUpstream", "split_into_pieces"]

FIXTURE_HEADER = "x-replay-fixture"


@dataclass(frozen=True)
class ReceivedRequest:
    """One request as the replay upstream received it, and the recording that answered it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    fixture_id: str | None


class _NoMatch(Exception):
    """Raised inside the app when no single recording answers a request."""


def split_into_pieces(body: bytes, rng: random.Random, *, min_pieces: int = 3, max_pieces: int = 8) -> list[bytes]:
    """Cut `body` at random byte offsets into between `min_pieces` and `max_pieces` non-empty pieces.

    The pieces always join back to `body`; a body shorter than `min_pieces` bytes is cut at
    every byte.
    """
    if len(body) <= 1:
        return [body]
    wanted = min(rng.randint(min_pieces, max_pieces), len(body))
    cuts = sorted(rng.sample(range(1, len(body)), wanted - 1))
    edges = [0, *cuts, len(body)]
    return [body[start:end] for start, end in zip(edges, edges[1:])]


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class ReplayUpstream(StopsOnExit):
    """An ASGI app answering with recorded exchanges; `start()` serves it on loopback.

    Usage::

        with ReplayUpstream().start() as upstream:
            client = openai.OpenAI(base_url=upstream.base_url + "/v1", api_key="unused")
            client.chat.completions.create(**fixture("chat/text-basic-gpt4o").request_json)
            assert upstream.request_count == 1
    """

    def __init__(
        self,
        fixtures: Iterable[RecordedExchange] | None = None,
        *,
        piece_delay: float = 0.005,
        min_pieces: int = 3,
        max_pieces: int = 8,
        seed: int = 0,
    ) -> None:
        chosen = all_fixtures() if fixtures is None else fixtures
        self.fixtures: dict[str, RecordedExchange] = {recorded.id: recorded for recorded in chosen}
        self.piece_delay = piece_delay
        self.min_pieces = min_pieces
        self.max_pieces = max_pieces
        self.seed = seed
        self.received: list[ReceivedRequest] = []
        self._by_request: dict[str, list[RecordedExchange]] = {}
        for recorded in self.fixtures.values():
            self._by_request.setdefault(_canonical_json(recorded.request_json), []).append(recorded)
        self._server: ServerThread | None = None

    # --- hosting ---------------------------------------------------------------------------

    def start(self, port: int = 0) -> ReplayUpstream:
        """Serve this app with uvicorn on loopback; returns self once it accepts connections."""
        if self._server is not None:
            raise RuntimeError("This replay upstream is already running; stop it before starting it again.")
        self._server = ServerThread(self, port=port).start()
        return self

    def stop(self) -> None:
        """Stop serving; safe to call when not running."""
        if self._server is not None:
            self._server.stop()
            self._server = None

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:<port>`; SDKs want `base_url + "/v1"`."""
        if self._server is None:
            raise RuntimeError("This replay upstream is not running; call start() first.")
        return self._server.base_url

    # --- what it saw -------------------------------------------------------------------------

    @property
    def request_count(self) -> int:
        return len(self.received)

    def count_for(self, fixture_id: str) -> int:
        """How many received requests were answered with the recording `fixture_id`."""
        return sum(1 for request in self.received if request.fixture_id == fixture_id)

    def reset(self) -> None:
        """Forget the requests received so far."""
        self.received.clear()

    def pieces_for(self, recorded: RecordedExchange) -> list[bytes]:
        """The pieces a stream recording is sent in (one piece for a JSON body)."""
        body = recorded.body_bytes
        if not recorded.is_stream:
            return [body]
        rng = random.Random(f"{self.seed}:{recorded.id}")
        return split_into_pieces(body, rng, min_pieces=self.min_pieces, max_pieces=self.max_pieces)

    # --- the ASGI app ------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await _read_body(receive)
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        path: str = scope["path"]
        try:
            recorded = self._select(path, headers, body)
        except _NoMatch as problem:
            self.received.append(ReceivedRequest(scope["method"], path, headers, body, None))
            await _send_error(send, str(problem))
            return
        self.received.append(ReceivedRequest(scope["method"], path, headers, body, recorded.id))
        await self._send_recorded(send, recorded)

    def _select(self, path: str, headers: dict[str, str], body: bytes) -> RecordedExchange:
        named = headers.get(FIXTURE_HEADER)
        if named is not None:
            recorded = self.fixtures.get(named)
            if recorded is None:
                raise _NoMatch(
                    f"Replay fixture {named!r} named by {FIXTURE_HEADER} does not exist; "
                    "use '<dialect>/<name>' as listed in fixtures/recorded/INDEX.md."
                )
            if not path.endswith(recorded.request_path):
                raise _NoMatch(
                    f"Replay fixture {named!r} was recorded for {recorded.request_path!r}, "
                    f"but the request went to {path!r}; fix the client's base URL."
                )
            return recorded
        try:
            request_json = json.loads(body)
        except ValueError:
            raise _NoMatch(
                f"The request body to {path!r} is not JSON, so no recording matches it; "
                f"send JSON or name a fixture with the {FIXTURE_HEADER} header."
            ) from None
        matches = [
            recorded
            for recorded in self._by_request.get(_canonical_json(request_json), [])
            if path.endswith(recorded.request_path)
        ]
        if not matches:
            raise _NoMatch(
                f"No recording for {path!r} has a request equal to this body; send a fixture's "
                f"request_json unchanged or name the fixture with the {FIXTURE_HEADER} header."
            )
        if len(matches) > 1:
            names = ", ".join(sorted(m.id for m in matches))
            raise _NoMatch(
                f"The request to {path!r} matches several recordings ({names}); "
                f"name one with the {FIXTURE_HEADER} header."
            )
        return matches[0]

    async def _send_recorded(self, send: Send, recorded: RecordedExchange) -> None:
        pieces = self.pieces_for(recorded)
        headers = [(b"content-type", recorded.content_type.encode("latin-1"))]
        if not recorded.is_stream:
            headers.append((b"content-length", str(len(recorded.body_bytes)).encode("ascii")))
        await send({"type": "http.response.start", "status": recorded.status, "headers": headers})
        try:
            for index, piece in enumerate(pieces):
                if index and self.piece_delay:
                    await asyncio.sleep(self.piece_delay)
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            return  # the client went away mid-stream; nothing left to serve


async def _read_body(receive: Receive) -> bytes:
    parts: list[bytes] = []
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(parts)


async def _send_error(send: Send, message: str) -> None:
    body = json.dumps({"error": {"type": "replay_no_match", "message": message}}).encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": 404,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode("ascii"))],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
