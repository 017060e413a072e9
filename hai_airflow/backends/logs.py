"""Reading instance log files: the last lines, and following a file while it grows."""

from __future__ import annotations

import codecs
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

BLOCK = 64 * 1024


def read_tail(path: Path, tail: int = 0) -> str:
    """The file's text, or only its last `tail` lines when `tail` > 0; "" when there is no file yet."""
    try:
        with open(path, "rb") as f:
            data = f.read() if tail <= 0 else _last_lines(f.fileno(), tail)
    except FileNotFoundError:
        return ""
    return data.decode("utf-8", errors="replace")


def _last_lines(fd: int, n: int) -> bytes:
    # Read backwards block by block so a large log costs only what the tail needs.
    end = os.fstat(fd).st_size
    data = b""
    pos = end
    while pos > 0:
        step = min(BLOCK, pos)
        pos -= step
        data = os.pread(fd, step, pos) + data
        # One newline more than n: the last line may end with one.
        if data.count(b"\n") > n:
            break
    cut = len(data) - 1 if data.endswith(b"\n") else len(data)
    for _ in range(n):
        cut = data.rfind(b"\n", 0, cut)
        if cut < 0:
            return data
    return data[cut + 1 :]


def follow(path: Path, ended: Callable[[], bool], interval: float = 0.2) -> Iterator[str]:
    """Yield the file's text from the start as it is written, until `ended()` and the file is drained."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    offset = 0
    while True:
        # Ask before reading: whatever was written before the end is then read in this round.
        finished = ended()
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            data = b""
        offset += len(data)
        text = decoder.decode(data, final=finished and not data)
        if text:
            yield text
        if finished and not data:
            return
        if not data:
            time.sleep(interval)
