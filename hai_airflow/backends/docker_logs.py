"""One instance log from its workers' container logs: merged by time, prefixed by worker."""

from __future__ import annotations

import heapq
import re

_FRACTION = re.compile(r"\.(\d+)")


def worker_prefix(rank: int, workers: int) -> str:
    """Lines of a multi-worker instance say which worker wrote them; a single worker's stay bare."""
    return f"[worker {rank}] " if workers > 1 else ""


def _time_key(stamp: str) -> str:
    # The engine trims trailing zeros of RFC 3339 nanoseconds; pad them back so the text sorts by time.
    return _FRACTION.sub(lambda m: "." + m.group(1).ljust(9, "0"), stamp, count=1)


def split_stamped(raw: bytes) -> list[tuple[str, str]]:
    """(time key, line with its newline) pairs of a `logs(timestamps=True)` answer."""
    text = raw.decode("utf-8", errors="replace")
    out = []
    for line in text.splitlines(keepends=True):
        stamp, _, rest = line.partition(" ")
        out.append((_time_key(stamp), rest if rest.endswith("\n") else rest + "\n"))
    return out


def merge(worker_logs: list[bytes]) -> str:
    """The combined log: the workers' lines interleaved by time, each worker's in its own order.

    An engine stamps stdout and stderr lines in separate readers, so one worker's stamps are not strictly
    ordered; only the interleaving between workers follows them.
    """
    workers = len(worker_logs)
    streams = [
        [(key, worker_prefix(rank, workers) + line) for key, line in split_stamped(raw)]
        for rank, raw in enumerate(worker_logs)
    ]
    return "".join(line for _, line in heapq.merge(*streams, key=lambda item: item[0]))


def last_lines(text: str, tail: int) -> str:
    if tail <= 0:
        return text
    return "".join(text.splitlines(keepends=True)[-tail:])
