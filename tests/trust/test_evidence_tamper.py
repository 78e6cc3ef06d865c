"""A changed, added, removed or renamed member, or a hostile zip, makes `verify` fail, and fail fast."""

from __future__ import annotations

import stat
import struct
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmtap.trust.bundle_format import BundleLimits, zip_info
from llmtap.trust.keys import KeyPair, load_public_key
from llmtap.trust.verify import verify_bundle
from tests.trust.zip_tools import members_of, top, write_bundle


def _verdict(bundle: Path, key_pair: KeyPair, **options: object) -> tuple[str, list[str]]:
    report = verify_bundle(bundle, expected_key=load_public_key(key_pair.public_path), **options)  # type: ignore[arg-type]
    return report.verdict, [str(problem) for problem in report.problems]


def test_a_rewritten_but_unchanged_bundle_still_verifies(good_bundle: Path, key_pair: KeyPair, tmp_path: Path) -> None:
    """The baseline for the tamper tests: rewriting the same members gives a bundle that passes."""
    copy = write_bundle(tmp_path / "copy.zip", members_of(good_bundle))
    assert copy.read_bytes() == good_bundle.read_bytes()
    assert _verdict(copy, key_pair) == ("verified", [])


_EDITS = st.sampled_from(["change", "add", "remove", "rename"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    edit=_EDITS,
    which=st.integers(min_value=0),
    offset=st.integers(min_value=0),
    value=st.integers(1, 255),
    data=st.binary(max_size=64),
    name=st.text(st.characters(codec="ascii", exclude_characters="\x00"), min_size=1, max_size=20),
)
def test_any_changed_added_removed_or_renamed_member_fails_verification(
    good_bundle: Path,
    key_pair: KeyPair,
    tmp_path: Path,
    edit: str,
    which: int,
    offset: int,
    value: int,
    data: bytes,
    name: str,
) -> None:
    members = members_of(good_bundle)
    names = list(members)
    target = names[which % len(names)]
    if edit == "change":
        content = bytearray(members[target])
        if not content:
            content = bytearray(b"\x00")  # an empty file gains a byte: also a change
        else:
            content[offset % len(content)] ^= value  # value is never 0, so the byte really changes
        members[target] = bytes(content)
    elif edit == "add":
        new_name = top(name) if which % 2 else top(f"capsule/{name}")
        if new_name in members:
            new_name += ".extra"
        members[new_name] = data
    elif edit == "remove":
        del members[target]
    else:
        renamed = target + name
        members = {renamed if key == target else key: content for key, content in members.items()}
    verdict, problems = _verdict(write_bundle(tmp_path / "edited.zip", members), key_pair)
    assert verdict == "failed" and problems


def test_a_changed_capsule_file_with_recomputed_sums_fails_on_the_signature(
    good_bundle: Path, key_pair: KeyPair, tmp_path: Path
) -> None:
    """The reference verifier's hole: edit a file and its listed digest; the signature no longer verifies."""
    import hashlib

    members = members_of(good_bundle)
    calls = top("capsule/model-calls.jsonl")
    members[calls] = members[calls].replace(b"gpt-4", b"gpt-5")
    digest = hashlib.sha256(members[calls]).hexdigest()
    lines = [
        f"{digest}  capsule/model-calls.jsonl".encode() if line.endswith(b"  capsule/model-calls.jsonl") else line
        for line in members[top("SHA256SUMS")].split(b"\n")
    ]
    members[top("SHA256SUMS")] = b"\n".join(lines)
    verdict, problems = _verdict(write_bundle(tmp_path / "edited.zip", members), key_pair)
    assert verdict == "failed"
    assert (
        "llmtap-evidence/SHA256SUMS.sig: does not verify: SHA256SUMS was not signed by the bundle's key as it is"
        in problems
    )
    assert any("statement's subjects differ from SHA256SUMS" in problem for problem in problems)


def test_a_bundle_resigned_with_another_key_is_only_caught_by_pinning(
    good_bundle: Path, key_pair: KeyPair, tmp_path: Path, pristine_capsule: Path
) -> None:
    """Anyone can re-export a capsule under their own key: self-consistent, but not the signer's."""
    from llmtap.trust.evidence import export_evidence
    from llmtap.trust.keys import generate_key_pair, load_private_key

    forger = generate_key_pair(tmp_path / "forger")
    forged = tmp_path / "forged.zip"
    export_evidence(pristine_capsule, forged, load_private_key(forger.private_path))
    assert verify_bundle(forged).verdict == "self-consistent"
    verdict, problems = _verdict(forged, key_pair)
    assert verdict == "failed" and len(problems) == 1 and "not by the key given" in problems[0]


@pytest.mark.parametrize(
    ("member", "expected"),
    [
        ("../evil.txt", "'../evil.txt': unsafe member name: the name holds a '..' part"),
        ("llmtap-evidence/capsule/../../evil.txt", "unsafe member name: the name holds a '..' part"),
        ("/etc/evil", "'/etc/evil': unsafe member name: the name is absolute"),
        ("llmtap-evidence\\capsule\\x", "unsafe member name: the name holds a backslash"),
        ("C:/evil", "unsafe member name: the name starts with a drive letter"),
        ("llmtap-evidence//x", "unsafe member name: the name holds an empty or '.' part"),
        ("llmtap-evidence/a\nb", "unsafe member name: the name holds a control character"),
    ],
)
def test_zip_slip_names_are_rejected_before_anything_is_read(
    good_bundle: Path, key_pair: KeyPair, tmp_path: Path, member: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    members = members_of(good_bundle)
    members[member] = b"payload"
    bundle = write_bundle(tmp_path / "slip.zip", members)
    opened: list[str] = []
    original_open = zipfile.ZipFile.open
    monkeypatch.setattr(
        zipfile.ZipFile,
        "open",
        lambda self, name, *a, **k: opened.append(str(name)) or original_open(self, name, *a, **k),
    )
    verdict, problems = _verdict(bundle, key_pair)
    assert verdict == "failed"
    assert any(expected in problem for problem in problems), problems
    assert opened == []  # not one member was decompressed


def test_a_symlink_member_is_rejected(good_bundle: Path, key_pair: KeyPair, tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "link.zip", members_of(good_bundle))
    with zipfile.ZipFile(bundle, "a") as archive:
        info = zip_info(top("capsule/outputs/secret"), 11)
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(info, b"/etc/shadow")
    verdict, problems = _verdict(bundle, key_pair)
    assert verdict == "failed"
    assert (
        "llmtap-evidence/capsule/outputs/secret: is a symbolic link entry; a bundle holds regular files only"
        in problems
    )


def test_a_folder_entry_is_rejected(good_bundle: Path, key_pair: KeyPair, tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "folder.zip", members_of(good_bundle))
    with zipfile.ZipFile(bundle, "a") as archive:
        info = zipfile.ZipInfo(top("capsule/extra/"), date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = (stat.S_IFDIR | 0o755) << 16
        archive.writestr(info, b"")
    verdict, problems = _verdict(bundle, key_pair)
    assert verdict == "failed" and any("is a folder entry" in problem for problem in problems)


def test_duplicate_member_names_are_rejected(good_bundle: Path, key_pair: KeyPair, tmp_path: Path) -> None:
    members = list(members_of(good_bundle).items())
    manifest = next(item for item in members if item[0].endswith("capsule/capsule.json"))
    bundle = write_bundle(tmp_path / "twice.zip", [*members, (manifest[0], b'{"run_id": "someone else"}')])
    verdict, problems = _verdict(bundle, key_pair)
    assert verdict == "failed"
    assert "llmtap-evidence/capsule/capsule.json: appears 2 times (duplicate member name)" in problems


def _bomb(path: Path, *, declared: int | None = None, size: int = 32 << 20) -> Path:
    """A small zip whose one member inflates to `size` zero bytes (optionally declaring another size)."""
    with zipfile.ZipFile(path, "w") as archive:
        info = zip_info(top("capsule/bomb.jsonl"), size)
        with archive.open(info, "w") as member:
            block = bytes(1 << 20)
            for _ in range(size >> 20):
                member.write(block)
    if declared is not None:  # rewrite the declared size in both headers
        data = bytearray(path.read_bytes())
        central = data.rfind(b"PK\x01\x02")
        struct.pack_into("<I", data, central + 24, declared)
        struct.pack_into("<I", data, 22, declared)
        path.write_bytes(bytes(data))
    return path


def test_a_zip_bomb_fails_on_its_declared_sizes_without_decompressing(
    key_pair: KeyPair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bomb = _bomb(tmp_path / "bomb.zip")
    assert bomb.stat().st_size < 100_000  # 32 MiB of zeros in well under 100 kB
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda *a, **k: pytest.fail("a member was decompressed"))
    verdict, problems = _verdict(bomb, key_pair, limits=BundleLimits(max_member_bytes=1 << 20, max_total_bytes=1 << 20))
    assert verdict == "failed"
    assert (
        f"llmtap-evidence/capsule/bomb.jsonl: declares {32 << 20} bytes, more than a member may be (1048576)"
        in problems
    )
    assert f"the members declare {32 << 20} bytes in all, more than a bundle may hold (1048576)" in problems


def test_a_member_declaring_more_than_deflate_can_produce_is_rejected(
    key_pair: KeyPair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bomb = _bomb(tmp_path / "liar.zip", declared=0xFFFFFFF0, size=1 << 20)
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda *a, **k: pytest.fail("a member was decompressed"))
    verdict, problems = _verdict(bomb, key_pair)
    assert verdict == "failed" and any("more than deflate can expand (a zip bomb)" in problem for problem in problems)


def test_too_many_members_fail_on_the_end_record_before_the_directory_is_parsed(
    good_bundle: Path, key_pair: KeyPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(zipfile, "ZipFile", lambda *a, **k: pytest.fail("the central directory was parsed"))
    verdict, problems = _verdict(good_bundle, key_pair, limits=BundleLimits(max_members=5))
    count = int.from_bytes(good_bundle.read_bytes()[-12:-10], "little")  # the end record's member count
    assert verdict == "failed" and problems == [f"the zip declares {count} members, more than a bundle may hold (5)"]


def test_overlapping_members_are_rejected(good_bundle: Path, key_pair: KeyPair, tmp_path: Path) -> None:
    """The overlapping-file zip bomb: two central entries pointing at one local header."""
    data = bytearray(good_bundle.read_bytes())
    first = data.find(b"PK\x01\x02")
    second = data.find(b"PK\x01\x02", first + 4)
    struct.pack_into("<I", data, second + 42, struct.unpack_from("<I", data, first + 42)[0])
    (tmp_path / "overlap.zip").write_bytes(bytes(data))
    verdict, problems = _verdict(tmp_path / "overlap.zip", key_pair)
    assert verdict == "failed" and any("overlaps the member before it" in problem for problem in problems)


@pytest.mark.parametrize("where", ["prepended", "appended", "comment"])
def test_bytes_outside_the_members_are_rejected(
    good_bundle: Path, key_pair: KeyPair, tmp_path: Path, where: str
) -> None:
    data = good_bundle.read_bytes()
    if where == "prepended":
        data = b"MZ hidden" + data
    elif where == "appended":
        data = data + b"hidden"
    else:
        data = data[:-2] + struct.pack("<H", 6) + b"hidden"
    (tmp_path / "extra.zip").write_bytes(data)
    verdict, problems = _verdict(tmp_path / "extra.zip", key_pair)
    assert verdict == "failed" and problems


def test_a_lying_crc_or_truncated_member_is_a_problem_not_a_crash(
    good_bundle: Path, key_pair: KeyPair, tmp_path: Path
) -> None:
    data = bytearray(good_bundle.read_bytes())
    central = data.find(b"PK\x01\x02")
    crc = struct.unpack_from("<I", data, central + 16)[0]
    struct.pack_into("<I", data, central + 16, crc ^ 1)
    struct.pack_into("<I", data, 14, crc ^ 1)  # the first local header agrees, so only the data disagrees
    (tmp_path / "crc.zip").write_bytes(bytes(data))
    verdict, problems = _verdict(tmp_path / "crc.zip", key_pair)
    assert verdict == "failed" and any("could not be read from the zip" in problem for problem in problems)


def test_not_a_zip_and_not_a_file_are_problems(key_pair: KeyPair, tmp_path: Path) -> None:
    import os

    (tmp_path / "text.zip").write_text("hello")
    assert _verdict(tmp_path / "text.zip", key_pair)[0] == "failed"
    os.mkfifo(tmp_path / "fifo.zip")  # opened without blocking, refused as not a regular file
    assert _verdict(tmp_path / "fifo.zip", key_pair) == ("failed", [f"'{tmp_path / 'fifo.zip'}' is not a regular file"])
    assert "could not be opened" in _verdict(tmp_path / "missing.zip", key_pair)[1][0]


def test_a_zip64_bundle_verifies(
    pristine_capsule: Path, key_pair: KeyPair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bundles past 4 GiB carry zip64 fields and end records; a low limit makes zipfile write them for a small one."""
    from llmtap.trust.evidence import export_evidence
    from llmtap.trust.keys import load_private_key

    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 600)
    bundle = tmp_path / "zip64.zip"
    export_evidence(pristine_capsule, bundle, load_private_key(key_pair.private_path))
    monkeypatch.undo()
    assert b"PK\x06\x06" in bundle.read_bytes()[-200:]  # the zip64 end record is there
    with zipfile.ZipFile(bundle) as archive:
        assert any(info.extra[:2] == b"\x01\x00" for info in archive.infolist())
    assert _verdict(bundle, key_pair) == ("verified", [])
