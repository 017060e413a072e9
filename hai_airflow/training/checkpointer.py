"""Atomic, rotating checkpoints in the job's model directory, and finding the newest one that loads."""

from __future__ import annotations

import os
import pickle
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hai_airflow.training._stderr import warn
from hai_airflow.training.distributed import rank

CHECKPOINT_DIR_ENVS = ("HAI_CHECKPOINT_DIR", "HAI_MODEL_DIR")
LATEST_ENV = "HAI_LATEST_CHECKPOINT"
RESUME_ENV = "HAI_RESUME"
# checkpoint-<step>.pt holds a torch.save archive, .pkl a plain pickle; the step is the number of
# steps completed, so it is also the step to resume at.
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)\.(pt|pkl)$")
_TEMP_PREFIX = ".checkpoint-"
_ZIP_MAGIC = b"PK\x03\x04"


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint.

    :param step: steps completed when it was saved; resume the loop at this step.
    :param state: what was passed to ``Checkpointer.save``.
    :param path: the file it was loaded from.
    """

    step: int
    state: Any
    path: Path


class Checkpointer:
    """Saves checkpoints atomically, keeps the newest few and loads the newest one that is intact.

    :param dir: where checkpoints live; defaults to ``$HAI_CHECKPOINT_DIR``, else ``$HAI_MODEL_DIR``,
        else ``./checkpoints``.
    :param keep: how many of the newest checkpoints to keep; older ones are deleted after a save.
    """

    def __init__(self, dir: str | os.PathLike[str] | None = None, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep={keep}: a checkpointer must keep at least 1 checkpoint.")
        self.dir = Path(dir) if dir is not None else _default_dir()
        self.keep = keep

    def save(self, state: Any, step: int) -> Path | None:
        """Write ``state`` as the checkpoint of ``step`` and return its path; a no-op off rank 0.

        The file appears complete or not at all: a kill at any moment leaves the previous
        checkpoints as they were.
        """
        if step < 0:
            raise ValueError(f"step={step}: a checkpoint's step counts completed steps, never below 0.")
        if rank() != 0:
            return None
        self.dir.mkdir(parents=True, exist_ok=True)
        self._remove_leftover_temps()
        with_torch = _holds_tensors(state)
        final = self.dir / f"checkpoint-{step:08d}.{'pt' if with_torch else 'pkl'}"
        temp = self.dir / f"{_TEMP_PREFIX}{step:08d}.tmp-{os.getpid()}"
        try:
            with open(temp, "wb") as out:
                if with_torch:
                    import torch

                    torch.save(state, out)
                else:
                    pickle.dump(state, out, protocol=pickle.HIGHEST_PROTOCOL)
                out.flush()
                # The bytes must be on disk before the name points at them, or a crash could leave
                # a complete-looking name over an empty file.
                os.fsync(out.fileno())
            os.replace(temp, final)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        _fsync_dir(self.dir)
        self._prune(just_saved=final)
        return final

    def checkpoints(self) -> list[Path]:
        """This directory's checkpoint files, newest step first."""
        return [path for _, path in self._in_dir()]

    def load_latest(self, map_location: Any = "cpu") -> Checkpoint | None:
        """The newest checkpoint that loads, or None when there is none (a first start).

        ``$HAI_LATEST_CHECKPOINT`` competes with the directory's files by step and wins ties; when
        it is not named ``checkpoint-<step>``, it is used only if none of them loads, at the step
        stored under its ``"step"`` key (else 0). Files that do not load are skipped with a warning.
        Loading unpickles, so only load your own checkpoints.

        :param map_location: where torch tensors are loaded; the CPU by default, so a job resumed on
            other GPUs loads too (``load_state_dict`` moves them to the model's device).
        """
        for step, path in self._candidates():
            try:
                state = _load(path, map_location)
            except FileNotFoundError:  # pruned by rank 0 meanwhile; an older one follows
                continue
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"[:300]
                warn(f"skipping checkpoint {path}: it does not load: damaged or cut short ({reason}).")
                continue
            if step is None:
                step = _step_inside(state, path)
            return Checkpoint(step=step, state=state, path=path)
        if os.environ.get(RESUME_ENV) == "1":
            warn(f"{RESUME_ENV}=1 but {self.dir} holds no checkpoint that loads; starting from step 0.")
        return None

    def _in_dir(self) -> list[tuple[int, Path]]:
        try:
            entries = list(os.scandir(self.dir))
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            match = CHECKPOINT_NAME.match(entry.name)
            if match is None:
                continue
            try:
                written = entry.stat().st_mtime_ns
            except FileNotFoundError:  # pruned by rank 0 meanwhile
                continue
            found.append((int(match.group(1)), written, Path(entry.path)))
        # Same step in both formats: the later write first.
        found.sort(reverse=True)
        return [(step, path) for step, _, path in found]

    def _candidates(self) -> list[tuple[int | None, Path]]:
        candidates: list[tuple[int | None, Path]] = list(self._in_dir())
        named = os.environ.get(LATEST_ENV)
        if not named:
            return candidates
        latest = Path(named)
        if not latest.is_file():
            warn(f"{LATEST_ENV}={named} does not exist; looking in {self.dir} instead.")
            return candidates
        candidates = [(s, p) for s, p in candidates if not _same_file(p, latest)]
        match = CHECKPOINT_NAME.match(latest.name)
        if match is None:
            # A file of another kind (say final weights): this directory's own checkpoints, whose
            # steps are known, come first; it serves when none of them loads.
            return [*candidates, (None, latest)]
        step = int(match.group(1))
        newer = [(s, p) for s, p in candidates if s is not None and s > step]
        older = [(s, p) for s, p in candidates if s is None or s <= step]
        return [*newer, (step, latest), *older]

    def _prune(self, just_saved: Path) -> None:
        for _, path in self._in_dir()[self.keep :]:
            if path != just_saved:
                path.unlink(missing_ok=True)

    def _remove_leftover_temps(self) -> None:
        # A temp file only outlives its save when that process was killed mid-write; only rank 0
        # ever writes here, so any temp file that is not being written now is garbage.
        for entry in os.scandir(self.dir):
            if entry.name.startswith(_TEMP_PREFIX) and ".tmp-" in entry.name:
                Path(entry.path).unlink(missing_ok=True)


