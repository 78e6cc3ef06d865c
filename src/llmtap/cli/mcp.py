"""`llmtap mcp-proxy`: record an agent's MCP tool calls, on stdio (`-- CMD ...`) or streamable HTTP (`--upstream`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..mcp.recorder import Recorder

__all__ = ["mcp_proxy"]

RECORD_ENV = "LLMTAP_TOOL_CALLS_FILE"


@click.command("mcp-proxy", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--record",
    "record_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"Append tool-call records (JSONL) to FILE (default: ${RECORD_ENV}; unset: only counted).",
)
@click.option(
    "--capsule",
    "capsule_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Spool records into this `llmtap run` capsule's tool-calls.jsonl (default under `llmtap run`: its capsule).",
)
@click.option(
    "--capture-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Store records beside each rollout's model calls in this capture directory (<rollout_id>.tool-calls.jsonl).",
)
@click.option("--upstream", help="URL of a streamable-HTTP MCP server endpoint, e.g. http://127.0.0.1:8000/mcp.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8790,
    show_default=True,
    help="Port on 127.0.0.1 for --upstream mode (0: any free port).",
)
@click.option("--rollout-id", help="Rollout id to put on every record.")
@click.option(
    "--max-message-bytes",
    type=click.IntRange(min=1024),
    default=None,
    help="Longest message kept for recording (longer ones pass through, cut in the record).",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1024),
    default=None,
    help="Largest request body accepted in --upstream mode (larger: 413).",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def mcp_proxy(
    record_path: Path | None,
    capsule_dir: Path | None,
    capture_dir: Path | None,
    upstream: str | None,
    port: int,
    rollout_id: str | None,
    max_message_bytes: int | None,
    max_body_bytes: int | None,
    command: tuple[str, ...],
) -> None:
    """Pass an MCP session through unchanged and record each tool call, by JSON-RPC id, with timings.

    Stdio: llmtap mcp-proxy --record calls.jsonl -- python server.py (the server's exit code is
    llmtap's). HTTP: llmtap mcp-proxy --upstream http://127.0.0.1:8000/mcp --port 8790, then point
    the client at http://127.0.0.1:8790/mcp (or /ng-rollout/<id>/mcp to set the rollout id).
    """
    from ..errors import LlmtapError
    from ..mcp.capsule_sink import CapsuleToolCallSink, capsule_root_from_environment
    from ..mcp.recorder import Recorder
    from ..mcp.records import FanOutToolCallSink, JsonlToolCallSink, ToolCallSink
    from ..store import validate_rollout_id
    from ..store.tool_calls import RolloutToolCallSink

    if command and upstream:
        raise click.UsageError("Give a server command after '--' (stdio) or --upstream URL (HTTP), not both.")
    if not command and not upstream:
        raise click.UsageError("Give the MCP server's command after '--' (stdio), or --upstream URL (streamable HTTP).")
    if rollout_id is not None:
        try:
            validate_rollout_id(rollout_id)
        except LlmtapError as exc:
            raise click.BadParameter(str(exc), param_hint="--rollout-id") from None
    env_path = os.environ.get(RECORD_ENV) or None
    path = record_path if record_path is not None else (Path(env_path) if env_path else None)
    capsule = capsule_dir if capsule_dir is not None else capsule_root_from_environment()
    sinks: list[ToolCallSink] = []
    try:
        if path is not None:
            file_sink = JsonlToolCallSink(path)
            file_sink.open()
            sinks.append(file_sink)
        if capsule is not None:
            capsule_sink = CapsuleToolCallSink(capsule)
            capsule_sink.open()
            sinks.append(capsule_sink)
        if capture_dir is not None:
            rollout_sink = RolloutToolCallSink(capture_dir)
            rollout_sink.open()
            sinks.append(rollout_sink)
    except LlmtapError as exc:
        raise click.ClickException(str(exc)) from None
    recorder = Recorder(sinks[0] if len(sinks) == 1 else FanOutToolCallSink(sinks) if sinks else None)
    if not sinks:
        recorder.notice(
            "no_file",
            f"no --record, --capsule or --capture-dir and ${RECORD_ENV} is unset: tool calls are counted, not kept",
        )
    limits = {} if max_message_bytes is None else {"max_message_bytes": max_message_bytes}
    if command:
        code = _run_stdio(list(command), recorder, rollout_id, limits)
    else:
        assert upstream is not None
        code = _run_http(upstream, port, recorder, rollout_id, limits, max_body_bytes)
    click.echo(recorder.summary(), err=True)
    sys.exit(code)


def _run_stdio(command: list[str], recorder: Recorder, rollout_id: str | None, limits: dict[str, int]) -> int:
    from ..mcp.pairing import SessionIdentity
    from ..mcp.stdio_proxy import run_stdio_proxy

    try:
        return run_stdio_proxy(
            command,
            recorder=recorder,
            identity=SessionIdentity("stdio", rollout_id=rollout_id),
            **limits,
        )
    except FileNotFoundError:
        click.echo(f"llmtap mcp-proxy: the server command {command[0]!r} was not found: check the path.", err=True)
        return 127
    except PermissionError:
        click.echo(f"llmtap mcp-proxy: the server command {command[0]!r} is not executable.", err=True)
        return 126


def _run_http(
    upstream: str,
    port: int,
    recorder: Recorder,
    rollout_id: str | None,
    limits: dict[str, int],
    max_body_bytes: int | None,
) -> int:
    from ..errors import LlmtapError
    from ..mcp.framing import DEFAULT_MAX_MESSAGE_BYTES
    from ..mcp.http_proxy import DEFAULT_MAX_BODY_BYTES, run_http_proxy

    try:
        return run_http_proxy(
            upstream,
            port=port,
            recorder=recorder,
            rollout_id=rollout_id,
            max_body_bytes=max_body_bytes or DEFAULT_MAX_BODY_BYTES,
            max_message_bytes=limits.get("max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES),
        )
    except LlmtapError as exc:
        raise click.ClickException(str(exc)) from None
