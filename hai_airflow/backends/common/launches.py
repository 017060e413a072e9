"""What every backend does the same way with a launch, the handle it saved for one, and its exit."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from hai_airflow.backends.common.base import Exit, Handle, Launch
from hai_airflow.spec import DistributedJobSpec
from hai_airflow.training.preemption import EXIT_SAVED_ON_NOTICE


def image_of(launch: Launch) -> str:
    """The image every worker runs: the worker image of a distributed job, else the job's image."""
    spec = launch.spec
    if isinstance(spec, DistributedJobSpec) and spec.worker_image:
        return spec.worker_image
    return spec.image


def handle_data(handle: Handle, backend: str) -> Mapping[str, Any]:
    """A saved handle's data, once it is known to be `backend`'s; ValueError names the other one."""
    data = handle.data
    if data.get("backend") != backend:
        raise ValueError(f"it belongs to the {data.get('backend')!r} backend")
    return data


Adopted = TypeVar("Adopted")


def read_handles(
    handles: list[Handle], backend: str, read: Callable[[Handle], Adopted]
) -> tuple[list[Adopted], list[Exit]]:
    """Each saved handle read back by `read`; one it cannot read ends its instance as lost, saying why."""
    adopted, lost = [], []
    for handle in handles:
        try:
            adopted.append(read(handle))
        except (KeyError, TypeError, ValueError) as e:
            reason = f"the {backend} backend cannot read the instance's handle ({e!r})"
            lost.append(Exit(handle.instance_id, None, reason, lost=True))
    return adopted, lost


NO_CODE = "no exit code"


@dataclass(frozen=True)
class WorkerEnd:
    """How one worker of an instance ended, as its backend saw it: what the gang rule decides on."""

    code: int | None
    """Its exit code; None when it ended without one."""
    signal: int | None = None
    """The signal that ended it, where the backend can tell."""
    oom: bool = False
    """It was killed for exceeding its memory limit."""
    node: str | None = None
    """Where it ran, for backends whose reasons name the node."""
    missing: str = NO_CODE
    """What is known of an end without an exit code (a pod's reason, a process that vanished)."""

    @classmethod
    def of_process(cls, code: int | None, node: str | None = None, missing: str = NO_CODE) -> WorkerEnd:
        """A process's end as subprocess reports it: a negative code is the signal that killed it."""
        signal = -code if code is not None and code < 0 else None
        return cls(code, signal, node=node, missing=missing)

    @classmethod
    def of_container(cls, code: int | None, oom: bool = False, missing: str = NO_CODE) -> WorkerEnd:
        """A container's end: a code above 128 is 128 + the signal that killed its main process."""
        signal = code - 128 if code is not None and code > 128 else None
        return cls(code, signal, oom=oom, missing=missing)


def exit_words(end: WorkerEnd) -> str:
    """How a worker's end reads in an instance's end reason, on every backend."""
    if end.code is None:
        return end.missing
    if end.oom:
        return f"killed for exceeding its memory limit (exit code {end.code})"
    if end.code == 0:
        return "completed"
    if end.signal is not None:
        return f"killed by signal {end.signal}" + (f" (exit code {end.code})" if end.code > 0 else "")
    return f"exit code {end.code}"


def gang_exit(
    instance_id: int, workers: Sequence[WorkerEnd], first_failed: int | None = None, stop_asked: bool = False
) -> Exit:
    """How an instance of one or more workers ended, by one rule for every backend.

    The deciding worker: (1) the one seen failing while the others ran (its failure took them
    down); else (2) the first that failed with an exit code; else (3) the first that saved on notice
    (75, so the job is resumed); else (4) the first without an exit code; else the instance completed.
    Without an exit code it is lost (requeued) unless the platform stopped it. A gang's reason names
    the worker only when its failure came unasked: after a stop, every worker's end was asked for.
    """
    rank = _deciding(workers, first_failed)
    if rank is None:
        return Exit(instance_id, 0, "completed")
    end = workers[rank]
    words = exit_words(end)
    if end.code is None and stop_asked:
        return Exit(instance_id, None, f"stopped by the platform ({words})")
    if len(workers) > 1 and (first_failed is not None or not stop_asked):
        where = f" on {end.node}" if end.node else ""
        words = f"worker {rank}{where} failed: {words}"
    return Exit(instance_id, end.code, words, lost=end.code is None)


def _deciding(workers: Sequence[WorkerEnd], first_failed: int | None) -> int | None:
    """The index of the worker whose end is the instance's (see `gang_exit`); None: all exited 0."""
    if first_failed is not None:
        return first_failed
    codes = [w.code for w in workers]
    failed = [i for i, c in enumerate(codes) if c is not None and c not in (0, EXIT_SAVED_ON_NOTICE)]
    saved = [i for i, c in enumerate(codes) if c == EXIT_SAVED_ON_NOTICE]
    missing = [i for i, c in enumerate(codes) if c is None]
    return next(iter(failed + saved + missing), None)