def _default_dir() -> Path:
    for name in CHECKPOINT_DIR_ENVS:
        if value := os.environ.get(name):
            return Path(value)
    return Path("checkpoints")


def _holds_tensors(state: Any, depth: int = 0) -> bool:
    """True when torch is loaded and ``state`` holds a tensor or module (then torch.save writes it)."""
    torch = sys.modules.get("torch")
    if torch is None or depth > 8:
        return False
    if isinstance(state, torch.Tensor | torch.nn.Module):
        return True
    if isinstance(state, Mapping):
        return any(_holds_tensors(value, depth + 1) for value in state.values())
    if isinstance(state, list | tuple):
        return any(_holds_tensors(value, depth + 1) for value in state)
    return False


def _load(path: Path, map_location: Any) -> Any:
    with open(path, "rb") as source:
        magic = source.read(len(_ZIP_MAGIC))
        source.seek(0)
        if magic == _ZIP_MAGIC:
            try:
                import torch
            except ImportError:
                raise RuntimeError("it was written by torch.save and torch is not installed") from None
            # Our own files hold optimizer state and other objects, not only weights.
            return torch.load(source, map_location=map_location, weights_only=False)
        return pickle.load(source)


def _step_inside(state: Any, path: Path) -> int:
    if isinstance(state, Mapping) and isinstance(state.get("step"), int):
        return int(state["step"])
    warn(f"{path} is not named checkpoint-<step> and holds no 'step'; resuming it at step 0.")
    return 0


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
