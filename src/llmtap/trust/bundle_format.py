"""The evidence bundle's fixed shape, shared by the exporter and the verifier.

    llmtap-evidence/
      README.txt           how to check the bundle offline (listed in SHA256SUMS, so signed too)
      capsule/...          the capsule's files, byte for byte
      SHA256SUMS           `<sha256 hex>  <path>` for README.txt and every capsule file, sorted by path bytes
      SHA256SUMS.sig       raw 64-byte ed25519 signature over SHA256SUMS's exact bytes
      key.pem              the signer's public key (SubjectPublicKeyInfo PEM)
      statement.dsse.json  an in-toto Statement v1 whose subjects are SHA256SUMS's entries, in a DSSE envelope

Zip members carry fixed timestamps and modes, so one capsule always gives the same bytes. Names
are checked the same way on both sides: relative, no `..`, `.` or empty parts, no backslash,
no control character, bounded length; so every name SHA256SUMS lists is one `sha256sum -c`
reads literally.
"""

from __future__ import annotations

import re
import stat
import zipfile
from dataclasses import dataclass

from .. import __version__

__all__ = [
    "CAPSULE_FOLDER",
    "KEY_NAME",
    "README_NAME",
    "SIGNATURE_FILES",
    "SIG_NAME",
    "STATEMENT_NAME",
    "SUMS_NAME",
    "TOP_FOLDER",
    "BundleLimits",
    "format_sums",
    "parse_sums",
    "readme_text",
    "unsafe_name_reason",
    "zip_info",
]

TOP_FOLDER = "llmtap-evidence"
CAPSULE_FOLDER = "capsule"
README_NAME = "README.txt"
SUMS_NAME = "SHA256SUMS"
SIG_NAME = "SHA256SUMS.sig"
KEY_NAME = "key.pem"
STATEMENT_NAME = "statement.dsse.json"
# The files that sign or describe the listed ones, and so cannot be listed themselves.
SIGNATURE_FILES = (SUMS_NAME, SIG_NAME, KEY_NAME, STATEMENT_NAME)

FIXED_DATE_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip header can hold
MEMBER_MODE = stat.S_IFREG | 0o644
MAX_NAME_BYTES = 512
SIGNATURE_BYTES = 64
_SUMS_LINE = re.compile(rb"([0-9a-f]{64})  ([^\n]+)")
_DRIVE = re.compile(r"^[A-Za-z]:")


@dataclass(frozen=True)
class BundleLimits:
    """Bounds on a bundle, applied alike when exporting and verifying, so a bomb fails before any read.

    `max_metadata_bytes` bounds the files read whole into memory (SHA256SUMS, the statement).
    """

    max_members: int = 100_000
    max_member_bytes: int = 4 << 30
    max_total_bytes: int = 16 << 30
    max_metadata_bytes: int = 128 << 20
    max_central_directory_bytes: int = 64 << 20


def unsafe_name_reason(name: str) -> str | None:
    """Why `name` cannot be a bundle path (None when it can): absolute, `..`, backslash, and the like."""
    if not name:
        return "the name is empty"
    if name.startswith("/"):
        return "the name is absolute"
    if "\\" in name:
        return "the name holds a backslash"
    if _DRIVE.match(name):
        return "the name starts with a drive letter"
    if any(ord(character) < 0x20 or ord(character) == 0x7F for character in name):
        return "the name holds a control character"
    parts = name.split("/")
    if ".." in parts:
        return "the name holds a '..' part"
    if "" in parts or "." in parts:
        return "the name holds an empty or '.' part"
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        return f"the name is longer than {MAX_NAME_BYTES} bytes"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "the name is not valid UTF-8"
    return None


def format_sums(entries: dict[str, str]) -> bytes:
    """SHA256SUMS in GNU coreutils' text format, one `<hex>  <path>` line per entry, sorted by path bytes."""
    ordered = sorted(entries.items(), key=lambda item: item[0].encode("utf-8"))
    return b"".join(f"{digest}  {path}\n".encode() for path, digest in ordered)


