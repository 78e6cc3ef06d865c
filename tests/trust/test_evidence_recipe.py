"""The README's offline recipe, run as written with bash, unzip, coreutils and OpenSSL: no llmtap involved."""

from __future__ import annotations

import hashlib
import shutil
import stat
import subprocess
import zipfile
from pathlib import Path

import pytest

from llmtap.trust.bundle_format import zip_info
from llmtap.trust.keys import KeyPair
from tests.trust.zip_tools import members_of, top, write_bundle

TOOLS = ("bash", "unzip", "sha256sum", "openssl", "find", "diff", "cut", "sort", "sed", "tail")
pytestmark = pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in TOOLS),
    reason=f"the offline recipe needs {', '.join(TOOLS)}, and some are not installed",
)


def _recipe(bundle: Path) -> str:
    """The shell lines between the README's markers, as a reader would copy them."""
    readme = members_of(bundle)[top("README.txt")].decode()
    block = readme.split("# --- offline check ---\n", 1)[1].split("# --- end ---", 1)[0]
    return "\n".join(line.removeprefix("  ") for line in block.splitlines()) + "\n"


def _run_recipe(bundle: Path, recipe: str, folder: Path) -> subprocess.CompletedProcess[str]:
    folder.mkdir()
    shutil.copyfile(bundle, folder / "bundle.zip")
    (folder / "check.sh").write_text(recipe)
    return subprocess.run(
        ["bash", "-euo", "pipefail", "check.sh"], cwd=folder, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_recipe_verifies_a_good_bundle_and_prints_the_signers_fingerprint(
    good_bundle: Path, key_pair: KeyPair, tmp_path: Path
) -> None:
    done = _run_recipe(good_bundle, _recipe(good_bundle), tmp_path / "good")
    assert done.returncode == 0, done.stderr
    assert "Signature Verified Successfully" in done.stdout
    assert done.stdout.splitlines()[-1] == f"{key_pair.fingerprint}  -"


def test_the_recipe_rejects_a_changed_capsule_file(good_bundle: Path, tmp_path: Path) -> None:
    members = members_of(good_bundle)
    members[top("capsule/model-calls.jsonl")] += b"{}\n"
    done = _run_recipe(write_bundle(tmp_path / "bad.zip", members), _recipe(good_bundle), tmp_path / "changed")
    assert done.returncode != 0
    assert "capsule/model-calls.jsonl: FAILED" in done.stdout


def test_the_recipe_rejects_a_changed_file_whose_digest_was_recomputed(good_bundle: Path, tmp_path: Path) -> None:
    members = members_of(good_bundle)
    name = "capsule/capsule.json"
    members[top(name)] = members[top(name)].replace(b'"success"', b'"failure"')
    digest = hashlib.sha256(members[top(name)]).hexdigest()
    members[top("SHA256SUMS")] = b"".join(
        f"{digest}  {name}\n".encode() if line.endswith(f"  {name}\n".encode()) else line
        for line in members[top("SHA256SUMS")].splitlines(keepends=True)
    )
    done = _run_recipe(write_bundle(tmp_path / "bad.zip", members), _recipe(good_bundle), tmp_path / "resummed")
    assert done.returncode != 0
    assert "Signature Verification Failure" in done.stdout + done.stderr


@pytest.mark.parametrize("edit", ["added", "removed"])
def test_the_recipe_rejects_an_added_or_removed_file(good_bundle: Path, tmp_path: Path, edit: str) -> None:
    members = members_of(good_bundle)
    if edit == "added":
        members[top("capsule/outputs/extra.txt")] = b"not signed\n"
    else:
        del members[top("capsule/env.lock")]
    done = _run_recipe(write_bundle(tmp_path / "bad.zip", members), _recipe(good_bundle), tmp_path / edit)
    assert done.returncode != 0
    assert ("capsule/outputs/extra.txt" if edit == "added" else "capsule/env.lock") in done.stdout + done.stderr


def test_the_recipe_rejects_a_symlink_member(good_bundle: Path, tmp_path: Path) -> None:
    """A link unzip would restore could point sha256sum at a file outside the bundle."""
    members = members_of(good_bundle)
    target = top("capsule/env.lock")
    real = members.pop(target)
    outside = tmp_path / "outside-env.lock"
    outside.write_bytes(real)  # same bytes, so only the link check catches it
    bundle = write_bundle(tmp_path / "bad.zip", members)
    with zipfile.ZipFile(bundle, "a") as archive:
        info = zip_info(target, len(str(outside)))
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(info, str(outside).encode())
    done = _run_recipe(bundle, _recipe(good_bundle), tmp_path / "link")
    assert (tmp_path / "link" / "check" / "llmtap-evidence" / "capsule" / "env.lock").is_symlink()
    assert done.returncode != 0 and done.stdout == ""  # stopped at step 1, before any digest was read
