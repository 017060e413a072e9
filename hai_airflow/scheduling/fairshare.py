"""The fair-share term of the low-priority weight: each user's recent use against an equal share."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

HALF_LIFE_SECONDS = 7 * 86400.0
"""Recent use decays by half every this many seconds (Slurm's PriorityDecayHalfLife default, 7 days):
a GPU-hour a week ago counts half, four weeks ago a sixteenth."""

FAIR_SHARE_SECONDS = 7 * 86400.0
"""The fair-share term is this many seconds of waiting times the owner's factor (0..1): a user who used
nothing recently goes ahead of a heavy user's low-priority jobs that have waited up to a week longer."""

CPU_CORES_PER_GPU = 8.0
"""A job without GPUs is charged one GPU-second per this many core-seconds."""

WINDOW_SECONDS = 4 * HALF_LIFE_SECONDS
"""Use older than this counts less than a sixteenth: callers may leave it out of what they read."""


def charge_rate(gpus: int, cpus: float) -> float:
    """GPU-seconds a run is charged per second: its GPUs, or for a CPU job its cores / CPU_CORES_PER_GPU."""
    return float(gpus) if gpus > 0 else cpus / CPU_CORES_PER_GPU


def decayed(value: float, since: float, at: float) -> float:
    """`value` counted at `since`, as it counts at `at` (halved every HALF_LIFE_SECONDS)."""
    return value * 2.0 ** (-(at - since) / HALF_LIFE_SECONDS)


def run_use(rate: float, start: float, end: float, at: float) -> float:
    """What a run charged `rate` GPU-seconds a second over [start, end) counts at `at` (>= end): the
    integral of its charge, each second decayed from when it was used."""
    scale = HALF_LIFE_SECONDS / math.log(2.0)
    return (
        rate * scale * (2.0 ** (-(at - end) / HALF_LIFE_SECONDS) - 2.0 ** (-(at - start) / HALF_LIFE_SECONDS))
    )


@dataclass(frozen=True, slots=True)
class FairShare:
    """Each user's recent use (decayed GPU-seconds, as `run_use` counts them, all at the same moment): the
    fair-share term's input, computed by the caller (the server from its store, the simulator from its
    own records). A user absent from `use` used nothing.

    Every user listed has an equal share: a user's factor is 2^-(use / mean use of the users listed), as
    Slurm's classic fair-share factor 2^-(U/S): 1 for no use, 0.5 for the mean, towards 0 for more.
    """

    use: Mapping[str, float] = field(default_factory=dict)
    mean: float = field(init=False, compare=False)
    terms: dict[str, float] = field(init=False, repr=False, compare=False)
    """The term per user listed (FAIR_SHARE_SECONDS x factor), made once: a plan reads it per queued job."""

    def __post_init__(self) -> None:
        mean = sum(self.use.values()) / len(self.use) if self.use else 0.0
        object.__setattr__(self, "mean", mean)
        object.__setattr__(
            self, "terms", {u: FAIR_SHARE_SECONDS * self._factor(v) for u, v in self.use.items()}
        )

    def _factor(self, use: float) -> float:
        return 2.0 ** (-use / self.mean) if self.mean > 0 else 1.0

    def factor(self, user: str) -> float:
        """The user's fair-share factor, 0..1: more recent use than others, lower."""
        return self._factor(self.use.get(user, 0.0))

    def term(self, user: str) -> float:
        """Seconds the fair share adds to a low-priority job of this user's weight."""
        return self.terms.get(user, FAIR_SHARE_SECONDS)


MEASURE_SECONDS = 10.0
"""Callers measure recent use at most this often (the server from its store, the simulator on its
clock): two small queries on the server; ten seconds of use move a week-long figure by little."""


@dataclass(slots=True)
class UseLedger:
    """Each user's use of the runs that ended, decayed to when it was last added to, kept run by run; with
    the runs still going, `measure` gives the `FairShare` (what the simulator keeps from its events)."""

    ended: dict[str, tuple[float, float]] = field(default_factory=dict)
    """User -> (use, the moment it is counted at)."""

    def run_ended(self, user: str, rate: float, start: float, end: float) -> None:
        """A run charged `rate` GPU-seconds a second over [start, end) ended."""
        use, at = self.ended.get(user, (0.0, end))
        self.ended[user] = (decayed(use, at, end) + run_use(rate, start, end, end), end)

    def measure(self, running: Iterable[tuple[str, float, float]], now: float) -> FairShare:
        """The users' recent use at `now`: the ended runs', and of `running` (user, rate, start)."""
        use = {user: decayed(value, at, now) for user, (value, at) in self.ended.items()}
        for user, rate, start in running:
            use[user] = use.get(user, 0.0) + run_use(rate, start, now, now)
        return FairShare(use)
