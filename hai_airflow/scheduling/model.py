"""The planner's world: an immutable snapshot in, a list of decisions out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from hai_airflow.scheduling.fairshare import FairShare
from hai_airflow.spec import PLACED as PLACED  # the state groups live beside JobState, in spec
from hai_airflow.spec import WAITING as WAITING
from hai_airflow.spec import JobState, PriorityClass, holds_high_priority, priority_class


@dataclass(frozen=True, slots=True)
class Node:
    """A machine: capacity only; what is used is derived from the jobs placed on it."""

    name: str
    gpu_type: str
    gpus: int
    cpus: float
    memory_gb: float
    drained: bool = False
    """An admin drained it: no new placement (start or resume) here; the jobs on it run to their end."""


@dataclass(frozen=True, slots=True)
class WorkerPlacement:
    """Where one worker runs: a node and the GPU indices on it."""

    node: str
    gpus: tuple[int, ...]
    cpus: float = 0
    memory_gb: float = 0


Placement = tuple[WorkerPlacement, ...]


class Shape(NamedTuple):
    """What a job asks for: `workers` identical workers, each on one node of one GPU type.

    A tuple, because shapes key the per-cycle memos and are hashed once per queued job.
    """

    gpu_type: str | None
    workers: int
    gpus: int
    cpus: float
    memory_gb: float


@dataclass(frozen=True, slots=True)
class Job:
    """A job as the planner sees it. Times are seconds on the caller's clock (`now`)."""

    id: int
    user: str
    group: str
    state: JobState
    max_schedule: int
    submitted_at: float
    workers: int = 1
    gpus_per_worker: int = 0
    cpus_per_worker: float = 0
    memory_gb_per_worker: float = 0
    gpu_type: str | None = None
    started_at: float | None = None
    """Start of the current run (placed jobs)."""
    placement: Placement = ()
    """Where a placed job runs."""
    suspended_seconds: float = 0
    """Total time spent suspended so far (waiting again after a preemption)."""
    suspended_at: float | None = None
    """When the current suspension began (SUSPENDED jobs)."""
    preemptions: int = 0
    last_checkpoint_at: float | None = None
    elastic: bool = False
    min_workers: int = 0
    """A resizable job's least workers; 0 for one that never resizes. `workers` is the size it runs
    at (or resumes at) now, `max_workers` all it asked for."""
    max_workers: int = 0
    shape: Shape = field(init=False, repr=False, compare=False)
    """What it asks for, from the fields above (set once: a plan reads it for every queued job)."""
    high: bool = field(init=False, repr=False, compare=False)
    """High priority (`spec.holds_high_priority`: max_schedule > 0 and GPUs), set once like `shape`."""

    def __post_init__(self) -> None:
        workers = self.workers if self.workers > 1 else 1
        gpus, cpus, memory = self.gpus_per_worker, self.cpus_per_worker, self.memory_gb_per_worker
        object.__setattr__(self, "shape", Shape(self.gpu_type, workers, gpus, cpus, memory))
        object.__setattr__(self, "high", holds_high_priority(self.max_schedule, workers * gpus))

    @property
    def priority(self) -> PriorityClass:
        return priority_class(self.max_schedule)

    @property
    def total_gpus(self) -> int:
        return self.workers * self.gpus_per_worker

    @property
    def resizable(self) -> bool:
        return 0 < self.min_workers < self.max_workers


@dataclass(frozen=True, slots=True)
class Quota:
    """High-priority GPU limits: a group's and, per member, a personal one (None = unlimited)."""

    groups: dict[str, int | None] = field(default_factory=dict)
    users: dict[str, int | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Reservation:
    """GPUs freed (or being freed) by suspensions, held for the preemptor that caused them."""

    job_id: int
    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Snapshot:
    nodes: tuple[Node, ...]
    jobs: tuple[Job, ...]
    """Every unfinished job: waiting (PENDING/SUSPENDED) and placed (STARTING/RUNNING/SUSPENDING)."""
    quota: Quota = field(default_factory=Quota)
    reservations: tuple[Reservation, ...] = ()
    policy: str = "seed"
    """Name of the ordering/victim strategy (see `policies.POLICIES`)."""
    fair_share: FairShare | None = None
    """The users' recent use, for the fair-share term of low jobs' weight; None: no such term."""
    usage_version: int = field(default=0, compare=False)
    """The kept usage's version when the snapshot was taken (`ClusterState.snapshot`): `plan` refuses
    a usage passed beside it that moved on since."""


# ---- decisions --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Admit:
    """Start (or resume, for a SUSPENDED job) the job on this placement."""

    job_id: int
    placement: Placement
    resume: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Suspend:
    """Suspend a running low-priority job so that `preemptor_id` can run."""

    job_id: int
    preemptor_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class Reserve:
    """Wait these GPUs for the preemptor until it is admitted (controller stores it)."""

    job_id: int
    placement: Placement
    reason: str


@dataclass(slots=True)
class Wait:
    """The job keeps waiting; `reason` says why, in words a user understands.

    Not frozen, unlike the other decisions: a plan makes one per queued job, and a frozen dataclass
    takes three times as long to make. Nothing changes one after the plan.
    """

    job_id: int
    reason: str
    position: int
    blocked_by: int | None = None


@dataclass(frozen=True, slots=True)
class Reject:
    """The job can never run on this cluster (e.g. no node of its GPU type is large enough)."""

    job_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class Shrink:
    """Restart a running resizable low-priority job at `to` workers, on `placement` (the first `to`
    of its workers), so that `preemptor_id` can run on what the others free. It saves on the notice
    and resumes at once from that checkpoint; it loses the time since its last save, not its run."""

    job_id: int
    to: int
    placement: Placement
    preemptor_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class Grow:
    """Restart a running resizable job at `to` workers on `placement`: its workers and new ones."""

    job_id: int
    to: int
    placement: Placement
    reason: str


Decision = Admit | Suspend | Shrink | Grow | Reserve | Wait | Reject
