"""`llmtap replay CAPSULE -- CMD ...`: run a program with its model calls answered from a recording."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

__all__ = ["replay"]


@click.command()
@click.argument("recording", type=click.Path(exists=True, file_okay=False))
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--mode",
    type=click.Choice(["mocked", "forensic", "exact", "intervention"]),
    default=None,
    help="mocked (default): answer from the recording; forensic: list the recorded calls, run nothing; "
    "exact: re-send each recorded request live and check the answer; intervention: mocked with --replace.",
)
@click.option("--speed", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="Stream pace: 0 as fast as possible, 1 the recorded timing, 2 twice as fast.")
@click.option("--on-miss", type=click.Choice(["error", "passthrough"]), default="error", show_default=True,
              help="A call the recording does not hold: fail it, or send it to the real endpoint (and record it).")
@click.option("--replace", "replace_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Intervention: a JSON file naming one recorded call and the response to answer it with.")
@click.option("--endpoint", default=None, help="Exact: the base URL to re-send the recorded requests to.")
@click.option("--api-key-env", default=None, help="Exact: the environment variable holding --endpoint's API key.")
@click.option("--report", "report_file", type=click.Path(dir_okay=False), default=None,
              help="Also write the report as JSON to this file (it is always in the new capsule too).")
@click.option("--capsule-dir", type=click.Path(file_okay=False), default=None, help="Where the new capsule goes.")
@click.option("--json", "as_json", is_flag=True, help="Print the replay report as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="Do not echo the program's output.")
def replay(
    recording: str,
    command: tuple[str, ...],
    mode: str | None,
    speed: float,
    on_miss: str,
    replace_file: str | None,
    endpoint: str | None,
    api_key_env: str | None,
    report_file: str | None,
    capsule_dir: str | None,
    as_json: bool,
    quiet: bool,
) -> None:
    """Replay RECORDING (a capsule or capture directory): run COMMAND with every model call answered from it.

    The replayed run is captured into a new capsule naming RECORDING; its replay-report.json
    lists what was served, missed and never asked for. Exits non-zero on any miss. Forensic and
    exact replays write their report into a new capsule too (exact with the live answers as its
    calls, so `llmtap diff RECORDING NEW_CAPSULE` shows what changed).
    """
    from ..errors import LlmtapError
    from ..replay.report import summary_text

    mode = mode or ("intervention" if replace_file else "mocked")
    try:
        if mode == "forensic" or mode == "exact":
            from ..replay.exact import exact_credentials, exact_run
            from ..replay.modes import forensic_report
            from ..replay.report_capsule import report_into_capsule

            if mode == "forensic":
                listed = forensic_report(recording)  # an unreadable recording stops here, before a capsule is made
                _, report = report_into_capsule(mode, recording, lambda _store: listed, runs_dir=capsule_dir)
            else:
                exact_credentials(endpoint, api_key_env)  # a missing key stops here, before a capsule is made
                _, report = report_into_capsule(
                    mode,
                    recording,
                    lambda store: exact_run(recording, endpoint, api_key_env=api_key_env, store=store),
                    runs_dir=capsule_dir,
                )
            exit_code = 0 if report.get("ok", True) else 1
            if report_file is not None:
                Path(report_file).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        else:
            if not command:
                raise click.UsageError("Give the command to replay after --, for example: llmtap replay CAPSULE -- python agent.py")
            if mode == "intervention" and replace_file is None:
                raise click.UsageError("--mode intervention needs --replace FILE.")
            from ..replay.mocked import replay_command

            result = replay_command(
                recording,
                list(command),
                speed=speed,
                on_miss="passthrough" if on_miss == "passthrough" else "error",
                override=replace_file if mode == "intervention" else None,
                runs_dir=capsule_dir,
                echo=not quiet,
            )
            report, exit_code = result.report, result.exit_code
            report["capsule"] = str(result.capsule)
    except LlmtapError as exc:
        click.echo(f"llmtap replay: {exc}", err=True)
        sys.exit(2)
    click.echo(json.dumps(report, indent=2) if as_json else summary_text(report), err=not as_json)
    sys.exit(exit_code)
