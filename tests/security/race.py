"""The race harness: a path flipped between a directory and a symlink while the server uses it."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from types import TracebackType


class Flipper:
    """Flips `path` between a directory of its own and a symlink to `target`, by renames, in a thread,
    holding each for `hold` seconds.

    At least `min_flips` flips happen before the block may end (the exit waits for them), and at
    most `max_flips`: the loop is bounded in count, and in time by the caller's work.
    """

    def __init__(
        self, path: Path, target: Path, min_flips: int = 500, max_flips: int = 200_000, hold: float = 0.0
    ) -> None:
        self.path, self.target, self.hold = path, target, hold
        self.min_flips, self.max_flips = min_flips, max_flips
        self.flips = 0
        self._dir, self._link = path.with_name(path.name + ".dir"), path.with_name(path.name + ".link")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flipper", daemon=True)

    def __enter__(self) -> Flipper:
        self.path.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self._link.unlink()
        self._link.symlink_to(self.target)
        self._thread.start()
        return self

    def _run(self) -> None:
        while self.flips < self.max_flips and not (self._stop.is_set() and self.flips >= self.min_flips):
            os.rename(self.path, self._dir)  # the directory steps aside...
            os.rename(self._link, self.path)  # ...and the symlink takes its name
            time.sleep(self.hold)
            os.rename(self.path, self._link)
            os.rename(self._dir, self.path)
            self.flips += 2
            time.sleep(self.hold)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(120)
        assert not self._thread.is_alive(), "the flipper did not stop"
