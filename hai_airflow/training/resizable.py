"""Resizable data-parallel training: progress that survives a change of world size, Horovod's way.

A resizable job is stopped at a checkpoint and restarted at another size (``hvd.size()``,
``WORLD_SIZE``). What each step means then changes, so progress is kept in samples, and the rule says
what follows from the size:

- every rank trains on ``batch_per_rank`` samples a step, so a step at size ``s`` takes ``s *
  batch_per_rank`` samples (the global batch);
- the learning rate is ``base_lr * s`` (Horovod's linear scaling);
- the run is ``total_samples`` long whatever the sizes; its last step takes only what is left, so
  the samples done end at ``total_samples`` exactly;
- the samples come from one stream: epoch after epoch, each a shuffle of the data set seeded by
  (seed, epoch). A step takes the next global batch of the stream and rank ``r`` of ``s`` takes
  every ``s``-th of them from the ``r``-th (DistributedSampler's sharding), so across any resizes
  each position of the stream is trained on once, by one rank.

Optimizer steps are then exact too: a segment run at size ``s`` from sample ``a`` to ``b`` takes
``ceil((b - a) / (s * batch_per_rank))`` steps. Only the last step of the run can be short.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Progress:
    """How far a run is, in units that mean the same at every size; saved in each checkpoint.

    :param step: optimizer steps done, at whatever sizes they ran; the checkpoint's step.
    :param samples: samples trained on, summed over ranks: the position in the sample stream.
    :param size: the number of processes when it was saved.
    """

    step: int = 0
    samples: int = 0
    size: int = 1

    def as_state(self) -> dict[str, int]:
        """A plain dict for a checkpoint (no class of ours inside, so any loader reads it)."""
        return asdict(self)

    @classmethod
    def from_state(cls, raw: Any) -> Progress:
        """The progress a checkpoint holds under its ``"progress"`` key; a clear error if malformed."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"progress={raw!r}: expected a dict with step, samples and size.")
        values = {}
        for name in ("step", "samples", "size"):
            value = raw.get(name)
            if not isinstance(value, int) or value < (1 if name == "size" else 0):
                raise ValueError(f"progress.{name}={value!r}: expected a whole number (size at least 1).")
            values[name] = value
        return cls(**values)


@dataclass(frozen=True)
class LinearScaling:
    """Horovod's rule for a job whose size may change: fixed batch per rank, learning rate x size.

    :param total_samples: the run's length in samples (e.g. epochs x data set size).
    :param batch_per_rank: samples per rank and step, the same at every size.
    :param base_lr: the learning rate of one process; ``lr(size)`` scales it.
    """

    total_samples: int
    batch_per_rank: int
    base_lr: float

    def __post_init__(self) -> None:
        if self.total_samples < 1:
            raise ValueError(f"total_samples={self.total_samples}: a run trains on at least 1 sample.")
        if self.batch_per_rank < 1:
            raise ValueError(f"batch_per_rank={self.batch_per_rank}: each rank takes at least 1 sample.")
        if not self.base_lr > 0:
            raise ValueError(f"base_lr={self.base_lr}: the learning rate must be above 0.")

    def global_batch(self, size: int) -> int:
        """Samples of one full step at ``size`` processes."""
        return self.batch_per_rank * _checked_size(size)

    def lr(self, size: int) -> float:
        """The learning rate at ``size`` processes: ``base_lr * size``."""
        return self.base_lr * _checked_size(size)

    def step_samples(self, samples_done: int, size: int) -> int:
        """Samples the next step takes: a global batch, or what is left before the end."""
        return max(0, min(self.global_batch(size), self.total_samples - samples_done))

    def steps_left(self, samples_done: int, size: int) -> int:
        """Optimizer steps from ``samples_done`` to the end at ``size`` processes."""
        left = max(0, self.total_samples - samples_done)
        return -(-left // self.global_batch(size))

    def total_steps(self, progress: Progress, size: int) -> int:
        """The step the run ends at when it goes on at ``size`` from ``progress`` (for TrainingLoop)."""
        return progress.step + self.steps_left(progress.samples, size)

    def shard(self, samples_done: int, size: int, rank: int) -> range:
        """The stream positions rank ``rank`` of ``size`` trains on in the next step (may be empty
        in a short last step)."""
        if not 0 <= rank < _checked_size(size):
            raise ValueError(f"rank={rank}: expected 0..{size - 1} for size {size}.")
        end = samples_done + self.step_samples(samples_done, size)
        return range(samples_done + rank, end, size)

    def after_step(self, progress: Progress, size: int) -> Progress:
        """``progress`` once one more step has run at ``size``."""
        taken = self.step_samples(progress.samples, size)
        if taken == 0:
            raise ValueError(f"samples={progress.samples}: the run is complete; there is no next step.")
        return Progress(progress.step + 1, progress.samples + taken, size)


def resumed_progress(state: Any, step: int, rule: LinearScaling, size: int) -> Progress:
    """The progress of a loaded checkpoint: its ``"progress"``, or for a checkpoint written before
    progress was recorded, ``step`` full global batches at the current size."""
    if isinstance(state, Mapping) and "progress" in state:
        return Progress.from_state(state["progress"])
    samples = min(rule.total_samples, step * rule.global_batch(size))
    return Progress(step=step, samples=samples, size=size)


@dataclass
class SampleStream:
    """The data set's samples epoch after epoch, each epoch a shuffle seeded by (seed, epoch).

    Position ``p`` is sample ``order(p // samples)[p % samples]``: a pure function of the position,
    so a resumed run needs only the position to go on with the same data.

    :param samples: the data set's size.
    :param seed: the run's seed.
    """

    samples: int
    seed: int = 0
    _orders: dict[int, list[int]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise ValueError(f"samples={self.samples}: the data set is empty.")

    def order(self, epoch: int) -> list[int]:
        """Epoch ``epoch``'s order of the data set's indices."""
        if epoch not in self._orders:
            shuffled = list(range(self.samples))
            random.Random(f"{self.seed}/{epoch}").shuffle(shuffled)
            # Positions are read in increasing order, so older epochs are rarely wanted again (and
            # are shuffled anew if they are).
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            self._orders[epoch] = shuffled
        return self._orders[epoch]

    def indices(self, positions: range) -> list[int]:
        """The data set indices at stream ``positions``."""
        return [self.order(p // self.samples)[p % self.samples] for p in positions]


def _checked_size(size: int) -> int:
    if size < 1:
        raise ValueError(f"size={size}: a job has at least 1 process.")
    return size
