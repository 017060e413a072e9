"""Instance logs opened without links: tailed from the end, streamed and followed in bounded memory."""

from __future__ import annotations

import codecs
import io
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import TracebackType

from hai_airflow.backends.common.safefs import UnsafeFile, open_regular, trusted_root, write_below

log = logging.getLogger(__name__)

BLOCK = 64 * 1024
"""How much one read takes: the memory a stream or a follow holds at a time."""
TAIL_LIMIT = 4 * 1024 * 1024
"""The most bytes of log one tail answer holds; longer lines are cut at their start, with a note."""


class UnreadableLog(Exception):
    """Raised by the pieces of a log being kept when its source cannot be read: the note is kept instead."""

    def __init__(self, note: str) -> None:
        super().__init__(note)
        self.note = note


def keep_log(instance_id: int, path: Path, text: bytes | Iterable[bytes], home: Path | None) -> None:
    """Write an ended instance's log where its launch said, as one file of its own (mode 0600).

    The log lies where the job may write: it is never written through a link the job planted. A log
    that cannot be written is logged as such; the instance ends all the same.
    """
    root = trusted_root(path, home)
    try:
        try:
            write_below(root, path, text, mode=0o600)
        except UnreadableLog as e:
            write_below(root, path, e.note.encode(), mode=0o600)
    except OSError as e:
        log.warning("cannot keep the log of instance %d: %s", instance_id, e)


def read_tail(path: Path, tail: int = 0, *, home: Path | None) -> str:
    """The log's text, or only its last `tail` lines when `tail` > 0; "" when there is no file yet.

    A log the server refuses to open (a link, not a regular file) reads as one `refusal_note` line.
    """
    try:
        with LogCursor(path, home) as log:
            return log.tail(tail) + log.rest() if tail > 0 else "".join(log.stream())
    except UnsafeFile as exc:
        return refusal_note(exc)


def refusal_note(exc: UnsafeFile) -> str:
    """The line shown instead of a log the server will not open."""
    return f"[hai] the log is not shown: {exc.strerror}; the server reads only the log file it created.\n"


def cut_note(shown: int, start: int, end: int) -> str:
    """The line above a tail whose lines are longer than `TAIL_LIMIT`."""
    return (
        f"[hai] these lines are longer than {shown} bytes: only bytes {start}-{end} of the log follow; "
        "tail=0 streams the whole log.\n"
    )


def tail_start(fd: int, end: int, lines: int, floor: int = 0) -> int | None:
    """Offset where the last `lines` lines before `end` begin; None when they begin before `floor`.

    Reads backwards one block at a time and looks at each byte once, so it costs what it reads: at most
    `end - floor` bytes (plus one), however long the lines are.
    """
    if end <= 0:
        return 0
    # A final newline ends the last line; it does not start another one.
    wanted = lines + 1 if os.pread(fd, 1, end - 1) == b"\n" else lines
    pos, low = end, max(0, floor - 1)
    while pos > low:
        step = min(BLOCK, pos - low)
        pos -= step
        block = os.pread(fd, step, pos)
        found = len(block)
        while (found := block.rfind(b"\n", 0, found)) >= 0:
            wanted -= 1
            if wanted == 0:
                return pos + found + 1
    return 0 if low == 0 else None


class LogCursor:
    """One instance log read forward from an offset as it grows, opened without links once it exists.

    The file is opened once: a job that later renames a link over its log path changes nothing for a
    reader that already holds the log. Text is decoded incrementally, so a character split between two
    reads comes out whole.

    :param path: the log file (as the server recorded it).
    :param home: the server's `$HAI_HOME`; the walk below `safefs.trusted_root` follows no link.
    """

    def __init__(self, path: Path, home: Path | None) -> None:
        self.path = path
        self.root = trusted_root(path, home)
        self.offset = 0
        # A file object, not a bare fd: a stream dropped before its first read still closes it.
        self._file: io.FileIO | None = None
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def ready(self) -> bool:
        """True once the log is open; False while it does not exist; UnsafeFile when it is refused."""
        if self._file is None:
            try:
                self._file = io.FileIO(open_regular(self.root, self.path), "rb")
            except FileNotFoundError:
                return False
        return True

    def _fd(self) -> int | None:
        return self._file.fileno() if self.ready() and self._file is not None else None

    def size(self) -> int:
        fd = self._fd()
        return 0 if fd is None else os.fstat(fd).st_size

    def read(self, end: int | None = None) -> str:
        """The text of the next block from the offset (up to `end` when given); "" when nothing is new."""
        fd = self._fd()
        if fd is None:
            return ""
        want = BLOCK if end is None else min(BLOCK, end - self.offset)
        data = os.pread(fd, want, self.offset) if want > 0 else b""
        self.offset += len(data)
        return self._decoder.decode(data)

    def rest(self) -> str:
        """What an unfinished character at the end decodes to, once no more is coming."""
        return self._decoder.decode(b"", final=True)

    def tail(self, lines: int, limit: int = TAIL_LIMIT) -> str:
        """The last `lines` lines as the log is now, at most `limit` bytes; the offset moves past them."""
        fd = self._fd()
        if fd is None:
            return ""
        end = os.fstat(fd).st_size
        start = tail_start(fd, end, lines, floor=max(0, end - limit))
        note = ""
        if start is None:
            start = end - limit
            note = cut_note(limit, start, end)
        data = os.pread(fd, end - start, start)
        self.offset = start + len(data)
        if note:
            # The cut may fall inside a character: start at the next one rather than at a fragment.
            skip = 0
            while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:
                skip += 1
            data = data[skip:]
        return note + self._decoder.decode(data)

    def step(self, ended: bool) -> tuple[str, bool]:
        """One round of following: (new text, whether following is over).

        Over once the instance has `ended` (asked before this read) and nothing new came, or when the
        log turns out to be something the server will not read; "" and not over means wait and retry.
        """
        before = self.offset
        try:
            text = self.read()
        except UnsafeFile as exc:
            # It appeared only after following began, as something the server will not open.
            return refusal_note(exc), True
        if self.offset != before or not ended:
            return text, False
        return self.rest(), True

    def stream(self) -> Iterator[str]:
        """The whole log as it is now, one block at a time; closes the file at the end."""
        try:
            end = self.size()
            while self.offset < end:
                before = self.offset
                text = self.read(end)
                if self.offset == before:
                    break  # truncated meanwhile
                if text:
                    yield text
            if tail := self.rest():
                yield tail
        finally:
            self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> LogCursor:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def follow(
    path: Path, ended: Callable[[], bool], interval: float = 0.2, *, home: Path | None
) -> Iterator[str]:
    """Yield the log's text from the start as it is written, until `ended()` and the file is drained."""
    with LogCursor(path, home) as log:
        while True:
            # Ask before reading: whatever was written before the end is then read in this round.
            text, done = log.step(ended())
            if text:
                yield text
            if done:
                return
            if not text:
                time.sleep(interval)
