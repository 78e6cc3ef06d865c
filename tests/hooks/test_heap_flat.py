"""Long programs: captured calls leave nothing behind, so the heap stays flat however many calls run.

Each scenario makes a few thousand sequential calls inside a capture and compares the live
objects (`gc.get_objects()`) after 200 calls with those after 1,200, the collector left at its
defaults. Objects still waiting in the young generations for the next collection make the count
swing by about a thousand from one call to the next, so each side takes the lowest count seen
over a few calls. When a finalizer made the collector keep each httpx response (see
`llmtap.hooks.httpx._finish_collected`), that floor rose by 6,000 to 19,000 objects over 1,800 calls.

The upstream runs in a child process, so no server thread allocates here while the heap is
counted.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from llmtap.capture import capture
from llmtap.hooks.registry import load_registry, vendored_registry_path
from llmtap.hooks.session import CapturedCall, CaptureSession
from llmtap.spool.frame import KIND_CALL, scan_frames
from llmtap.spool.writer import SpoolWriter, spool_directory
from tests.fixtures import fixture
from tests.hooks.conftest import recorded_lines, session_in_use

JSON_FIXTURE = fixture("chat/text-basic-gpt4o")
STREAM_FIXTURE = fixture("chat/text-stream-include-usage-gpt4")
WARM_UP_CALLS = 50
EARLY_CALLS = 200
LATE_CALLS = 1_200
TOTAL_CALLS = WARM_UP_CALLS + LATE_CALLS
WINDOW = 25  # calls over which the lowest live-object count is taken
# Objects; about half an object per call between the two counts. Without capture, the same
# openai-over-httpx loop grows by ~220 here (responses promoted while in flight); when captured
# calls piled up until a full collection, the growth was 6,000 to 19,000.
ALLOWED_GROWTH = 1_000

# Answers every POST with the recorded JSON body, or the recorded event stream (chunked) when
# the request asks for `"stream": true`; prints its port, and ends when its stdin closes.
_UPSTREAM = r"""
import json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

json_body, stream_body = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
pieces = [stream_body[i:i + 200] for i in range(0, len(stream_body), 200)]

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else each small write waits for the client's delayed ACK

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        self.send_response(200)
        if request.get("stream"):
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for piece in pieces:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(json_body)))
            self.end_headers()
            self.wfile.write(json_body)

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
threading.Thread(target=server.serve_forever, daemon=True).start()
print(server.server_address[1], flush=True)
sys.stdin.read()
"""


@pytest.fixture(scope="module")
def upstream_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL (`http://127.0.0.1:<port>/v1`) of an upstream serving recorded answers from a child process."""
    bodies = tmp_path_factory.mktemp("bodies")
    (bodies / "json").write_bytes(JSON_FIXTURE.body_bytes)
    (bodies / "stream").write_bytes(STREAM_FIXTURE.body_bytes)
    command = [sys.executable, "-c", _UPSTREAM, str(bodies / "json"), str(bodies / "stream")]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdin is not None and child.stdout is not None
        try:
            port = int(child.stdout.readline())
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            child.stdin.close()  # the child's cue to end
            child.wait(timeout=10)


@pytest.fixture
def spool_session(tmp_path: Path) -> Iterator[CaptureSession]:
    """A capture like the one `llmtap run` starts in each process: every call becomes a spool frame."""
    yield from session_in_use(
        CaptureSession(
            tmp_path / "calls",
            registry=load_registry(vendored_registry_path()),
            spool=SpoolWriter(spool_directory(tmp_path)),
        )
    )


def _spooled_calls(session: CaptureSession) -> int:
    assert session.spool is not None
    frames = scan_frames(Path(session.spool.path).read_bytes(), final=True).frames
    return sum(1 for frame in frames if frame.kind == KIND_CALL)


def _floor_of_live_objects(call: Callable[[], Any], settle: Callable[[], Any]) -> int:
    """The fewest live objects seen over WINDOW more calls: young garbage not yet collected is left out."""
    counts = []
    for _ in range(WINDOW):
        call()
        settle()
        counts.append(len(gc.get_objects()))
    return min(counts)


