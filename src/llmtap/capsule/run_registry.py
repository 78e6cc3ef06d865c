"""The URL registry `llmtap run` hands to its workload, checked once and then reused as is.

Every run needs the effective registry validated before its command starts (a malformed override
stops the run) and written into the capsule as `url_registry.json`, which the workload's
processes read. Doing that through `llmtap.hooks.registry` costs about as much as the rest of the
recorder's start-up: importing it pulls in `typing`, `pathlib` and `re`, and the registry is
parsed and checked every time. So a registry that passed once is remembered: a cache entry holds
the registry file's exact bytes and the `url_registry.json` bytes made from them, and a later run
whose registry file has the same bytes takes the hand-off from the entry with nothing but `os`.

The entry is trusted only for the same file name (as `hooks.registry` would report it), the
same bytes, the same llmtap version and the same `hooks/registry.py` (its size and modification
time), so a change to any of them goes through the full check again. Anything unusual (no cache
directory, an unreadable file, a damaged entry) takes the full path, which raises the same
ConfigError it always did. Entries live next to the registry's own parse cache:
`$LLMTAP_CACHE_DIR`, else `$LLMTAP_HOME/cache`, else `~/.cache/llmtap`.
"""

from __future__ import annotations

import os

from .. import __version__

__all__ = ["registry_for_run", "registry_source"]

REGISTRY_ENV = "LLMTAP_URL_REGISTRY"  # the same variable hooks.registry reads
_ENTRY_FORMAT = b"llmtap-run-registry 1"
_ENTRY_PREFIX = "run-registry-"
_KEPT_ENTRIES = 32  # one entry per registry file name; older ones are removed as new ones come
_HOOKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hooks")


def registry_for_run(registry_path: str | os.PathLike[str] | None = None) -> bytes:
    """Return the `url_registry.json` bytes for a new run: `registry_path`, else the override, else the vendored registry.

    Raises ConfigError, before anything has run, when that registry cannot be read or is invalid.
    """
    chosen = _chosen_file(registry_path)
    raw = _read(chosen)
    if raw is not None:
        key = _entry_key(chosen, raw)
        entry_path = _entry_path(chosen)
        if key is not None and entry_path is not None:
            entry = _read(entry_path)
            if entry is not None and entry.startswith(key):
                return entry[len(key) :]
    return _checked(registry_path, chosen, raw)


def registry_source(handoff: bytes) -> str | None:
    """The `source` (the registry file) a `url_registry.json` names."""
    import json

    source = json.loads(handoff).get("source")
    return None if source is None else str(source)


def _chosen_file(registry_path: str | os.PathLike[str] | None) -> str:
    """The file `hooks.registry.load_registry` would read, named as given (not normalised)."""
    if registry_path is not None:
        return os.fspath(registry_path)
    explicit = os.environ.get(REGISTRY_ENV)
    if explicit:
        return os.path.expanduser(explicit)
    home = os.path.expanduser(os.environ.get("LLMTAP_HOME") or "~/.llmtap")
    candidate = os.path.join(home, "url_registry.yaml")
    return candidate if os.path.isfile(candidate) else os.path.join(_HOOKS, "url_registry.yaml")


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def _entry_key(chosen: str, raw: bytes) -> bytes | None:
    """What an entry must start with to be the hand-off of `raw` read from `chosen` by this llmtap."""
    try:
        code = os.stat(os.path.join(_HOOKS, "registry.py"))
    except OSError:
        return None
    name = os.fsencode(chosen)
    header = f" {__version__} {code.st_size} {code.st_mtime_ns} {len(name)} {len(raw)}\n".encode()
    return _ENTRY_FORMAT + header + name + b"\n" + raw


def _entry_path(chosen: str) -> str | None:
    configured = os.environ.get("LLMTAP_CACHE_DIR")
    if configured:
        directory = os.path.expanduser(configured)
    else:
        home = os.environ.get("LLMTAP_HOME")
        directory = os.path.join(os.path.expanduser(home), "cache") if home else os.path.expanduser("~/.cache/llmtap")
    if directory.startswith("~"):
        return None  # no home directory to expand
    return os.path.join(directory, f"{_ENTRY_PREFIX}{_name_hash(os.fsencode(chosen)):016x}.bin")


def _name_hash(data: bytes) -> int:
    """64-bit FNV-1a: a stable short file name for a registry path (entries are checked byte for byte anyway)."""
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return value


def _checked(registry_path: str | os.PathLike[str] | None, chosen: str, raw: bytes | None) -> bytes:
    """Load and check the registry through `hooks.registry`; remember it when it is the file read above."""
    import json
    from pathlib import Path

    from ..hooks.registry import load_registry

    registry = load_registry(registry_path)
    handoff = (json.dumps({"source": registry.source, "registry": registry.data}, indent=2, default=str) + "\n").encode()
    if raw is not None and registry.source == str(Path(chosen)) and _read(chosen) == raw:
        _remember(chosen, raw, handoff)
    return handoff


def _remember(chosen: str, raw: bytes, handoff: bytes) -> None:
    key, entry_path = _entry_key(chosen, raw), _entry_path(chosen)
    if key is None or entry_path is None:
        return
    temporary = f"{entry_path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(entry_path), exist_ok=True)
        with open(temporary, "wb") as handle:
            handle.write(key + handoff)
        os.replace(temporary, entry_path)
    except OSError:  # no entry then; the next run checks the registry again
        try:
            os.unlink(temporary)
        except OSError:
            pass
        return
    _prune(os.path.dirname(entry_path))


def _prune(directory: str) -> None:
    """Keep the newest entries only: temporary registries (tests, benchmarks) would otherwise pile up."""
    try:
        entries = [entry for entry in os.scandir(directory) if entry.name.startswith(_ENTRY_PREFIX) and entry.name.endswith(".bin")]
        entries.sort(key=lambda entry: entry.stat().st_mtime_ns, reverse=True)
        for entry in entries[_KEPT_ENTRIES:]:
            os.unlink(entry.path)
    except OSError:
        pass