def parse_sums(data: bytes) -> tuple[dict[str, str], list[str]]:
    """Read SHA256SUMS as `format_sums` writes it: `(path -> digest, problems)`; strict about every byte.

    Each line must be 64 lowercase hex digits, two spaces and a safe path; lines end in a newline
    and are in strictly increasing path-byte order, which also rules out a path listed twice.
    """
    problems: list[str] = []
    entries: dict[str, str] = {}
    if not data.endswith(b"\n"):
        problems.append("SHA256SUMS does not end with a newline")
    previous: bytes | None = None
    for number, line in enumerate(data.split(b"\n")[:-1] if data.endswith(b"\n") else data.split(b"\n"), start=1):
        match = _SUMS_LINE.fullmatch(line)
        if match is None:
            problems.append(f"SHA256SUMS line {number} is not '<64 lowercase hex>  <path>'")
            continue
        digest, raw_path = match.group(1).decode("ascii"), match.group(2)
        try:
            path = raw_path.decode("utf-8")
        except UnicodeDecodeError:
            problems.append(f"SHA256SUMS line {number} names a path that is not UTF-8")
            continue
        reason = unsafe_name_reason(path)
        if reason is not None:
            problems.append(f"SHA256SUMS line {number} names an unsafe path: {reason}")
            continue
        if previous is not None and raw_path <= previous:
            problems.append(f"SHA256SUMS line {number} is out of order or repeats a path ('{path}')")
            continue
        previous = raw_path
        entries[path] = digest
    return entries, problems


def zip_info(name: str, size: int) -> zipfile.ZipInfo:
    """A member header with the fixed time and mode, deflated: the same capsule gives the same bytes."""
    info = zipfile.ZipInfo(name, date_time=FIXED_DATE_TIME)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.create_system = 3  # Unix, so the mode bits below are read as such
    info.external_attr = MEMBER_MODE << 16
    info.file_size = size
    return info


def readme_text(*, run_id: str, key_fingerprint: str, file_count: int) -> str:
    """The bundle's README.txt: what it holds and a recipe that checks it with standard tools only."""
    return f"""llmtap evidence bundle
======================

Run capsule {run_id}, exported by llmtap {__version__}: {file_count} capsule file(s).

Signing key fingerprint (SHA-256 of the raw 32-byte ed25519 public key):

  {key_fingerprint}

The bundle carries its own public key, so its signatures alone prove only that whoever holds
that key signed it. Compare the fingerprint with one the signer gave you another way (step 5).

What is here, in the folder {TOP_FOLDER}/:

  {CAPSULE_FOLDER}/             the run capsule's files, byte for byte
  {README_NAME}           this text
  {SUMS_NAME}           the SHA-256 of README.txt and of every capsule file (GNU coreutils
                       format, sorted by path bytes)
  {SIG_NAME}       raw ed25519 signature over the exact bytes of SHA256SUMS
  {KEY_NAME}              the signer's ed25519 public key (PEM)
  {STATEMENT_NAME}  the same digests as an in-toto Statement v1 in a signed DSSE envelope,
                       for attestation tools; `llmtap verify` checks it as well

Checking it offline, with standard tools only (bash, unzip, GNU coreutils and findutils,
OpenSSL 3.0 or later). Start in an empty folder holding the bundle as bundle.zip. Every command
must succeed (exit status 0): run them one by one, or save them to a file and run it with
`bash -euo pipefail FILE`.

  # --- offline check ---
  unzip -q bundle.zip -d check
  cd check/{TOP_FOLDER}
  # 1. Regular files and folders only: a link would let sha256sum read a file outside.
  test -z "$(find . ! -type f ! -type d)"
  # 2. No file added or missing: the files present are exactly the signed list plus the
  #    four files that sign it.
  diff <(find . -type f | sed 's|^\\./||' | LC_ALL=C sort) \\
       <({{ cut -c67- {SUMS_NAME}; printf '%s\\n' {" ".join(SIGNATURE_FILES)}; }} | LC_ALL=C sort)
  # 3. Every file's digest.
  sha256sum --strict --quiet -c {SUMS_NAME}
  # 4. The signature over SHA256SUMS (prints "Signature Verified Successfully").
  openssl pkeyutl -verify -pubin -inkey {KEY_NAME} -rawin -in {SUMS_NAME} -sigfile {SIG_NAME}
  # 5. The key's fingerprint: compare it with the one the signer gave you.
  openssl pkey -pubin -in {KEY_NAME} -outform DER | tail -c 32 | sha256sum
  # --- end ---

With llmtap installed, `llmtap verify bundle.zip --key SIGNER.pub.pem` does all of this without
unpacking, and checks the DSSE statement too.
"""
