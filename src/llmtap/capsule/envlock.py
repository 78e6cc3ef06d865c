"""`env.lock`: the workload's interpreter, its installed packages, and its safe environment.

Under `llmtap run` the workload's first Python process writes a few lines about itself
(`internal/interpreter`: executable, version, prefix, platform, `sys.path`) at start-up, with
nothing but `sys` and `os`. Finalisation turns that into `env.lock`, reading the package list from
the `*.dist-info` / `*.egg-info` entries on that `sys.path` (file names only, so it costs a few
directory listings and never runs the workload's interpreter again). A non-Python workload gets
an `env.lock` that says so.

Environment variables: only names on an allowlist, never a name that looks like a credential
(key, secret, token, password, auth, cookie, credential, session), and never a value carrying
credentials in a URL. How many were withheld is recorded, not which.
"""

from __future__ import annotations

import os
import re
import sys

TYPE_CHECKING = False  # `typing` is not imported at run time (`llmtap run` loads this while its command runs)
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

__all__ = [
    "ENV_LOCK_SCHEMA_VERSION",
    "current_interpreter",
    "env_lock",
    "interpreter_lines",
    "parse_interpreter_lines",
    "safe_environment",
    "scan_packages",
]

ENV_LOCK_SCHEMA_VERSION = 1

_ALLOWED_NAMES = frozenset(
    {
        "LANG", "LANGUAGE", "TZ", "PATH", "SHELL", "TERM", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV",
        "PYTHONPATH", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING",
        "PYTHONUTF8", "PYTHONOPTIMIZE", "PYTHONWARNINGS", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
        "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "HF_HOME", "TRANSFORMERS_CACHE", "UV_PYTHON", "PIP_INDEX_URL",
    }
)
_ALLOWED_PREFIXES = ("LC_", "LLMTAP_")
_SECRET_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSW|AUTH|CREDENTIAL|COOKIE|SESSION|PRIVATE|SIGNATURE", re.I)
_CREDENTIAL_URL = re.compile(r"://[^/@\s]+@")
_DIST_SUFFIXES = (".dist-info", ".egg-info")


def safe_environment(environ: Mapping[str, str], *, drop_path_entries: Iterable[str] = ()) -> tuple[dict[str, str], int]:
    """Return (the allowlisted, non-secret variables, how many others were withheld)."""
    dropped = set(drop_path_entries)
    kept: dict[str, str] = {}
    withheld = 0
    for name, value in environ.items():
        allowed = name in _ALLOWED_NAMES or name.startswith(_ALLOWED_PREFIXES)
        if not allowed or _SECRET_NAME.search(name) or _CREDENTIAL_URL.search(value):
            withheld += 1
            continue
        if name == "PYTHONPATH" and dropped:
            value = os.pathsep.join(part for part in value.split(os.pathsep) if part not in dropped)
            if not value:
                continue
        kept[name] = value
    return dict(sorted(kept.items())), withheld


def _platform() -> dict[str, str]:
    uname = os.uname()
    return {"system": uname.sysname, "release": uname.release, "machine": uname.machine}


def _normalize_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _read_metadata_version(path: str) -> tuple[str | None, str | None]:
    for candidate in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(path, candidate), encoding="utf-8", errors="replace") as handle:
                name = version = None
                for line in handle:
                    if not line.strip():
                        break
                    if line.startswith("Name:"):
                        name = line[5:].strip()
                    elif line.startswith("Version:"):
                        version = line[8:].strip()
                return name, version
        except OSError:
            continue
    return None, None


def scan_packages(path_entries: Iterable[str]) -> list[dict[str, str | None]]:
    """List installed distributions found on `path_entries`, first occurrence of a name winning."""
    found: dict[str, dict[str, str | None]] = {}
    for entry in path_entries:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for filename in names:
            if not filename.endswith(_DIST_SUFFIXES):
                continue
            stem = filename.rsplit(".", 1)[0]
            name, _, version_text = stem.partition("-")
            version: str | None = version_text or None
            if version is None or "-" in version:  # no plain version in the file name: read the metadata
                read_name, read_version = _read_metadata_version(os.path.join(entry, filename))
                name, version = read_name or name, read_version or version
            key = _normalize_name(name)
            if key and key not in found:
                found[key] = {"name": name, "version": version, "location": entry}
    return [found[key] for key in sorted(found)]


def interpreter_lines() -> str:
    """What a workload process writes about itself (mirrors the injected sitecustomize)."""
    lines = [
        f"executable={sys.executable}",
        f"version={sys.version.splitlines()[0]}",
        f"implementation={sys.implementation.name}",
        f"prefix={sys.prefix}",
        f"base_prefix={sys.base_prefix}",
        f"platform={sys.platform}",
    ]
    lines.extend(f"path={entry}" for entry in sys.path)
    return "\n".join(lines) + "\n"


def parse_interpreter_lines(text: str) -> dict[str, Any]:
    """Read the `key=value` lines of `internal/interpreter` back."""
    info: dict[str, Any] = {"path": []}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "path":
            info["path"].append(value)
        else:
            info[key] = value
    return info


def current_interpreter() -> dict[str, Any]:
    """This process's interpreter, in the same shape as `parse_interpreter_lines` returns."""
    return parse_interpreter_lines(interpreter_lines())


def env_lock(
    interpreter: Mapping[str, Any] | None,
    environ: Mapping[str, str],
    *,
    source: str,
    injected_paths: Iterable[str] = (),
) -> dict[str, Any]:
    """Build the `env.lock` document; `interpreter` None means the workload ran no Python."""
    injected = set(injected_paths)
    environment, withheld = safe_environment(environ, drop_path_entries=injected)
    document: dict[str, Any] = {
        "schema_version": ENV_LOCK_SCHEMA_VERSION,
        "source": source,
        "platform": _platform(),
        "environment": environment,
        "environment_withheld": withheld,
    }
    if interpreter is None:
        document["python"] = None
        document["packages"] = []
        document["note"] = "No Python process of the workload was seen, so no interpreter is described."
        return document
    path = [entry for entry in interpreter.get("path", []) if entry not in injected]
    document["python"] = {
        "executable": interpreter.get("executable"),
        "version": interpreter.get("version"),
        "implementation": interpreter.get("implementation"),
        "prefix": interpreter.get("prefix"),
        "base_prefix": interpreter.get("base_prefix"),
        "platform": interpreter.get("platform"),
        "sys_path": path,
    }
    document["packages"] = scan_packages(path)
    return document
