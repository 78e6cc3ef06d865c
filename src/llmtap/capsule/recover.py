"""Whether a run's recorder is still alive, and finalising a capsule whose recorder died.

`llmtap run` holds a POSIX lock (`os.lockf`) on `internal/runner.lock` from the moment the capsule
exists until it is finalised. The kernel drops that lock when the recorder's process ends, however
it ends (SIGKILL, the OOM killer), so "the lock can be taken" means "no recorder holds this
capsule": unlike a recorded pid, it cannot be fooled by another process reusing the pid, nor by a
reboot (a boot id would be needed for that). The workload's own processes never hold it: the
descriptor is close-on-exec, and POSIX locks are not inherited across fork.

`recover_capsule` takes that lock itself, so a recorder that is alive is never raced and two
recoveries never run at once, then finalises the capsule from what is on disk (the spool files
the workload's processes wrote, the records already collected) with status `interrupted`.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

from .manifest import CapsuleError, iso_time, read_manifest
from .writer import CapsulePaths, hold_runner_lock

__all__ = ["RUNNER_ALIVE", "RUNNER_GONE", "RUNNER_UNKNOWN", "hold_runner_lock", "recover_capsule", "runner_state"]

RUNNER_ALIVE, RUNNER_GONE, RUNNER_UNKNOWN = "alive", "gone", "unknown"


def _try_lock(paths: CapsulePaths) -> int | None:
    """The runner lock's descriptor, locked by us, or None if it is missing or not a regular file.

    Raises BlockingIOError (or PermissionError) when a live recorder holds it.
    """
    try:
        fd = os.open(paths.runner_lock, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("not a regular file")
        os.lockf(fd, os.F_TLOCK, 0)
    except (BlockingIOError, PermissionError):
        os.close(fd)
        raise
    except OSError:
        os.close(fd)
        return None
    return fd


def runner_state(capsule: Path) -> str:
    """`alive` while a recorder holds the capsule, `gone` when none does, `unknown` without a runner lock.

    Capsules written by `llmtap.capture()`, or by an llmtap older than the lock, have none.
    """
    try:
        fd = _try_lock(CapsulePaths(capsule))
    except (BlockingIOError, PermissionError):
        return RUNNER_ALIVE
    if fd is None:
        return RUNNER_UNKNOWN
    os.close(fd)  # closing drops the lock we took just now
    return RUNNER_GONE


def recover_capsule(capsule: Path) -> dict[str, Any]:
    """Finalise a `running` capsule whose recorder is gone, with status `interrupted`; return its manifest.

    Raises CapsuleError when the capsule is not `running`, when its recorder is still alive, or
    when it has no runner lock (then nothing can tell whether a recorder still writes to it).
    """
    from .finalise import CaptureOutcome, finalise_capsule

    if os.path.islink(capsule):  # the run's own directory, never what a link planted in its place names
        raise CapsuleError(f"'{capsule}' is a symbolic link, not a run capsule; recover the capsule directory itself.")
    paths = CapsulePaths(Path(os.path.abspath(capsule)))
    manifest = read_manifest(paths.root)
    if manifest.get("status") != "running":
        raise CapsuleError(
            f"Run '{paths.run_id}' is already finalised (status {manifest.get('status')!r}); there is nothing to recover."
        )
    try:
        fd = _try_lock(paths)
    except (BlockingIOError, PermissionError):
        raise CapsuleError(
            f"Run '{paths.run_id}' is still being recorded (its recorder holds '{paths.runner_lock}'); "
            "wait for it to end, or stop it, before recovering."
        ) from None
    if fd is None:
        raise CapsuleError(
            f"Run '{paths.run_id}' has no runner lock, so nothing shows whether its recorder is gone; "
            "it was not started by this version of `llmtap run`."
        )
    try:
        recovered_at = time.time()
        manifest["recovered"] = {
            "at": iso_time(recovered_at),
            "by_pid": os.getpid(),
            "reason": "the llmtap run recorder ended without finalising the capsule",
        }
        outcome = CaptureOutcome(
            "interrupted",
            error={
                "type": "RecorderLost",
                "message": "The recorder ended before the run finished; the capsule was finalised from its spool.",
            },
            ended_at=recovered_at,
        )
        # The workload's environment died with the recorder: env.lock records none rather than ours.
        return finalise_capsule(paths, manifest, outcome, environ={})
    finally:
        os.close(fd)
