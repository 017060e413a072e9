"""What every backend does the same way with logs: read or follow its workers' streams, else the kept log."""

from __future__ import annotations

import codecs
import contextlib
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from hai_airflow.backends.common.base import Handle
from hai_airflow.backends.common.instances import InstanceTable
from hai_airflow.backends.common.log_files import read_tail
from hai_airflow.backends.common.merged_logs import MAX_PIECE, last_lines, merge_lines, worker_prefix

QUEUE_CHUNKS = 64
"""Chunks a fan-in holds before its streams wait: a slow reader of the log slows them, not memory."""
WAKE_SECONDS = 0.5
"""How soon a waiting fan-in notices it was closed."""


@dataclass(frozen=True)
class WorkerLog:
    """One worker's log as its backend serves it while the worker exists (a container, a pod).

    `open(follow, tail)` answers the raw bytes: with `follow`, the log from the start (or its last `tail`
    lines) until the worker ends, without stamps; without, the log so far with an RFC 3339 stamp at the
    start of every line (to merge workers by time). It raises when the backend cannot serve it.
    """

    name: str
    open: Callable[[bool, int | None], Iterable[bytes]]


@runtime_checkable
class LiveLogs(Protocol):
    """A backend whose running instance's log is read from the backend, found from its saved handle."""

    def worker_logs(self, handle: Handle) -> list[WorkerLog]:
        """The workers' logs of a running instance in rank order; [] while none can be read yet."""

    def explain_log_error(self, error: Exception) -> str:
        """The backend's words for why a worker's log could not be read."""


def unreadable_note(name: str, why: str) -> str:
    """The line shown for a worker whose log the backend does not serve (not started, gone, no node)."""
    return f"[hai] the log of {name} cannot be read now: {why}; it is shown once the instance ends.\n"


def prefixed_lines(chunks: Iterable[bytes], prefix: str) -> Iterator[str]:
    """The text of a byte stream as whole lines, each starting with `prefix`, in bounded memory.

    A line longer than `MAX_PIECE` comes in pieces (only the first carries the prefix); an unfinished
    last line gets its newline at the end of the stream.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending, continuing = "", False
    for data in chunks:
        head, sep, pending = (pending + decoder.decode(data)).rpartition("\n")
        if sep:
            lines = head.split("\n")
            first = lines[0] + "\n" if continuing else prefix + lines[0] + "\n"
            yield first + "".join(prefix + line + "\n" for line in lines[1:])
            continuing = False
        if len(pending) > MAX_PIECE:
            yield pending if continuing else prefix + pending
            pending, continuing = "", True
    pending += decoder.decode(b"", final=True)
    if pending or continuing:
        yield (pending if continuing else prefix + pending) + "\n"


def read_workers(workers: Sequence[WorkerLog], tail: int, explain: Callable[[Exception], str] = str) -> str:
    """The instance's log so far: its workers' lines merged by time, each with its worker prefix.

    A worker whose log cannot be read adds one `unreadable_note` instead of failing the whole answer.
    """
    notes, streams = [], []
    for w in workers:
        try:
            streams.append(w.open(False, None))
        except Exception as e:
            notes.append(unreadable_note(w.name, explain(e)))
            streams.append([])
    try:
        text = "".join(merge_lines(streams))
    except Exception as e:
        return "".join(notes) + unreadable_note(", ".join(w.name for w in workers), explain(e))
    return "".join(notes) + last_lines(text, tail)


class FanIn:
    """Every worker's log followed at once until all have ended, lines interleaved as they come.

    Each worker's lines carry its `worker_prefix` (none for a single worker); with `tail` > 0 each worker
    starts from its last `tail` lines. A worker whose log cannot be followed adds one `unreadable_note`
    and sets `unreadable`. `close()` may come from any thread, also while another waits for a line.
    """

    def __init__(
        self, workers: Sequence[WorkerLog], tail: int = 0, explain: Callable[[Exception], str] = str
    ) -> None:
        self.unreadable = False
        self._chunks: queue.Queue[str | None] = queue.Queue(QUEUE_CHUNKS)
        self._stop = threading.Event()
        self._opened: list[Any] = []
        self._running = len(workers)
        for rank, worker in enumerate(workers):
            prefix = worker_prefix(rank, len(workers))
            threading.Thread(
                target=self._pump, args=(worker, prefix, tail, explain), name="hai-log", daemon=True
            ).start()

    def _put(self, item: str | None) -> bool:
        while not self._stop.is_set():
            try:
                self._chunks.put(item, timeout=WAKE_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def _pump(self, worker: WorkerLog, prefix: str, tail: int, explain: Callable[[Exception], str]) -> None:
        try:
            stream = worker.open(True, tail or None)
            self._opened.append(stream)
            for text in prefixed_lines(stream, prefix):
                if not self._put(text):
                    return
        except Exception as e:
            if not self._stop.is_set():
                self.unreadable = True
                self._put(prefix + unreadable_note(worker.name, explain(e)))
        finally:
            self._put(None)

    def __iter__(self) -> FanIn:
        return self

    def __next__(self) -> str:
        while self._running > 0 and not self._stop.is_set():
            try:
                chunk = self._chunks.get(timeout=WAKE_SECONDS)
            except queue.Empty:
                continue
            if chunk is not None:
                return chunk
            self._running -= 1
        self.close()
        raise StopIteration

    def close(self) -> None:
        self._stop.set()
        for stream in self._opened:
            close = getattr(stream, "close", None)
            # A stream that ended meanwhile is closed enough.
            if close is not None:
                with contextlib.suppress(Exception):
                    close()


class ServedLogs:
    """`read_log` and `follow_log` of a backend that serves its running workers' logs (docker, kubernetes):
    from the workers while the instance runs, from the file the backend kept at its end after."""

    name: str
    home: Path | None
    _table: InstanceTable[Any]
    """The instances it follows, and where the logs of those that ended were kept."""

    def worker_logs(self, handle: Handle) -> list[WorkerLog]:
        raise NotImplementedError

    def running_handle(self, instance_id: int) -> Handle | None:
        """The handle of the instance while this backend runs it; None once it ended (or is unknown)."""
        raise NotImplementedError

    def explain_log_error(self, error: Exception) -> str:
        """The backend's words for why a worker's log could not be read."""
        return str(error)

    def read_log(self, instance_id: int, tail: int = 0) -> str:
        handle = self.running_handle(instance_id)
        if handle is not None:
            return read_workers(self.worker_logs(handle), tail, self.explain_log_error)
        return self._kept_log(instance_id, tail)

    def follow_log(self, instance_id: int) -> Iterator[str]:
        handle = self.running_handle(instance_id)
        if handle is not None:
            return FanIn(self.worker_logs(handle), explain=self.explain_log_error)
        return iter([self._kept_log(instance_id, 0)])

    def _kept_log(self, instance_id: int, tail: int) -> str:
        path = self._table.ended_log(instance_id)
        if path is None:
            raise KeyError(f"instance {instance_id} is not known to the {self.name} backend")
        return read_tail(path, tail, home=self.home)
