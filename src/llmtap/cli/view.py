"""`llmtap view`: browse captured rollouts and calls in a local web page."""

from __future__ import annotations

import click

__all__ = ["view"]

_LOOPBACK = ("127.0.0.1", "::1", "localhost")


@click.command()
@click.argument("paths", nargs=-1, type=click.Path(exists=True), metavar="[PATH]...")
@click.option("--port", type=click.IntRange(1, 65535), default=8765, show_default=True, help="Port to listen on.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback only).")
def view(paths: tuple[str, ...], port: int, host: str) -> None:
    """Show capture directories, run capsules (default: .llmtap/runs) and rollouts files in a local web page."""
    from ..view import ViewPathError, default_paths, discover, serve

    if host not in _LOOPBACK:
        raise click.ClickException(
            f"The viewer listens on loopback only, not {host!r}; use --host 127.0.0.1 and an SSH tunnel to reach it remotely."
        )
    chosen = list(paths) or default_paths()
    if not chosen:
        raise click.ClickException("No .llmtap/runs here; give a capture directory, a run capsule or a rollouts file.")
    try:
        sources = discover(chosen)
    except ViewPathError as exc:
        raise click.ClickException(str(exc)) from None
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"llmtap view: http://{shown}:{port}/  (Ctrl-C stops it)")
    serve(sources, host=host, port=port)
