"""`llmtap mcp-proxy -- CMD` with the real `mcp` SDK: bytes unchanged, one record per call, the exit code passed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp_types import ElicitResult

from llmtap.mcp import parse_tool_call_line

from .conftest import TEE, proxy_command, server_command

ELICITED = "correct-horse-battery"


async def _elicit(context: Any, params: Any) -> ElicitResult:
    return ElicitResult(action="accept", content={"code": ELICITED})


async def _session(command: list[str], mode: str) -> list[Any]:
    """One scripted session over stdio with the SDK's own client; returns what each call gave."""
    params = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    async with Client(params, mode=mode, elicitation_callback=_elicit) as client:  # type: ignore[arg-type]
        return [
            await client.list_tools(),
            await client.call_tool("echo", {"text": "héllo"}),
            await client.call_tool("fail", {"reason": "no"}),
            await client.call_tool("slow", {"seconds": 0.2}),
            await client.call_tool("big", {"size": 200_000}),
            await client.call_tool("ask_secret", {}),
            await client.read_resource("note://hello"),
            await client.get_prompt("greet", {"name": "Ada"}),
        ]


def _records(path: Path) -> list[dict[str, Any]]:
    lines = path.read_bytes().splitlines()
    for line in lines:
        parse_tool_call_line(line)  # every line is a record this version reads
    return [json.loads(line) for line in lines]


def _tool_calls(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [record for record in records if record["method"] == "tools/call"]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_every_byte_passes_unchanged_and_each_call_is_recorded_once(mode: str, tmp_path: Path) -> None:
    record = tmp_path / "calls.jsonl"
    client_side, server_side = str(tmp_path / "client"), str(tmp_path / "server")
    command = [
        sys.executable,
        TEE,
        client_side,
        "--",
        *proxy_command("--record", str(record), "--", sys.executable, TEE, server_side, "--", *server_command()),
    ]
    results = await _session(command, mode)

    # What the client sent is what the server received, and the other way round, byte for byte.
    assert Path(client_side + ".in").read_bytes() == Path(server_side + ".in").read_bytes()
    assert Path(server_side + ".out").read_bytes() == Path(client_side + ".out").read_bytes()
    assert results[1].content[0].text == "héllo"
    assert len(results[4].content[0].text) == 200_000

    records = _records(record)
    era = "handshake" if mode == "legacy" else "stateless"
    assert {r["protocol"]["era"] for r in records} == {era}
    assert all(r["server"] == {"name": "llmtap-test-tools", "version": ""} for r in records)
    calls = _tool_calls(records)
    final = [c for c in calls if c["status"] != "input_required"]
    assert [c["name"] for c in final] == ["echo", "fail", "slow", "big", "ask_secret"]
    echo, fail, slow, big, ask = final
    assert echo["status"] == "completed" and echo["is_error"] is False
    assert echo["arguments"] == {"text": "héllo"}
    assert echo["result"]["content"] == [{"type": "text", "text": "héllo"}]
    assert fail["status"] == "failed" and fail["is_error"] is True and fail["error"]["category"] == "tool_error"
    assert "failed on purpose: no" in fail["result"]["content"][0]["text"]
    assert slow["duration_ms"] >= 200 and slow["completed_at"] > slow["started_at"]
    # A large result is kept in part, with its full size.
    assert big["result"]["content_truncated"] is True
    assert big["result"]["content"][0]["llmtap_text_chars"] == 200_000
    assert big["result"]["result_bytes"] > 400_000 and big["response_bytes"] > 400_000
    assert ask["status"] == "completed" and ask["result"]["content"][0]["text"] == f"got {len(ELICITED)} characters"
    assert {r["method"] for r in records} >= {"tools/list", "resources/read", "prompts/get"}
    assert [r["name"] for r in records if r["method"] == "resources/read"] == ["note://hello"]
    # The elicited value never lands on disk, only a keyed digest of it.
    assert ELICITED not in record.read_text()
    if mode == "legacy":
        (elicitation,) = [r for r in records if r["method"] == "elicitation/create"]
        assert elicitation["direction"] == "server_to_client"
        assert elicitation["result"]["action"] == "accept"
        assert elicitation["result"]["content_digest"].startswith("hmac-sha256:")
    else:
        (asked,) = [c for c in calls if c["status"] == "input_required"]
        assert ask["retry"] == {
            "of": asked["call_id"],
            "original": asked["call_id"],
            "round": 1,
            "linked_by": "request_state",
        }
        assert ask["input"]["responses"][0]["method"] == "elicitation/create"
        assert ask["input"]["responses"][0]["content_digest"].startswith("hmac-sha256:")


async def test_a_proxied_session_is_byte_identical_to_a_direct_one(tmp_path: Path) -> None:
    direct, proxied = str(tmp_path / "direct"), str(tmp_path / "proxied")
    await _session([sys.executable, TEE, direct, "--", *server_command()], "legacy")
    await _session([sys.executable, TEE, proxied, "--", *proxy_command("--", *server_command())], "legacy")
    assert Path(direct + ".in").read_bytes() == Path(proxied + ".in").read_bytes()
    assert Path(direct + ".out").read_bytes() == Path(proxied + ".out").read_bytes()


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


HANDSHAKE = _line(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}},
    }
) + _line({"jsonrpc": "2.0", "method": "notifications/initialized"})


