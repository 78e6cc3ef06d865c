"""Rollout collection against real servers on loopback: a small Starlette agent whose model calls go
through `llmtap serve` to the replay upstream (recorded real exchanges), and the reference agent."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from llmtap.correlation import base_url_for_run
from llmtap.rollouts.collect import CollectError, CollectReport, collect_rollouts, collect_rollouts_async
from llmtap.rollouts.collect.files import attempts_path_for
from llmtap.store import CaptureStore
from llmtap.store.readers import read_rollout_calls
from tests.e2e.serve_harness import serving
from tests.fixtures import fixture
from tests.support.replay import FIXTURE_HEADER, ReplayUpstream
from tests.support.servers import ServerThread

TEXT_FIXTURE = "chat/text-basic-gpt4o"


@dataclass
class TinyAgent:
    """A real agent server: one model call through the proxy per run; the task row picks a behaviour.

    `answer` (default) calls the model and returns its response; `fail` answers 500, `reject` 422,
    `not_json` plain text, `hang` sleeps; `hang_first` calls the model and then hangs on its first
    attempt, and answers on a retry (a run carrying `_ng_attempt_index`); `cookie` answers with a
    session cookie, as agents behind a load balancer or with session middleware do. The `cookie`
    header of every run is kept in `cookies`.
    """

    proxy_url: str
    bodies: list[dict[str, Any]] = field(default_factory=list)
    cookies: list[str | None] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    hanging: threading.Event = field(default_factory=threading.Event)
    wait_for_peers: int = 0

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/run", self.run, methods=["POST"]), Route("/", self.describe)])

    async def describe(self, request: Request) -> Response:
        return JSONResponse({"agent": "tiny"})

    async def run(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        self.cookies.append(request.headers.get("cookie"))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._behave(body)
        finally:
            self.in_flight -= 1

    async def _behave(self, body: dict[str, Any]) -> Response:
        for _ in range(200):  # let the runs a concurrency test expects arrive together (10 s at most)
            if self.in_flight >= self.wait_for_peers:
                break
            await asyncio.sleep(0.05)
        behaviour = body.get("behaviour", "answer")
        if behaviour == "fail":
            return JSONResponse({"error": "the agent broke"}, status_code=500)
        if behaviour == "reject":
            return JSONResponse({"error": "not a task I know"}, status_code=422)
        if behaviour == "not_json":
            return PlainTextResponse("this is not JSON")
        if behaviour == "cookie":
            answer = JSONResponse({"response": None, "reward": 0.0})
            answer.set_cookie("agent_session", body.get("question", "x"))
            return answer
        if behaviour == "hang":
            await asyncio.sleep(30)
        response = await self._call_model(body)
        if behaviour == "hang_first" and "_ng_attempt_index" not in body:
            self.hanging.set()
            await asyncio.sleep(30)
        return JSONResponse({"response": response, "reward": 1.0, "answer": response["choices"][0]["message"]["content"]})

    async def _call_model(self, body: dict[str, Any]) -> dict[str, Any]:
        url = base_url_for_run(self.proxy_url, body) + "/v1/chat/completions"
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            answer = await client.post(url, json=fixture(TEXT_FIXTURE).request_json, headers={FIXTURE_HEADER: TEXT_FIXTURE})
        answer.raise_for_status()
        result: dict[str, Any] = answer.json()
        return result


@dataclass
class Setup:
    agent: TinyAgent
    agent_url: str
    capture_dir: Path
    store: CaptureStore
    tmp: Path

    def tasks(self, rows: list[dict[str, Any]]) -> Path:
        path = self.tmp / "tasks.jsonl"
        path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
        return path

    def collect(self, tasks: Path, **options: Any) -> CollectReport:
        options.setdefault("concurrency", 4)
        return collect_rollouts(tasks, self.tmp / "rollouts.jsonl", agent_url=self.agent_url, capture_dir=self.capture_dir, **options)

    def rows(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in (self.tmp / "rollouts.jsonl").read_bytes().splitlines()]

    def events(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in attempts_path_for(self.tmp / "rollouts.jsonl").read_bytes().splitlines()]


@pytest.fixture
def setup(replay_upstream: ReplayUpstream, tmp_path: Path) -> Iterator[Setup]:
    capture_dir = tmp_path / "calls"
    with serving(replay_upstream.base_url, capture_dir) as (proxy, _):
        agent = TinyAgent(proxy.base_url)
        with ServerThread(agent.app()).start() as server:
            store = CaptureStore(capture_dir)
            yield Setup(agent, server.base_url, capture_dir, store, tmp_path)
            store.close()


def by_id(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["ng_model_call_capture"]["rollout_id"]: row for row in rows}


def test_every_rollout_gets_a_row_with_its_own_call_attached_and_attributed(setup: Setup) -> None:
    tasks = setup.tasks([{"question": "q0", "extra": [1, 2]}, {"question": "q1"}])
    report = setup.collect(tasks, num_repeats=2)
    assert (report.succeeded, report.failed, report.interrupted) == (4, 0, False)
    rows = by_id(setup.rows())
    assert sorted(rows) == ["0-0", "0-1", "1-0", "1-1"]
    for rollout_id, row in rows.items():
        [call] = read_rollout_calls(setup.store, rollout_id).records
        capture = row["ng_model_call_capture"]
        assert [c["model_call_id"] for c in capture["calls"]] == [call.model_call_id]
        assert capture["metrics"]["num_calls"] == 1 and capture["metrics"]["tokens_total"] == call.tokens_total
        assert capture["attribution"]["model_call_id"] == call.model_call_id
        assert row["response"] == call.response  # the agent's result is kept unchanged
        assert row["reward"] == 1.0 and row["ng_trajectory"]["rollout_id"] == rollout_id
    sent = {(b["_ng_task_index"], b["_ng_rollout_index"]): b for b in setup.agent.bodies}
    assert sent[(0, 1)]["extra"] == [1, 2] and "_ng_attempt_index" not in sent[(0, 1)]


def test_a_stale_capture_of_the_attempt_id_is_cleared_before_dispatch(setup: Setup) -> None:
    stale = dict(read_or_make_record(setup))
    setup.store.append("0-0", stale)
    assert len(read_rollout_calls(setup.store, "0-0").records) == 1
    setup.collect(setup.tasks([{"question": "q0"}]))
    [row] = setup.rows()
    [call] = row["ng_model_call_capture"]["calls"]
    assert call["model_call_id"] != stale["model_call_id"]


def read_or_make_record(setup: Setup) -> dict[str, Any]:
    """A real captured record, made by one collection into a scratch rollout."""
    scratch = setup.tmp / "scratch"
    scratch.mkdir()
    tasks = scratch / "t.jsonl"
    tasks.write_bytes(orjson.dumps({"question": "x", "_ng_rollout_id": "scratch"}) + b"\n")
    collect_rollouts(tasks, scratch / "out.jsonl", agent_url=setup.agent_url, capture_dir=setup.capture_dir)
    return dict(setup.store.read("scratch").entries[0][1])


def test_agent_errors_timeouts_and_bad_answers_become_rows_and_the_run_goes_on(setup: Setup) -> None:
    tasks = setup.tasks(
        [{"behaviour": "fail"}, {"behaviour": "reject"}, {"behaviour": "not_json"}, {"behaviour": "hang"}, {"question": "ok"}]
    )
    report = setup.collect(tasks, timeout_s=1.0)
    assert report.succeeded == 1 and report.failed == 4
    assert report.error_counts == {"agent_http_error": 2, "invalid_result": 1, "timeout": 1}
    errors: dict[int, Any] = {row["_ng_task_index"]: row.get("ng_collect_error") for row in setup.rows()}
    assert errors[0]["status_code"] == 500 and errors[0]["retryable"] is True and "the agent broke" in errors[0]["body"]
    assert errors[1]["status_code"] == 422 and errors[1]["retryable"] is False
    assert errors[2]["type"] == "invalid_result" and errors[3]["type"] == "timeout"
    assert errors[4] is None
    failed_rows = [row for row in setup.rows() if row.get("ng_collect_error")]
    assert all(row["ng_model_call_capture"]["gaps"][0]["code"] == "model_call_capture_no_records" for row in failed_rows)


def test_resume_retries_failed_rows_under_a_new_attempt_id_and_keeps_finished_ones(setup: Setup) -> None:
    tasks = setup.tasks([{"question": "ok"}, {"behaviour": "fail"}, {"behaviour": "reject"}])
    setup.collect(tasks)
    tasks.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in [{"question": "ok"}, {"question": "fixed"}, {"behaviour": "reject"}]))
    setup.agent.bodies.clear()
    report = setup.collect(tasks, resume=True)
    assert (report.already_done, report.to_dispatch, report.succeeded) == (2, 1, 1)  # done, and a 4xx kept
    [retry] = setup.agent.bodies
    assert retry["_ng_task_index"] == 1 and retry["_ng_attempt_index"] == 1
    rows = setup.rows()
    assert sorted(r["_ng_task_index"] for r in rows) == [0, 1, 2]  # the failed row was replaced, not duplicated
    retried = next(r for r in rows if r["_ng_task_index"] == 1)
    assert retried["_ng_attempt_index"] == 1 and retried["ng_model_call_capture"]["rollout_id"] == "1-0-a1"
    assert "ng_collect_error" not in retried


def test_resume_stops_retrying_after_max_attempts(setup: Setup) -> None:
    tasks = setup.tasks([{"behaviour": "fail"}])
    setup.collect(tasks, max_attempts=2)
    setup.collect(tasks, max_attempts=2, resume=True)
    report = setup.collect(tasks, max_attempts=2, resume=True)
    assert report.to_dispatch == 0 and len(setup.agent.bodies) == 2
    [row] = setup.rows()
    assert row["_ng_attempt_index"] == 1 and row["ng_collect_error"]["attempt_index"] == 1


async def test_an_interrupted_run_resumes_without_losing_rows_or_mixing_the_killed_attempt(setup: Setup) -> None:
    tasks = setup.tasks([{"question": "q0"}, {"behaviour": "hang_first"}, {"question": "q2"}])
    output = setup.tmp / "rollouts.jsonl"
    report = CollectReport(output, attempts_path_for(output))
    run = asyncio.create_task(
        collect_rollouts_async(tasks, output, agent_url=setup.agent_url, capture_dir=setup.capture_dir, concurrency=3, report=report)
    )
    while not (setup.agent.hanging.is_set() and report.finished == 2):
        await asyncio.sleep(0.02)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert report.interrupted and len(setup.rows()) == 2
    [killed_call] = read_rollout_calls(setup.store, "1-0").records  # the killed attempt's call stays on disk
    resumed = await collect_rollouts_async(tasks, output, agent_url=setup.agent_url, capture_dir=setup.capture_dir, resume=True)
    assert (resumed.already_done, resumed.succeeded) == (2, 1)
    rows = by_id(setup.rows())
    assert sorted(rows) == ["0-0", "1-0-a1", "2-0"]
    attached = [c["model_call_id"] for row in rows.values() for c in row["ng_model_call_capture"]["calls"]]
    assert killed_call.model_call_id not in attached
    dispatches = [e for e in setup.events() if e["event"] == "dispatch" and e["key"] == "1-0"]
    assert [e["rollout_id"] for e in dispatches] == ["1-0", "1-0-a1"]


def test_limit_repeats_and_concurrency_bound_what_is_sent(setup: Setup) -> None:
    setup.agent.wait_for_peers = 2
    tasks = setup.tasks([{"question": f"q{i}"} for i in range(5)])
    report = setup.collect(tasks, limit=3, num_repeats=2, concurrency=2)
    assert report.planned == 6 and report.succeeded == 6
    assert sorted((b["_ng_task_index"], b["_ng_rollout_index"]) for b in setup.agent.bodies) == [
        (t, r) for t in range(3) for r in range(2)
    ]
    assert setup.agent.max_in_flight == 2


def test_sampling_values_and_explicit_ids_reach_the_agent(setup: Setup) -> None:
    tasks = setup.tasks([{"question": "q", "_ng_rollout_id": "job-7"}, {"question": "r", "_ng_model_sampling": {"top_p": 0.5}}])
    setup.collect(tasks, model_sampling={"temperature": 0.25})
    sent = {b["question"]: b for b in setup.agent.bodies}
    assert sent["q"]["_ng_rollout_id"] == "job-7" and sent["q"]["_ng_model_sampling"] == {"temperature": 0.25}
    assert sent["r"]["_ng_model_sampling"] == {"top_p": 0.5}
    rows = by_id(setup.rows())
    assert rows["job-7"]["_ng_rollout_id"] == "job-7" and rows["job-7"]["ng_model_call_capture"]["metrics"]["num_calls"] == 1
    [explicit_call] = read_rollout_calls(setup.store, "job-7").records
    [own_call] = read_rollout_calls(setup.store, "1-0").records
    assert explicit_call.request is not None and explicit_call.request["temperature"] == 0.25
    assert own_call.request is not None and own_call.request["top_p"] == 0.5


def test_an_existing_output_is_not_overwritten_without_resume_or_overwrite(setup: Setup) -> None:
    tasks = setup.tasks([{"question": "q"}])
    setup.collect(tasks)
    with pytest.raises(CollectError, match="--resume"):
        setup.collect(tasks)
    assert setup.collect(tasks, overwrite=True).succeeded == 1 and len(setup.rows()) == 1


def test_bad_plans_fail_before_anything_is_sent(setup: Setup) -> None:
    repeated_id = setup.tasks([{"question": "q", "_ng_rollout_id": "same"}])
    with pytest.raises(CollectError, match="share one capture"):
        setup.collect(repeated_id, num_repeats=2)
    broken = setup.tmp / "broken.jsonl"
    broken.write_bytes(b'{"question": "q"}\n{not json\n')
    with pytest.raises(CollectError, match="Line 2"):
        setup.collect(broken)
    assert setup.agent.bodies == []


def test_an_unreachable_agent_is_reported_before_any_row(setup: Setup, tmp_path: Path) -> None:
    tasks = setup.tasks([{"question": "q"}])
    with pytest.raises(CollectError, match="Nothing answered"):
        collect_rollouts(tasks, tmp_path / "out.jsonl", agent_url="http://127.0.0.1:9", capture_dir=setup.capture_dir)


def test_the_reference_agent_routes_its_calls_and_reports_its_observations(replay_upstream: ReplayUpstream, tmp_path: Path) -> None:
    from llmtap.demo.agent import SimpleAgentConfig, build_app

    capture_dir = tmp_path / "calls"
    with serving(replay_upstream.base_url, capture_dir) as (proxy, _):
        config = SimpleAgentConfig(
            model_url=proxy.base_url,
            model_ref={"type": "responses_api_models", "name": "policy"},
            default_headers={FIXTURE_HEADER: TEXT_FIXTURE},
        )
        server = ServerThread(build_app(config))
        server._server.config.lifespan = "on"  # the agent opens its SDK client at start-up
        with server.start():
            tasks = tmp_path / "tasks.jsonl"
            tasks.write_bytes(orjson.dumps({"question": "What is 17 + 25?", "a": 17, "b": 25, "expected": 42}) + b"\n")
            report = collect_rollouts(tasks, tmp_path / "out.jsonl", agent_url=server.base_url, capture_dir=capture_dir)
    assert report.succeeded == 1
    [row] = [orjson.loads(line) for line in (tmp_path / "out.jsonl").read_bytes().splitlines()]
    [call] = read_rollout_calls(CaptureStore(capture_dir), "0-0").records
    assert row["response"] == call.response and row["turns"] == 1  # the recorded answer asks for no tool
    assert row["reward"] == 0.0 and row["resolved"] is False  # "Oi!" does not state 42
    assert row["ng_model_call_capture"]["attribution"]["model_call_id"] == call.model_call_id
    [invocation] = [r for r in row["ng_agent_observations"]["records"] if r["kind"] == "agent_invocation"]
    assert [ref["model_call_id"] for ref in invocation["model_calls"]] == [call.model_call_id]  # joined exactly
    assert [item["text"] for item in invocation["conversation"]][-1] == "Oi!"


def test_the_collect_and_attach_commands_write_attached_rows(setup: Setup) -> None:
    from click.testing import CliRunner

    from llmtap.cli.collect import attach, collect

    tasks = setup.tasks([{"question": "q0"}, {"question": "q1"}])
    plain = setup.tmp / "plain.jsonl"
    runner = CliRunner()
    args = ["--agent-url", setup.agent_url, "--input", str(tasks), "--output", str(plain), "--no-progress"]
    result = runner.invoke(collect, [*args, "++observability_enabled=false"])
    assert result.exit_code == 0, result.output
    assert "2 rollouts written: 2 ok" in result.output
    assert all("ng_model_call_capture" not in orjson.loads(line) for line in plain.read_bytes().splitlines())
    again = runner.invoke(collect, args)
    assert again.exit_code == 1 and "already holds rows" in again.output
    attached = setup.tmp / "attached.jsonl"
    result = runner.invoke(attach, [str(plain), "--capture-dir", str(setup.capture_dir), "--output", str(attached)])
    assert result.exit_code == 0, result.output
    for line in attached.read_bytes().splitlines():
        row = orjson.loads(line)
        [call] = read_rollout_calls(setup.store, row["ng_model_call_capture"]["rollout_id"]).records
        assert row["ng_model_call_capture"]["attribution"]["model_call_id"] == call.model_call_id


COLLECT_COMMAND = [sys.executable, "-c", "from llmtap.cli.collect import collect; collect(prog_name='llmtap collect')"]


def _as_a_foreground_command() -> None:
    """Ctrl-C reaches a command run in the foreground; a shell's background jobs (a test run
    started with `&`) ignore SIGINT, and their children would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_interrupting_the_command_leaves_a_resumable_output(setup: Setup, signum: int) -> None:
    tasks = setup.tasks([{"question": "q0"}, {"behaviour": "hang_first"}])
    output = setup.tmp / "rollouts.jsonl"
    args = ["--agent-url", setup.agent_url, "--input", str(tasks), "--output", str(output), "--capture-dir", str(setup.capture_dir)]
    process = subprocess.Popen([*COLLECT_COMMAND, *args, "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, preexec_fn=_as_a_foreground_command)
    try:
        deadline = time.monotonic() + 30
        while not (setup.agent.hanging.is_set() and output.exists() and output.read_bytes().count(b"\n") == 1):
            assert time.monotonic() < deadline and process.poll() is None, process.stderr.read() if process.stderr else ""
            time.sleep(0.05)
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130 and "--resume" in stderr
    resumed = subprocess.run([*COLLECT_COMMAND, *args, "--resume", "--no-progress"], capture_output=True, text=True, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(by_id(setup.rows())) == ["0-0", "1-0-a1"]


def test_a_torn_last_row_is_dropped_on_resume_and_its_rollout_sent_again(setup: Setup) -> None:
    tasks = setup.tasks([{"question": "q0"}, {"question": "q1"}])
    setup.collect(tasks, concurrency=1)
    output = setup.tmp / "rollouts.jsonl"
    whole = output.read_bytes()
    output.write_bytes(whole[: len(whole) - 40])  # a kill in the middle of the last write
    report = setup.collect(tasks, resume=True)
    assert (report.already_done, report.dropped_lines, report.succeeded) == (1, 1, 1)
    assert sorted(by_id(setup.rows())) == ["0-0", "1-0-a1"]


def test_a_cookie_one_rollouts_agent_answer_sets_never_reaches_another_rollout(setup: Setup) -> None:
    """The runs share one HTTP client: a session cookie from one run's answer must not ride along
    on the next run's request (the agent would take it for the same session)."""
    tasks = setup.tasks([{"behaviour": "cookie", "question": f"q{k}"} for k in range(4)])
    setup.collect(tasks, concurrency=1)
    assert len(setup.agent.cookies) == 4 and setup.agent.cookies == [None] * 4
