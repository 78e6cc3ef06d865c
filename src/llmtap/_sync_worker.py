"""The sync helper process: fdatasyncs files another process wrote, and says when each is durable.

Run as `python -I -S _sync_worker.py` by `_sync_offload.SyncOffload`, with requests on stdin and
acknowledgements on stdout; standard library only, so it starts in milliseconds. It exits when
its stdin closes, which also happens when the process that started it dies; it runs in its own
session, so a Ctrl-C meant for that process does not cut the syncs it still owes.

Request: `<QQQHB` (job id, st_dev, st_ino, path length, flags) then the path (UTF-8, surrogate
escapes). Flag 1: the file is new, so sync its directory first. Acknowledgement: `<QI` (job id,
status): 0 when the file is durable, or when the path now names another file (a clear() unlinked
the one written, so there is nothing left to make durable); otherwise the errno of the failure.

Everything readable at once is one batch: each file is synced once per batch, however many
requests name it, so the more requests queue up during a slow sync, the fewer syncs they cost.
"""

from __future__ import annotations

import os
import struct
import sys
from collections import OrderedDict

REQUEST = struct.Struct("<QQQHB")
ACK = struct.Struct("<QI")
NEW_FILE = 1
OPEN_FILES = 256


def _parse(buffer: bytearray) -> list[tuple[int, tuple[int, int], bytes, int]]:
    """Take every complete request off the front of `buffer`."""
    requests = []
    offset = 0
    while len(buffer) - offset >= REQUEST.size:
        job_id, device, inode, length, flags = REQUEST.unpack_from(buffer, offset)
        end = offset + REQUEST.size + length
        if end > len(buffer):
            break
        requests.append((job_id, (device, inode), bytes(buffer[offset + REQUEST.size : end]), flags))
        offset = end
    del buffer[:offset]
    return requests


class _Files:
    """Descriptors kept open by inode, so a busy rollout's file is opened once."""

    def __init__(self) -> None:
        self._fds: OrderedDict[tuple[int, int], int] = OrderedDict()

    def sync(self, key: tuple[int, int], path: bytes) -> int:
        """fdatasync the file `key`, opened through `path`; return 0 or the errno."""
        try:
            fd = self._fds.get(key)
            if fd is None:
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
                except FileNotFoundError:
                    return 0  # unlinked by a clear(): nothing of it is left to sync
                found = os.fstat(fd)
                if (found.st_dev, found.st_ino) != key:
                    os.close(fd)
                    return 0
                self._fds[key] = fd
                while len(self._fds) > OPEN_FILES:
                    os.close(self._fds.popitem(last=False)[1])
            else:
                self._fds.move_to_end(key)
            os.fdatasync(fd)
        except OSError as exc:
            return exc.errno or 5  # EIO when the error names none
        return 0


def _sync_directory(path: bytes) -> int:
    try:
        fd = os.open(os.path.dirname(path) or b".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        return exc.errno or 5
    return 0


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def serve(requests_fd: int, acks_fd: int) -> None:
    files = _Files()
    buffer = bytearray()
    while True:
        data = os.read(requests_fd, 1 << 16)
        if not data:
            return
        buffer += data
        batch = _parse(buffer)
        directories: dict[bytes, int] = {}
        synced: dict[tuple[int, int], int] = {}
        acks = []
        for job_id, key, path, flags in batch:
            status = 0
            if flags & NEW_FILE:
                directory = os.path.dirname(path)
                if directory not in directories:
                    directories[directory] = _sync_directory(path)
                status = directories[directory]
            if key not in synced:
                synced[key] = files.sync(key, path)
            acks.append(ACK.pack(job_id, status or synced[key]))
        _write_all(acks_fd, b"".join(acks))


if __name__ == "__main__":
    try:
        serve(sys.stdin.fileno(), sys.stdout.fileno())
    except BrokenPipeError:  # the store's process went away: nobody to answer
        pass
