"""The start-up check of a server's capture directory: refuse one that cannot be written.

Without it, a read-only or unwritable directory would let the server start and answer every call
while recording none of them (each a counted failure nobody looks at). A real write is tried, not
just `os.access`: a read-only mount, a full quota or an ACL is only found by writing.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from ..errors import ConfigError

__all__ = ["check_capture_dir"]


def check_capture_dir(path: str | os.PathLike[str]) -> Path:
    """Create the directory if needed and prove it writable, or raise `ConfigError` in one line.

    The probe is a new file of this process's own (`O_CREAT | O_EXCL | O_NOFOLLOW`), written,
    synced and removed: nothing a workload planted there is opened or followed.
    """
    root = Path(path)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unwritable(root, exc) from None
    if root.is_symlink() or not root.is_dir():
        raise ConfigError(
            f"The capture directory '{root}' is not a directory; point model_call_capture_dir (--capture-dir) "
            "at a directory this server may write."
        )
    probe = root / f".llmtap-write-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise _unwritable(root, exc) from None
    return root


def _unwritable(root: Path, exc: OSError) -> ConfigError:
    reason = exc.strerror or type(exc).__name__
    return ConfigError(
        f"The capture directory '{root}' cannot be written ({reason}); make it writable by this user "
        "or choose another with --capture-dir (model_call_capture_dir)."
    )
