"""`llmtap view`: browse captured rollouts and calls in a local web page, or compare two runs."""

from __future__ import annotations

import click

__all__ = ["view"]

_LOOPBACK = ("127.0.0.1", "::1", "localhost")


@click.command()
@click.argument("paths", nargs=-1, type=click.Path(exists=True), metavar="[PATH]...")
@click.option("--port", type=click.IntRange(1, 65535), default=8765, show_default=True, help="Port to listen on.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback only).")
@click.option(
    "--compare/--no-compare",
    default=None,
    help="Open on the comparison of the two runs given (default: when two runs are given, unless they are a "
    "rollouts file with its capture directory).",
)
def view(paths: tuple[str, ...], port: int, host: str, compare: bool | None) -> None:
    """Show capture directories, run capsules (default: .llmtap/runs) and rollouts files in a local web page.

    With two runs (capsules, capture directories or rollouts files), open on their comparison:
    `llmtap diff A B`'s alignment side by side. A rollouts file with a capture directory is read
    together (the directory holds the rows' payloads); pass --compare to compare them instead.
    """
    from ..errors import LlmtapError
    from ..view import ViewerSettings, ViewPathError, default_paths, discover, serve_app
    from ..view.compare import check_pair
    from ..view.sources import discover_pair, is_comparison

    if host not in _LOOPBACK:
        raise click.ClickException(
            f"The viewer listens on loopback only, not {host!r}; use --host 127.0.0.1 and an SSH tunnel to reach it remotely."
        )
    chosen = list(paths) or default_paths()
    if not chosen:
        raise click.ClickException("No .llmtap/runs here; give a capture directory, a run capsule or a rollouts file.")
    if compare and len(chosen) != 2:
        raise click.UsageError(f"--compare compares two runs; {len(chosen)} path(s) were given.")
    settings = ViewerSettings(host=host, port=port)
    shown = f"[{host}]" if ":" in host else host
    address = f"http://{shown}:{port}/"
    try:
        if compare or (compare is None and is_comparison(chosen)):
            sources, sid_a, sid_b = discover_pair(chosen[0], chosen[1])
            check_pair(sources.sources[sid_a].path, sources.sources[sid_b].path)
            settings.compare = (sid_a, sid_b)
            address += f"compare/{sid_a}/{sid_b}"
        else:
            sources = discover(chosen)
    except ViewPathError as exc:
        raise click.ClickException(str(exc)) from None
    except LlmtapError as exc:  # DiffInputError: the runs share no rollout, or one cannot be read
        raise click.ClickException(f"The two runs cannot be compared: {exc}") from None
    click.echo(f"llmtap view: {address}  (Ctrl-C stops it)")
    serve_app(sources, settings)
