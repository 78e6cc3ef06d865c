"""Access to the recorded real exchanges in ../shared/fixtures/recorded (read-only)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["FIXTURES_DIR", "RecordedExchange", "all_fixtures", "fixture", "fixtures_for"]


def _find_fixtures_dir() -> Path:
    override = os.environ.get("LLMTAP_FIXTURES_DIR")
    if override:
        return Path(override)
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "shared" / "fixtures" / "recorded"
        if candidate.is_dir():
            return candidate
    raise RuntimeError("Cannot find shared/fixtures/recorded; set LLMTAP_FIXTURES_DIR.")


FIXTURES_DIR = _find_fixtures_dir()


@dataclass(frozen=True)
class RecordedExchange:
    """One recorded exchange: its dialect folder, file name and parsed content."""

    dialect: str
    name: str
    data: dict[str, Any]

    @property
    def request_json(self) -> Any:
        return self.data["request"]["json"]

    @property
    def request_path(self) -> str:
        return str(self.data["request"]["path"])

    @property
    def status(self) -> int:
        return int(self.data["response"]["status"])

    @property
    def content_type(self) -> str:
        return str(self.data["response"]["headers"].get("content-type", ""))

    @property
    def body_text(self) -> str:
        return str(self.data["response"]["body_text"])

    @property
    def body_bytes(self) -> bytes:
        return self.body_text.encode("utf-8")

    @property
    def is_stream(self) -> bool:
        return self.content_type.startswith("text/event-stream")

    @property
    def id(self) -> str:
        return f"{self.dialect}/{self.name}"


@cache
def all_fixtures() -> tuple[RecordedExchange, ...]:
    """Every recorded exchange, sorted by dialect then name."""
    found = []
    for path in sorted(FIXTURES_DIR.glob("*/*.json")):
        found.append(RecordedExchange(path.parent.name, path.stem, json.loads(path.read_text())))
    return tuple(found)


def fixtures_for(dialect: str, *, stream: bool | None = None) -> list[RecordedExchange]:
    """The recorded exchanges of one dialect folder (`responses`, `chat`, `messages`)."""
    return [f for f in all_fixtures() if f.dialect == dialect and (stream is None or f.is_stream == stream)]


def fixture(name: str) -> RecordedExchange:
    """One recorded exchange by `dialect/name`."""
    for found in all_fixtures():
        if found.id == name:
            return found
    raise KeyError(name)
