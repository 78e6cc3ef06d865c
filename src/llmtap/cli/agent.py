"""`llmtap agent`: run a built-in agent server for `llmtap collect`."""

from __future__ import annotations

import os

import click

__all__ = ["agent"]


@click.group()
def agent() -> None:
    """Run a built-in agent that serves POST /run for rollout collection."""


@agent.command("simple")
@click.option("--model-url", required=True, help="Base URL of the model server, usually llmtap serve (without /v1).")
@click.option("--model", default="default", show_default=True, help="Model name sent with each call.")
@click.option("--model-ref", help="The model_ref name llmtap serve records (its --model-ref), for exact call joins.")
@click.option("--api-key-env", help="Environment variable holding the model server's API key.")
@click.option("--max-turns", type=click.IntRange(min=2), default=4, show_default=True, help="Model calls per task at most.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=64, show_default=True, help="max_tokens of each call.")
@click.option("--temperature", type=click.FloatRange(min=0), help="Sampling temperature (default: the server's).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", type=click.IntRange(0, 65535), default=8900, show_default=True, help="Port to bind.")
def simple(
    model_url: str,
    model: str,
    model_ref: str | None,
    api_key_env: str | None,
    max_turns: int,
    max_tokens: int,
    temperature: float | None,
    host: str,
    port: int,
) -> None:
    """Serve the reference agent: an arithmetic task answered with an add tool, rewarded 1.0 when right."""
    try:
        import openai  # noqa: F401
        import uvicorn
    except ImportError:
        raise click.ClickException(
            "The reference agent needs the openai SDK; install it with: pip install 'llmtap[model]'"
        ) from None
    from ..demo.agent import SimpleAgentConfig, build_app

    api_key = "no-key-needed"
    if api_key_env:
        api_key = os.environ.get(api_key_env, "")
        if not api_key:
            raise click.ClickException(f"Environment variable {api_key_env!r} is not set; export the model server's key in it.")
    config = SimpleAgentConfig(
        model_url=model_url,
        model=model,
        api_key=api_key,
        model_ref={"type": "responses_api_models", "name": model_ref} if model_ref else None,
        max_turns=max_turns,
        max_tokens=max_tokens,
        temperature=temperature,
    )
    click.echo(f"simple agent: POST http://{host}:{port}/run, model calls to {model_url}", err=True)
    uvicorn.run(build_app(config), host=host, port=port, log_level="warning", access_log=False)
