"""Reading a bundle's members and writing altered bundles, for the tamper tests."""

from __future__ import annotations

import warnings
import zipfile
from pathlib import Path

from llmtap.trust.bundle_format import TOP_FOLDER, zip_info


def members_of(bundle: Path) -> dict[str, bytes]:
    """Every member's name and bytes, in the zip's order."""
    with zipfile.ZipFile(bundle) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist()}


def write_bundle(path: Path, members: dict[str, bytes] | list[tuple[str, bytes]]) -> Path:
    """Write members with llmtap's fixed headers, so only their names and bytes differ from a real bundle."""
    items = list(members.items()) if isinstance(members, dict) else members
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zipfile warns about the duplicate names some tests want
        with zipfile.ZipFile(path, "w") as archive:
            for name, data in items:
                archive.writestr(zip_info(name, len(data)), data)
    return path


def top(name: str) -> str:
    return f"{TOP_FOLDER}/{name}"