def _growth_between_early_and_late(call: Callable[[], Any], settle: Callable[[], Any] = lambda: None) -> int:
    """Make LATE_CALLS + WARM_UP_CALLS calls; the rise in live objects from call EARLY_CALLS to LATE_CALLS."""
    for _ in range(WARM_UP_CALLS):
        call()
    gc.collect()  # start from a clean heap; the collector keeps its default settings throughout
    for _ in range(EARLY_CALLS - WINDOW):
        call()
    early = _floor_of_live_objects(call, settle)
    for _ in range(LATE_CALLS - EARLY_CALLS - WINDOW):
        call()
    late = _floor_of_live_objects(call, settle)
    return late - early


def _post(client: Any, url: str) -> Callable[[], Any]:
    def call() -> Any:
        response = client.post(url, json=JSON_FIXTURE.request_json)
        assert response.content == JSON_FIXTURE.body_bytes
        return response

    return call


def _stream(client: Any, url: str) -> Callable[[], Any]:
    def call() -> Any:
        with client.stream("POST", url, json=STREAM_FIXTURE.request_json) as response:
            assert b"".join(response.iter_bytes()) == STREAM_FIXTURE.body_bytes
        return response

    return call


@pytest.fixture(autouse=True)
def _default_collector() -> None:
    assert gc.isenabled() and gc.get_threshold() == (700, 10, 10), "these tests need the collector at its defaults"


@pytest.mark.parametrize("style", [_post, _stream], ids=["post", "stream"])
def test_the_heap_stays_flat_over_thousands_of_spooled_httpx_calls(
    style: Callable[[Any, str], Callable[[], Any]], spool_session: CaptureSession, upstream_url: str
) -> None:
    with httpx.Client() as client:
        growth = _growth_between_early_and_late(style(client, upstream_url + "/chat/completions"))
    assert growth <= ALLOWED_GROWTH
    assert _spooled_calls(spool_session) == TOTAL_CALLS


@pytest.mark.parametrize("style", [_post, _stream], ids=["post", "stream"])
def test_responses_kept_by_the_caller_do_not_keep_their_finished_calls_alive(
    style: Callable[[Any, str], Callable[[], Any]], spool_session: CaptureSession, upstream_url: str
) -> None:
    finished: list[weakref.ref[CapturedCall]] = []
    build_frame = spool_session.frame_builder

    def noting_build_frame(call: CapturedCall) -> list[bytes]:
        finished.append(weakref.ref(call))
        return build_frame(call)

    spool_session.frame_builder = noting_build_frame
    with httpx.Client() as client:
        kept = [style(client, upstream_url + "/chat/completions")() for _ in range(20)]
    assert len(kept) == len(finished) == _spooled_calls(spool_session) == 20
    assert [ref() for ref in finished] == [None] * 20


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_the_heap_stays_flat_over_thousands_of_spooled_openai_sdk_calls(
    stream: bool, spool_session: CaptureSession, upstream_url: str
) -> None:
    # Over an httpx client (what openai 1.x builds; 3.x accepts one, though typed for httpx2): its
    # response and stream refer to each other, the case that piled up; httpx2 has no such cycle.
    http_client = httpx.Client()
    client = openai.OpenAI(
        base_url=upstream_url,
        api_key="unused",
        max_retries=0,
        http_client=http_client,  # type: ignore[arg-type]
    )
    request = dict(STREAM_FIXTURE.request_json if stream else JSON_FIXTURE.request_json)

    def call() -> None:
        if stream:
            assert sum(1 for _ in client.chat.completions.create(**request)) > 1
        else:
            assert client.chat.completions.create(**request).choices

    with http_client:
        growth = _growth_between_early_and_late(call)
    assert growth <= ALLOWED_GROWTH
    assert _spooled_calls(spool_session) == TOTAL_CALLS


def test_the_heap_stays_flat_over_thousands_of_calls_inside_llmtap_capture(tmp_path: Path, upstream_url: str) -> None:
    with capture(runs_dir=tmp_path) as running, httpx.Client() as client:
        session = running.session
        assert session is not None
        # Records are built on the writer's thread: count once the queued ones are written.
        growth = _growth_between_early_and_late(_post(client, upstream_url + "/chat/completions"), session.flush)
        assert len(recorded_lines(session)) == TOTAL_CALLS
    assert growth <= ALLOWED_GROWTH
