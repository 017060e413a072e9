"""One instance log from its workers' container logs: merged by time, prefixed by worker."""

from __future__ import annotations

import codecs
import heapq
import itertools
import re
from collections.abc import Iterable, Iterator

_FRACTION = re.compile(r"\.(\d+)")
_STAMPED = re.compile(rb"\d{4}-\d\d-\d\dT\S* ")
MAX_PIECE = 64 * 1024
"""The longest text one merged item holds; longer lines are passed on in pieces."""


def worker_prefix(rank: int, workers: int) -> str:
    """Lines of a multi-worker instance say which worker wrote them; a single worker's stay bare."""
    return f"[worker {rank}] " if workers > 1 else ""


def _time_key(stamp: str) -> str:
    # The engine trims trailing zeros of RFC 3339 nanoseconds; pad them back so the text sorts by time.
    return _FRACTION.sub(lambda m: "." + m.group(1).ljust(9, "0"), stamp, count=1)


def stamped_only(raw: bytes) -> bytes:
    """The lines of a whole `logs(timestamps=True)` answer that carry a stamp.

    A kubelet whose log file vanished while it read (the pod was removed) writes its error into the body:
    that text carries no stamp, is not the job's, and must not replace a log captured before.
    """
    return b"".join(line for line in raw.splitlines(keepends=True) if _STAMPED.match(line))


def stamped_lines(chunks: Iterable[bytes], prefix: str = "") -> Iterator[tuple[str, str]]:
    """(time key, text) pairs of a `logs(timestamps=True)` answer read as it comes, `prefix` on each line.

    Every line ends with a newline. A line longer than `MAX_PIECE` comes in pieces that share its stamp,
    so a log of any size, even one endless line, is read in bounded memory.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending, key, continuing = "", "", False

    def piece(text: str, ends: bool) -> tuple[str, str]:
        nonlocal key, continuing
        if not continuing:
            stamp, _, text = text.partition(" ")
            key, text = _time_key(stamp), prefix + text
        continuing = not ends
        return key, text

    for chunk in itertools.chain(chunks, [None]):
        final = chunk is None
        *lines, pending = (pending + decoder.decode(chunk or b"", final=final)).split("\n")
        for line in lines:
            yield piece(line + "\n", ends=True)
        if final and (pending or continuing):
            yield piece(pending + "\n", ends=True)
        elif len(pending) > MAX_PIECE:
            yield piece(pending, ends=False)
            pending = ""


def merge_lines(worker_logs: list[Iterable[bytes]]) -> Iterator[str]:
    """The combined log as it is read: the workers' lines interleaved by time, each worker's in its order.

    An engine stamps stdout and stderr lines in separate readers, so one worker's stamps are not strictly
    ordered; only the interleaving between workers follows them.
    """
    workers = len(worker_logs)
    streams = [stamped_lines(chunks, worker_prefix(rank, workers)) for rank, chunks in enumerate(worker_logs)]
    return (text for _, text in heapq.merge(*streams, key=lambda item: item[0]))


def merge(worker_logs: list[bytes]) -> str:
    """The combined log of whole worker logs (see `merge_lines`)."""
    return "".join(merge_lines([[raw] for raw in worker_logs]))


def last_lines(text: str, tail: int) -> str:
    if tail <= 0:
        return text
    return "".join(text.splitlines(keepends=True)[-tail:])
