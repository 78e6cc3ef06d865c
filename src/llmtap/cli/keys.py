"""`llmtap keys`: make and inspect the ed25519 keys that sign evidence bundles."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import LlmtapError

__all__ = ["keys"]


@click.group()
def keys() -> None:
    """Make and inspect the ed25519 keys that sign evidence bundles."""


@keys.command("generate")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for the key pair (default: $LLMTAP_KEYS_DIR, else $LLMTAP_HOME/keys, else ~/.llmtap/keys).",
)
@click.option("--name", default="llmtap-evidence", show_default=True, help="Base name of the two key files.")
def generate(out_dir: Path | None, name: str) -> None:
    """Create an ed25519 key pair: NAME.key.pem (private, mode 0600) and NAME.pub.pem.

    Prints the public key's fingerprint: the SHA-256 of the raw 32-byte ed25519 public key, in
    hex. Give it to whoever will verify your bundles, through a channel other than the bundle.
    An existing key is never overwritten.
    """
    from ..trust.keys import default_keys_dir, generate_key_pair

    try:
        pair = generate_key_pair(out_dir if out_dir is not None else default_keys_dir(), name=name)
    except LlmtapError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"private key  {pair.private_path}  (mode 0600; keep it secret)")
    click.echo(f"public key   {pair.public_path}")
    click.echo(f"fingerprint  {pair.fingerprint}  (sha256 of the raw ed25519 public key)")


@keys.command("fingerprint")
@click.argument("public_key", type=click.Path(dir_okay=False, path_type=Path))
def fingerprint_command(public_key: Path) -> None:
    """Print a public key's fingerprint (the SHA-256 of its raw 32-byte ed25519 key, in hex)."""
    from ..trust.keys import fingerprint, load_public_key

    try:
        click.echo(fingerprint(load_public_key(public_key)))
    except LlmtapError as exc:
        raise click.ClickException(str(exc)) from None
