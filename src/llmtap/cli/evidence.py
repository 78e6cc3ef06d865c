"""`llmtap export-evidence` and `llmtap verify`: signed evidence bundles a third party checks offline."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..errors import LlmtapError
from .options import capsule_dir_option, json_option

__all__ = ["export_evidence", "verify"]


@click.command("export-evidence")
@click.argument("capsule_ref", metavar="CAPSULE")
@click.option(
    "-o",
    "--output",
    "bundle",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The bundle zip to write (must not exist).",
)
@click.option(
    "--key",
    "key_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The private key (from `llmtap keys generate`).",
)
@capsule_dir_option("Directory holding the run capsules, for a run id (default: $LLMTAP_RUNS_DIR or .llmtap/runs).")
def export_evidence(capsule_ref: str, bundle: Path, key_path: Path, capsule_dir: Path | None) -> None:
    """Export a finished capsule (a path, run id, id prefix or `latest`) as a signed evidence bundle.

    A capsule that fails its checks or `llmtap validate` is refused, with one line per problem.
    """
    from ..capsule.manifest import find_capsule
    from ..capsule.writer import default_runs_dir
    from ..trust.evidence import CapsuleRefusedError
    from ..trust.evidence import export_evidence as export
    from ..trust.keys import load_private_key
    from ..trust.validate import validation_problems

    try:
        capsule = find_capsule(capsule_dir if capsule_dir is not None else default_runs_dir(), capsule_ref)
        result = export(capsule, bundle, load_private_key(key_path), extra_validator=validation_problems)
    except CapsuleRefusedError as exc:
        for problem in exc.problems:
            click.echo(f"{exc.capsule}: {problem}", err=True)
        raise click.ClickException(f"The capsule was not exported: {len(exc.problems)} problem(s) above.") from None
    except LlmtapError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"bundle       {result.bundle}  ({result.files} capsule files, sha256 {result.sha256})")
    click.echo(f"run          {result.run_id}")
    click.echo(f"signed by    {result.key_fingerprint}")


@click.command("verify")
@click.argument("bundle", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--key",
    "key_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The signer's public key; the bundle's own key must be this one.",
)
@click.option("--fingerprint", "expected_fingerprint", help="The signer's key fingerprint (64 hex), instead of --key.")
@json_option("Print the report as JSON.")
def verify(bundle: Path, key_path: Path | None, expected_fingerprint: str | None, as_json: bool) -> None:
    """Check an evidence bundle: every digest, both signatures, the file list, the zip's shape.

    Exit status: 0 when it verifies against the key given with --key or --fingerprint; 3 when it
    is only self-consistent (no problem found, but no key given, so it proves only that whoever
    holds the bundle's own key signed it); 1 when anything is wrong, one line per problem.
    """
    from ..trust.keys import load_public_key
    from ..trust.verify import verify_bundle

    if key_path is not None and expected_fingerprint is not None:
        raise click.UsageError("Give --key or --fingerprint, not both.")
    if expected_fingerprint is not None and (
        len(expected_fingerprint) != 64 or any(c not in "0123456789abcdefABCDEF" for c in expected_fingerprint)
    ):
        raise click.UsageError(
            f"--fingerprint {expected_fingerprint!r} is not 64 hex digits; `llmtap keys fingerprint KEY` prints one."
        )
    try:
        expected_key = load_public_key(key_path) if key_path is not None else None
    except LlmtapError as exc:
        raise click.ClickException(str(exc)) from None
    report = verify_bundle(bundle, expected_key=expected_key, expected_fingerprint=expected_fingerprint)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        for problem in report.problems:
            click.echo(f"FAIL  {problem}")
        if report.verdict == "verified":
            click.echo(
                f"verified: {report.files} capsule files of run {report.capsule_id}, "
                f"signed by the given key {report.key_fingerprint}"
            )
        elif report.verdict == "self-consistent":
            click.echo(
                f"self-consistent only: {report.files} capsule files of run {report.capsule_id} "
                "match the signatures of the "
                f"bundle's own key {report.key_fingerprint}, but no key was given to check it against; "
                "pass --key or --fingerprint with the signer's key"
            )
        else:
            click.echo(f"failed: {len(report.problems)} problem(s)")
    sys.exit(report.exit_code)
