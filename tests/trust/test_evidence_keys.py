"""Signing keys: created 0600 from the start, never overwritten, never through a link; loaded strictly."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key

from llmtap.trust.keys import KeyFileError, default_keys_dir, generate_key_pair, load_private_key, load_public_key


def test_the_private_key_is_created_with_mode_0600_even_under_a_permissive_umask(tmp_path: Path) -> None:
    previous = os.umask(0)
    try:
        pair = generate_key_pair(tmp_path / "keys")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(pair.private_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(pair.public_path).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(tmp_path / "keys").st_mode) == 0o700
    assert pair.private_path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----\n")  # PKCS8
    assert pair.public_path.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----\n")


def test_the_private_key_is_created_exclusively_without_following_links_and_never_chmodded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: dict[str, tuple[int, int]] = {}
    real_open = os.open

    def spy_open(path: str | os.PathLike[str], flags: int, mode: int = 0o777, **kwargs: object) -> int:
        opened[os.fspath(path)] = (flags, mode)
        return real_open(path, flags, mode, **kwargs)  # type: ignore[arg-type]

    def no_chmod(*args: object, **kwargs: object) -> None:
        pytest.fail("a key file's mode was changed after it was created")

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "chmod", no_chmod)
    monkeypatch.setattr(os, "fchmod", no_chmod)
    pair = generate_key_pair(tmp_path)
    flags, mode = opened[str(pair.private_path)]
    wanted = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    assert flags & wanted == wanted and mode == 0o600


def test_the_fingerprint_is_the_sha256_of_the_raw_public_key(tmp_path: Path) -> None:
    pair = generate_key_pair(tmp_path)
    raw = load_public_key(pair.public_path).public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert len(raw) == 32 and pair.fingerprint == hashlib.sha256(raw).hexdigest()
    der = subprocess.run(
        ["openssl", "pkey", "-pubin", "-in", str(pair.public_path), "-outform", "DER"], capture_output=True, check=True
    ).stdout
    assert hashlib.sha256(der[-32:]).hexdigest() == pair.fingerprint  # what the README's step 5 computes


def test_an_existing_key_or_a_planted_link_is_never_written_over(tmp_path: Path) -> None:
    first = generate_key_pair(tmp_path)
    before = first.private_path.read_bytes()
    with pytest.raises(KeyFileError, match="already exists"):
        generate_key_pair(tmp_path)
    assert first.private_path.read_bytes() == before
    outside = tmp_path / "outside.txt"
    outside.write_text("not a key")
    (tmp_path / "planted.key.pem").symlink_to(outside)
    with pytest.raises(KeyFileError, match="already exists"):
        generate_key_pair(tmp_path, name="planted")
    assert outside.read_text() == "not a key"
    (tmp_path / "half.pub.pem").write_text("taken")
    with pytest.raises(KeyFileError):
        generate_key_pair(tmp_path, name="half")
    assert not (tmp_path / "half.key.pem").exists()  # no half pair left behind


@pytest.mark.parametrize("name", ["", "../up", ".hidden", "a/b"])
def test_a_key_name_must_be_a_plain_file_name(tmp_path: Path, name: str) -> None:
    with pytest.raises(KeyFileError, match="not a plain file name"):
        generate_key_pair(tmp_path, name=name)


def test_a_private_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    pair = generate_key_pair(tmp_path)
    load_private_key(pair.private_path)
    os.chmod(pair.private_path, 0o640)
    with pytest.raises(KeyFileError, match="mode 0640, readable by others"):
        load_private_key(pair.private_path)


def test_keys_that_are_not_ed25519_or_not_keys_are_refused(tmp_path: Path) -> None:
    other = generate_private_key(SECP256R1())
    ec_private = tmp_path / "ec.key.pem"
    ec_private.write_bytes(
        other.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    ec_private.chmod(0o600)
    with pytest.raises(KeyFileError, match="not an ed25519 key"):
        load_private_key(ec_private)
    ec_public = tmp_path / "ec.pub.pem"
    ec_public.write_bytes(
        other.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(KeyFileError, match="not an ed25519 public key"):
        load_public_key(ec_public)
    (tmp_path / "junk.pem").write_bytes(b"junk")
    with pytest.raises(KeyFileError, match="is not a PEM public key"):
        load_public_key(tmp_path / "junk.pem")
    (tmp_path / "big.pem").write_bytes(b"x" * 100_000)
    with pytest.raises(KeyFileError, match="too large"):
        load_public_key(tmp_path / "big.pem")
    os.mkfifo(tmp_path / "fifo.pem")
    with pytest.raises(KeyFileError, match="not a regular file"):
        load_public_key(tmp_path / "fifo.pem")


def test_an_encrypted_private_key_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = tmp_path / "encrypted.key.pem"
    encryption = serialization.BestAvailableEncryption(b"passphrase")
    path.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
        )
    )
    path.chmod(0o600)
    with pytest.raises(KeyFileError, match="is encrypted"):
        load_private_key(path)


def test_the_default_keys_folder_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMTAP_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LLMTAP_KEYS_DIR", raising=False)
    assert default_keys_dir() == tmp_path / "home" / "keys"
    monkeypatch.setenv("LLMTAP_KEYS_DIR", str(tmp_path / "elsewhere"))
    assert default_keys_dir() == tmp_path / "elsewhere"
