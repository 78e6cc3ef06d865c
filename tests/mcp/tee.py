"""Run a command and copy its stdin and stdout through unchanged, keeping both byte streams in files.

    python tee.py LOG_PREFIX -- CMD ...

writes what went to CMD's stdin to LOG_PREFIX.in and what came from its stdout to LOG_PREFIX.out;
its exit code is CMD's. The tests put it on either side of the proxy to see the bytes each side saw.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import BinaryIO


def main() -> int:
    prefix, separator, *command = sys.argv[1:]
    assert separator == "--"
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    assert child.stdin is not None and child.stdout is not None
    with open(prefix + ".in", "wb", buffering=0) as sent, open(prefix + ".out", "wb", buffering=0) as received:
        return _copy(child, sent, received)


def _copy(child: subprocess.Popen[bytes], sent: BinaryIO, received: BinaryIO) -> int:
    assert child.stdin is not None and child.stdout is not None
    stdin = child.stdin

    def upstream() -> None:
        while chunk := os.read(0, 65536):
            sent.write(chunk)
            try:
                stdin.write(chunk)
            except BrokenPipeError:
                break
        stdin.close()

    threading.Thread(target=upstream, daemon=True).start()
    while chunk := child.stdout.read(65536):
        received.write(chunk)
        os.write(1, chunk)
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
