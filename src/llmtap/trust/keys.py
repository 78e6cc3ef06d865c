"""Ed25519 signing keys for evidence bundles: generating, loading and fingerprinting them.

A key pair is two PEM files: the private key (PKCS8, unencrypted, created with mode 0600 from the
first byte, never widened later) and the public key (SubjectPublicKeyInfo). A key's fingerprint
is the SHA-256 of its raw 32-byte public key, in hex: what `llmtap keys generate` prints, what a
bundle's DSSE signature names as its `keyid`, and what `openssl pkey -pubin -in key.pem -outform
DER | tail -c 32 | sha256sum` prints, so a recipient can pin it with standard tools.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..errors import LlmtapError

__all__ = [
    "KeyFileError",
    "KeyPair",
    "default_keys_dir",
    "fingerprint",
    "generate_key_pair",
    "load_private_key",
    "load_public_key",
    "public_key_from_pem",
    "public_key_pem",
]

KEYS_DIR_ENV = "LLMTAP_KEYS_DIR"
DEFAULT_KEY_NAME = "llmtap-evidence"
PRIVATE_SUFFIX = ".key.pem"
PUBLIC_SUFFIX = ".pub.pem"
# A PEM ed25519 key is about 120 bytes; anything far larger is not one.
MAX_KEY_FILE_BYTES = 16 * 1024


class KeyFileError(LlmtapError):
    """Raised when a key file cannot be created, read, or is not an ed25519 key of the right kind."""


@dataclass(frozen=True)
class KeyPair:
    """Where a generated key pair was written, and the public key's fingerprint."""

    private_path: Path
    public_path: Path
    fingerprint: str


def default_keys_dir() -> Path:
    """`$LLMTAP_KEYS_DIR`, else `$LLMTAP_HOME/keys`, else `~/.llmtap/keys`."""
    configured = os.environ.get(KEYS_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    home = os.environ.get("LLMTAP_HOME")
    return (Path(home).expanduser() if home else Path.home() / ".llmtap") / "keys"


def fingerprint(public_key: Ed25519PublicKey) -> str:
    """The SHA-256 of the raw 32-byte public key, as 64 lowercase hex digits."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def public_key_pem(public_key: Ed25519PublicKey) -> bytes:
    """The public key as SubjectPublicKeyInfo PEM: the form `openssl pkeyutl -pubin -inkey` reads."""
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def public_key_from_pem(data: bytes, *, source: str) -> Ed25519PublicKey:
    """Parse a PEM public key and insist it is ed25519; KeyFileError naming `source` otherwise."""
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise KeyFileError(
            f"'{source}' is not a PEM public key ({exc}); give the .pub.pem file `llmtap keys generate` wrote."
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(
            f"'{source}' holds a {type(key).__name__}, not an ed25519 public key; evidence bundles use ed25519."
        )
    return key


def generate_key_pair(out_dir: Path, *, name: str = DEFAULT_KEY_NAME) -> KeyPair:
    """Create a new ed25519 key pair as `<name>.key.pem` (mode 0600) and `<name>.pub.pem` in `out_dir`.

    Neither file may exist yet: a key is never overwritten. The private file is created with
    `O_CREAT | O_EXCL | O_NOFOLLOW` and mode 0600, so it is never readable by others, not even for
    a moment, and a planted link is refused. `out_dir` is created (mode 0700) when missing.

        pair = generate_key_pair(Path("keys"))
        print(pair.fingerprint)
    """
    if not name or "/" in name or name.startswith(".") or "\x00" in name:
        raise KeyFileError(f"Key name {name!r} is not a plain file name; use letters, digits, '-' and '_'.")
    try:
        out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise KeyFileError(
            f"Could not create the key directory '{out_dir}' ({exc.strerror}); choose another with --out."
        ) from None
    private_path = out_dir / f"{name}{PRIVATE_SUFFIX}"
    public_path = out_dir / f"{name}{PUBLIC_SUFFIX}"
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _create_exclusive(private_path, private_pem, 0o600)
    try:
        _create_exclusive(public_path, public_key_pem(key.public_key()), 0o644)
    except BaseException:
        os.unlink(private_path)  # no half pair left behind
        raise
    return KeyPair(private_path, public_path, fingerprint(key.public_key()))


def _create_exclusive(path: Path, data: bytes, mode: int) -> None:
    """Create `path` with `mode` and write `data`; refuse an existing name or a link there."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except FileExistsError:
        raise KeyFileError(
            f"'{path}' already exists; a key is never overwritten: choose another --name or --out."
        ) from None
    except OSError as exc:
        raise KeyFileError(f"Could not create '{path}' ({exc.strerror}); choose another --out.") from None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        os.unlink(path)
        raise KeyFileError(f"Could not write '{path}' ({exc.strerror}); nothing was kept.") from None
    os.close(fd)


def _read_key_file(path: Path) -> tuple[bytes, int]:
    """Read a key file the user named (links the user made are followed; FIFOs never block)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise KeyFileError(f"Could not open the key file '{path}' ({exc.strerror}).") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise KeyFileError(f"The key file '{path}' is not a regular file.")
        if info.st_size > MAX_KEY_FILE_BYTES:
            raise KeyFileError(f"The key file '{path}' is {info.st_size} bytes, too large to be an ed25519 PEM key.")
        data = os.read(fd, MAX_KEY_FILE_BYTES + 1)
    finally:
        os.close(fd)
    return data, info.st_mode


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """Load an unencrypted ed25519 PKCS8 PEM private key, refusing one that others can read.

    Like ssh, a private key whose file grants any group or other permission is refused: it may
    already have leaked, and signing with it would vouch for nothing.
    """
    data, mode = _read_key_file(path)
    if mode & 0o077:
        raise KeyFileError(
            f"The private key '{path}' has mode {stat.S_IMODE(mode):04o}, readable by others; "
            "run 'chmod 600' on it (and consider it exposed) before signing with it."
        )
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise KeyFileError(
            f"The private key '{path}' is encrypted; llmtap reads unencrypted PKCS8 keys only."
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise KeyFileError(
            f"'{path}' is not a PEM private key; give the .key.pem file `llmtap keys generate` wrote."
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(
            f"'{path}' holds a {type(key).__name__}, not an ed25519 key; make one with 'llmtap keys generate'."
        )
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """Load an ed25519 public key from a PEM file (SubjectPublicKeyInfo)."""
    data, _ = _read_key_file(path)
    return public_key_from_pem(data, source=str(path))
