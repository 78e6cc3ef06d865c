"""Structural checks of an untrusted zip, made before a single member is decompressed.

A bundle is read straight from the zip, never unpacked to disk, and what this module accepts is
only the shape llmtap writes: the end record says how many members and how large a central
directory there are, and both are bounded before Python's zipfile parses them (a huge central
directory is itself a memory bomb). Then every member must be a regular file (Unix mode bits in
the external attributes: no symlink or directory entry), stored or deflated, unencrypted, with
a safe unique name and a declared size inside the bounds and possible for its compressed size;
and the members must tile the file exactly (no gap, overlap, or bytes before, between or after
them), which rules out the overlapping-member zip bomb and any hidden data.
"""

from __future__ import annotations

import stat
import struct
import zipfile
from collections import Counter
from typing import BinaryIO

from .bundle_format import FIXED_DATE_TIME, MEMBER_MODE, BundleLimits, unsafe_name_reason

__all__ = ["EndRecord", "member_problems", "read_end_record", "tiling_problems"]

_EOCD = b"PK\x05\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_ZIP64_EOCD = b"PK\x06\x06"
_LOCAL_HEADER = b"PK\x03\x04"
_UTF8_FLAG = 0x800
_DEFLATE_MAX_RATIO = 1032  # the most deflate can expand: 258 bytes from 2 bits
_DEFLATE_SLACK = 1024
_DOS_TIME, _DOS_DATE = 0, 0x21  # FIXED_DATE_TIME, 1980-01-01 00:00:00, as a zip header stores it
_ZIP64_EXTRA_ID = 0x0001


class EndRecord:
    """What the end record declares: member count, central directory size and offset, where the end records start."""

    def __init__(self, entries: int, directory_size: int, directory_offset: int, directory_end: int) -> None:
        self.entries = entries
        self.directory_size = directory_size
        self.directory_offset = directory_offset
        self.directory_end = directory_end  # where the (zip64) end records begin


def read_end_record(handle: BinaryIO, size: int) -> EndRecord:
    """Read the end record(s) llmtap writes (no archive comment, nothing after); ValueError otherwise."""
    if size < 22:
        raise ValueError("the file is too short to be a zip")
    handle.seek(size - 22)
    record = handle.read(22)
    if record[:4] != _EOCD:
        raise ValueError("the file does not end with a zip end record (a comment or trailing bytes follow it)")
    _, disk, directory_disk, disk_entries, entries, directory_size, directory_offset, comment_length = struct.unpack(
        "<4sHHHHIIH", record
    )
    if comment_length:
        raise ValueError("the zip carries an archive comment, which llmtap never writes")
    if disk or directory_disk or disk_entries != entries:
        raise ValueError("the zip claims to span several disks")
    directory_end = size - 22
    needs_zip64 = entries == 0xFFFF or directory_size == 0xFFFFFFFF or directory_offset == 0xFFFFFFFF
    locator = b""
    if directory_end >= 20 + 56:
        handle.seek(directory_end - 20)
        locator = handle.read(20)
    # Like zipfile, a zip64 locator is honoured whenever present, not only when the end record needs it.
    if locator[:4] == _ZIP64_LOCATOR:
        (record_offset,) = struct.unpack("<Q", locator[8:16])
        if record_offset != directory_end - 20 - 56:
            raise ValueError("the zip64 end record is not where its locator says")
        handle.seek(record_offset)
        record64 = handle.read(56)
        if record64[:4] != _ZIP64_EOCD:
            raise ValueError("the zip64 end record is missing")
        disk_entries, entries, directory_size, directory_offset = struct.unpack("<QQQQ", record64[24:56])
        if disk_entries != entries:
            raise ValueError("the zip claims to span several disks")
        directory_end = record_offset
    elif needs_zip64:
        raise ValueError("the zip64 end records are missing")
    return EndRecord(entries, directory_size, directory_offset, directory_end)