def _read_reply(process: subprocess.Popen[bytes], wanted_id: int) -> dict[str, Any]:
    assert process.stdout is not None
    while True:
        line = process.stdout.readline()
        assert line, "the proxy closed its stdout before answering"
        message = json.loads(line)
        if message.get("id") == wanted_id:
            return message  # type: ignore[no-any-return]


def test_a_server_that_crashes_mid_call_leaves_the_call_recorded_as_failed_and_its_exit_code(tmp_path: Path) -> None:
    record = tmp_path / "calls.jsonl"
    with subprocess.Popen(
        proxy_command("--record", str(record), "--", *server_command()),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as process:
        assert process.stdin is not None
        process.stdin.write(HANDSHAKE)
        process.stdin.flush()
        assert _read_reply(process, 1)["result"]["serverInfo"]["name"] == "llmtap-test-tools"
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "crash", "arguments": {}}}
        process.stdin.write(_line(call))
        process.stdin.flush()
        assert process.wait(timeout=60) == 3
    (crashed,) = _records(record)
    assert crashed["name"] == "crash" and crashed["status"] == "failed"
    assert crashed["error"] == {"category": "server_exited", "exit_code": 3}
    assert crashed["completed_at"] is not None


def test_the_server_exit_code_is_llmtaps(tmp_path: Path) -> None:
    code = subprocess.run(
        proxy_command("--", sys.executable, "-c", "import sys; sys.exit(7)"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    ).returncode
    assert code == 7


def test_the_server_stderr_passes_through(tmp_path: Path) -> None:
    done = subprocess.run(
        proxy_command("--", sys.executable, "-c", "import sys; sys.stderr.write('server log line\\n')"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and b"server log line\n" in done.stderr and done.stdout == b""


def test_a_missing_server_command_exits_127_with_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        proxy_command("--", str(tmp_path / "no-such-server")),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 127
    assert b"was not found" in done.stderr and b"Traceback" not in done.stderr


def test_a_malformed_line_passes_through_and_is_counted(tmp_path: Path) -> None:
    payload = b"this is not json\n" + _line({"jsonrpc": "2.0", "id": 9, "method": "ping"}) + b'{"half": \n'
    done = subprocess.run(
        proxy_command(
            "--", sys.executable, "-c", "import sys, shutil; shutil.copyfileobj(sys.stdin.buffer, sys.stdout.buffer)"
        ),
        input=payload,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0
    assert done.stdout == payload
    # Each bad line is seen once per direction (the echo server sends it back).
    assert b"4 malformed line(s) passed through" in done.stderr


def test_a_huge_line_is_bounded_in_the_record_and_passed_whole(tmp_path: Path) -> None:
    record = tmp_path / "calls.jsonl"
    with subprocess.Popen(
        proxy_command("--record", str(record), "--max-message-bytes", "4096", "--", *server_command()),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as process:
        assert process.stdin is not None
        process.stdin.write(
            HANDSHAKE
            + _line(
                {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "tools/call",
                    "params": {"name": "big", "arguments": {"size": 100_000}},
                }
            )
        )
        process.stdin.flush()
        reply = _read_reply(process, 2)
        assert reply["result"]["content"][0]["text"] == "x" * 100_000
        process.stdin.close()
        assert process.wait(timeout=60) == 0
    (big,) = _records(record)
    assert big["status"] == "unknown"
    assert big["result"] == {"result_bytes": None, "oversized": True}
    assert big["response_bytes"] > 100_000
    assert record.stat().st_size < 4096


def test_a_client_that_goes_away_ends_the_session_cleanly(tmp_path: Path) -> None:
    with subprocess.Popen(
        proxy_command("--", *server_command()), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as process:
        assert process.stdin is not None and process.stdout is not None
        process.stdout.close()  # the client stops reading: the next answer cannot be written
        process.stdin.write(HANDSHAKE)
        process.stdin.flush()
        # The proxy ends the whole session (the server's stdin is closed and it exits), not one direction.
        assert process.wait(timeout=60) in (0, 128 + signal.SIGTERM)


def test_signals_are_forwarded_to_the_server(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    server = (
        "import signal, sys, time, pathlib\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\n"
        f"pathlib.Path({str(ready)!r}).touch()\n"
        "time.sleep(120)\n"
    )
    with subprocess.Popen(
        proxy_command("--", sys.executable, "-c", server),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as process:
        while not ready.exists() and process.poll() is None:
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 42


ECHO_CALL = _line(
    {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "a"}}}
)


def _echo_session(args: list[str], env: dict[str, str]) -> tuple[int, bytes]:
    """Handshake, one echo call answered, then the client closes: the exit code and the proxy's stderr."""
    with subprocess.Popen(
        proxy_command(*args, "--", *server_command()),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    ) as process:
        assert process.stdin is not None and process.stderr is not None
        process.stdin.write(HANDSHAKE + ECHO_CALL)
        process.stdin.flush()
        _read_reply(process, 2)
        process.stdin.close()
        code = process.wait(timeout=60)
        return code, process.stderr.read()


def test_without_a_record_file_calls_are_counted_and_it_says_so_once(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "LLMTAP_TOOL_CALLS_FILE"}
    code, stderr = _echo_session([], env)
    assert code == 0
    assert stderr.count(b"counted, not kept") == 1
    assert b"1 MCP request(s) counted (no --record file)" in stderr


def test_the_record_file_comes_from_the_environment(tmp_path: Path) -> None:
    record = tmp_path / "from-env.jsonl"
    code, _ = _echo_session(["--rollout-id", "7-0"], {**os.environ, "LLMTAP_TOOL_CALLS_FILE": str(record)})
    assert code == 0
    (echo,) = _records(record)
    assert echo["rollout_id"] == "7-0" and echo["result"]["content"] == [{"type": "text", "text": "a"}]


def test_a_record_path_that_is_a_link_is_refused_before_the_server_starts(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("")
    link = tmp_path / "calls.jsonl"
    link.symlink_to(target)
    marker = tmp_path / "started"
    done = subprocess.run(
        proxy_command("--record", str(link), "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and b"not a link" in done.stderr
    assert not marker.exists() and target.read_text() == ""


class _FullDisk:
    def write(self, records: object) -> None:
        raise OSError(28, "No space left on device")

    def close(self) -> None:
        return None


@pytest.mark.parametrize("failure", ["sink", "recorder"])
async def test_a_recording_failure_never_breaks_the_session(failure: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmtap.mcp.pairing import Pairing
    from llmtap.mcp.recorder import Recorder
    from llmtap.mcp.stdio_proxy import proxy_stdio

    said: list[str] = []
    recorder = Recorder(_FullDisk() if failure == "sink" else None, say=said.append)
    if failure == "recorder":

        def broken(*args: object) -> list[object]:
            raise RuntimeError("a recorder bug")

        monkeypatch.setattr(Pairing, "observe", broken)
    to_proxy_read, to_proxy_write = os.pipe()
    from_proxy_read, from_proxy_write = os.pipe()
    session = asyncio.create_task(
        proxy_stdio(server_command(), recorder=recorder, client_in=to_proxy_read, client_out=from_proxy_write)
    )
    os.write(to_proxy_write, HANDSHAKE + ECHO_CALL)
    replies: list[dict[str, Any]] = []
    buffer = b""
    while not any(reply.get("id") == 2 for reply in replies):
        chunk = await asyncio.to_thread(os.read, from_proxy_read, 65536)
        assert chunk, "the session ended before the call was answered"
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        replies += [json.loads(line) for line in lines if line]
    os.close(to_proxy_write)
    assert await asyncio.wait_for(session, 60) == 0
    recorder.close()
    for fd in (to_proxy_read, from_proxy_read, from_proxy_write):
        os.close(fd)
    (echo,) = [reply for reply in replies if reply.get("id") == 2]
    assert echo["result"]["content"] == [{"type": "text", "text": "a"}]
    if failure == "sink":
        assert recorder.counts.dropped == 1 and any("could not write" in text for text in said)
    else:
        assert recorder.counts.recorder_errors > 0 and any("recording failed" in text for text in said)
