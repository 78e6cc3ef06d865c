"""`llmtap serve`: run the capturing proxy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..errors import LlmtapError
from .options import capsule_dir_option, capture_dir_option

__all__ = ["serve"]


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), help="YAML config file.")
@click.option("--upstream", help="Base URL of a single upstream (instead of an upstreams: block).")
@click.option("--upstream-key-env", help="Environment variable holding the --upstream API key.")
@capture_dir_option("Enable capture into DIR.")
@click.option("--capsule", is_flag=True, help="Record into a new run capsule (under --capsule-dir) instead of a capture dir.")
@capsule_dir_option("Where capsules go (default .llmtap/runs).")
@click.option("--model-ref", help="Name for the --upstream's model_ref (type responses_api_models).")
@click.option("--host", help="Address to bind (default 127.0.0.1).")
@click.option("--port", type=int, help="Port to bind (default 8787).")
@click.option("--workers", type=click.IntRange(min=1, max=256), help="Server processes sharing the port (default 1).")
@click.option("--replay", "replay_from", type=click.Path(exists=True, file_okay=False), help="Answer from this capsule or capture dir; send nothing.")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def serve(
    config_path: Path | None,
    upstream: str | None,
    upstream_key_env: str | None,
    capture_dir: Path | None,
    capsule: bool,
    capsule_dir: Path | None,
    model_ref: str | None,
    host: str | None,
    port: int | None,
    workers: int | None,
    replay_from: str | None,
    overrides: tuple[str, ...],
) -> None:
    """Run a capturing proxy; point an SDK's base_url at it with a /ng-rollout/<id> prefix.

    Settings come from --config YAML, then the flags, then ++key=value overrides
    (for example ++observability_enabled=true ++model_call_capture_dir=/abs/dir).
    """
    from ..server.config import load_serve_config
    from ..server.run import run_server

    defaults: dict[str, Any] = {}
    if replay_from and not upstream and config_path is None:
        upstream = "http://127.0.0.1:9"  # never contacted: the recording answers every request
    if upstream:
        entry: dict[str, Any] = {"base_url": upstream}
        if upstream_key_env:
            entry["api_key_env"] = upstream_key_env
        if model_ref:
            entry["model_ref"] = {"type": "responses_api_models", "name": model_ref}
        defaults["upstreams"] = {"default": entry}
    if capture_dir is not None:
        defaults["observability_enabled"] = True
        defaults["model_call_capture_dir"] = str(capture_dir.resolve())
    if host:
        defaults["host"] = host
    if port is not None:
        defaults["port"] = port
    if workers is not None:
        defaults["workers"] = workers
    if capsule and capture_dir is not None:
        raise click.UsageError("Use --capsule or --capture-dir, not both: a capsule keeps its calls in its own calls/ folder.")
    try:
        config = load_serve_config(config_path, overrides, settings=defaults)
        if capsule and config.workers > 1:
            raise click.UsageError("A capsule is recorded by one process: drop --workers (or ++workers) with --capsule.")
        if replay_from:
            from ..replay.serve import serve_replay

            serve_replay(config, replay_from)
        elif capsule:
            from ..server.capsule_mode import serve_into_capsule

            click.echo(f"capsule: {serve_into_capsule(config, runs_dir=capsule_dir)}", err=True)
        else:
            run_server(config)
    except LlmtapError as exc:
        raise click.ClickException(str(exc)) from None