def member_problems(infos: list[zipfile.ZipInfo], limits: BundleLimits) -> list[tuple[str | None, str]]:
    """Problems with the members' headers alone: `(member name or None, message)` each."""
    problems: list[tuple[str | None, str]] = []
    counts = Counter(info.orig_filename for info in infos)
    for name, count in sorted(counts.items()):
        if count > 1:
            problems.append((name, f"appears {count} times (duplicate member name)"))
    total = 0
    for info in infos:
        name = info.orig_filename
        if name.endswith("/"):
            problems.append((name, "is a folder entry; a bundle holds regular files only"))
            continue
        reason = unsafe_name_reason(name)
        if reason is not None:
            problems.append((repr(name), f"unsafe member name: {reason}"))
            continue
        mode = info.external_attr >> 16
        if info.create_system != 3 or stat.S_IFMT(mode) != stat.S_IFREG:
            kind = (
                "a symbolic link"
                if stat.S_ISLNK(mode)
                else "a folder"
                if stat.S_ISDIR(mode) or name.endswith("/")
                else "not a regular file"
            )
            problems.append((name, f"is {kind} entry; a bundle holds regular files only"))
        elif info.external_attr != MEMBER_MODE << 16 or info.internal_attr or info.date_time != FIXED_DATE_TIME:
            problems.append((name, "has a mode, attribute or time other than the fixed ones llmtap writes"))
        if info.comment or info.volume or not _only_zip64_extra(info.extra):
            problems.append((name, "carries a comment, extra field or disk number llmtap never writes"))
        if info.flag_bits & ~_UTF8_FLAG:
            problems.append(
                (
                    name,
                    f"has header flags {info.flag_bits:#06x} (encryption or data descriptor) llmtap never sets",
                )
            )
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            problems.append((name, f"uses compression method {info.compress_type}; only stored and deflated are read"))
        elif info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
            problems.append((name, "is stored uncompressed but declares two different sizes"))
        elif info.file_size > info.compress_size * _DEFLATE_MAX_RATIO + _DEFLATE_SLACK:
            problems.append(
                (
                    name,
                    f"declares {info.file_size} bytes from {info.compress_size} compressed, "
                    "more than deflate can expand (a zip bomb)",
                )
            )
        if info.file_size > limits.max_member_bytes:
            problems.append(
                (name, f"declares {info.file_size} bytes, more than a member may be ({limits.max_member_bytes})")
            )
        total += info.file_size
    if total > limits.max_total_bytes:
        problems.append(
            (None, f"the members declare {total} bytes in all, more than a bundle may hold ({limits.max_total_bytes})")
        )
    return problems


def _only_zip64_extra(extra: bytes) -> bool:
    """True for no extra field, or a lone zip64 field (large sizes or offsets): all llmtap's writer adds."""
    if not extra:
        return True
    if len(extra) < 4:
        return False
    field_id, length = struct.unpack("<HH", extra[:4])
    return field_id == _ZIP64_EXTRA_ID and length == len(extra) - 4 and length in (8, 16, 24)


def tiling_problems(handle: BinaryIO, infos: list[zipfile.ZipInfo], end: EndRecord) -> list[tuple[str | None, str]]:
    """Check the members, then the central directory, fill the file exactly, each local header matching its entry."""
    position = 0
    for info in sorted(infos, key=lambda item: item.header_offset):
        if info.header_offset != position:
            gap = (
                "overlaps the member before it"
                if info.header_offset < position
                else "follows bytes no member accounts for"
            )
            return [(info.orig_filename, f"starts at byte {info.header_offset} and {gap}")]
        handle.seek(info.header_offset)
        header = handle.read(30)
        if len(header) < 30 or header[:4] != _LOCAL_HEADER:
            return [(info.orig_filename, "has no local header where the central directory says")]
        _version, flags, method, time, date, crc = struct.unpack("<HHHHHI", header[4:18])
        name_length, extra_length = struct.unpack("<HH", header[26:30])
        # The version needed may rise from local header to central entry (zip64 offsets past 4 GiB): not compared.
        if (flags, method, time, date, crc) != (info.flag_bits, info.compress_type, _DOS_TIME, _DOS_DATE, info.CRC):
            return [(info.orig_filename, "has a local header that disagrees with its central directory entry")]
        raw_name = handle.read(name_length)
        expected_name = info.orig_filename.encode("utf-8" if info.flag_bits & _UTF8_FLAG else "cp437")
        if raw_name != expected_name:
            return [(info.orig_filename, "has a different name in its local header than in the central directory")]
        position = info.header_offset + 30 + name_length + extra_length + info.compress_size
    if position != end.directory_offset or end.directory_offset + end.directory_size != end.directory_end:
        return [
            (None, "the central directory does not directly follow the last member and end where the end record begins")
        ]
    return []
