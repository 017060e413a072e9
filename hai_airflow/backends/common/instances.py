"""The instances a backend follows: the live ones by id, and where the logs of those that ended lie."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Generic, Protocol, TypeVar


class Followed(Protocol):
    """What the table needs of a backend's own instance record."""

    instance_id: int
    log_path: Path
    stopping: bool


Inst = TypeVar("Inst", bound=Followed)


class InstanceTable(Generic[Inst]):
    """Live instances by id and the kept logs of ended ones, under the backend's one lock.

    An instance is live from `add` until `forget`, which remembers where its log was kept, so its
    log stays readable once the backend no longer follows it.
    """

    def __init__(self, lock: threading.RLock | None = None) -> None:
        self.lock = lock if lock is not None else threading.RLock()
        """Guards the table, and whatever else of the backend changes with it."""
        self._live: dict[int, Inst] = {}
        self._ended_logs: dict[int, Path] = {}

    def add(self, inst: Inst) -> None:
        """Follow `inst` (replacing an instance of the same id)."""
        with self.lock:
            self._live[inst.instance_id] = inst

    def get(self, instance_id: int) -> Inst | None:
        """The live instance `instance_id`; None once it ended (or when it is unknown)."""
        with self.lock:
            return self._live.get(instance_id)

    def live(self) -> list[Inst]:
        """The live instances, in the order they were added."""
        with self.lock:
            return list(self._live.values())

    def ask_stop(self, instance_id: int) -> Inst | None:
        """Mark the live instance `instance_id` as stopping, and return it; None when it is not live."""
        with self.lock:
            inst = self._live.get(instance_id)
            if inst is not None:
                inst.stopping = True
            return inst

    def forget(self, inst: Inst, kept: int | None = None) -> None:
        """Stop following `inst`; its log stays readable from where it was kept. With `kept`, only the
        logs of the last `kept` ended instances stay known (memory bounded on a long-lived server)."""
        with self.lock:
            self._live.pop(inst.instance_id, None)
            self._ended_logs.pop(inst.instance_id, None)  # ended again: now the latest
            self._ended_logs[inst.instance_id] = inst.log_path
            while kept is not None and len(self._ended_logs) > kept:
                del self._ended_logs[next(iter(self._ended_logs))]

    def ended_log(self, instance_id: int) -> Path | None:
        """Where the log of ended instance `instance_id` was kept; None when none ended by that id."""
        with self.lock:
            return self._ended_logs.get(instance_id)

    def knows(self, instance_id: int) -> bool:
        """Whether `instance_id` is live, or ended with its log still known."""
        with self.lock:
            return instance_id in self._live or instance_id in self._ended_logs
