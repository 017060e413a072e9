"""How an instance's pods (or MPIJob) decide its end: rules over the states seen, no API call."""

from __future__ import annotations

from dataclasses import dataclass

from hai_airflow.backends.common.launches import WorkerEnd, gang_exit
from hai_airflow.backends.kubernetes.instance import KubeInstance
from hai_airflow.backends.kubernetes.pods import BROKEN_AT_START, MpiJobEnd, PodState, describe, worker_end

PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff")


@dataclass(frozen=True)
class Ending:
    """The instance ended: its exit code (None: it has none) and why; `lost` requeues its job."""

    code: int | None
    reason: str
    lost: bool = False


@dataclass(frozen=True)
class Doomed:
    """A worker failed while others still run: they are torn down, and `culprit` decides the end."""

    culprit: str
    running: list[str]


def gang_ending(inst: KubeInstance) -> Ending:
    """The gang rule over the last state seen of each of the instance's pods."""
    names = inst.pods or sorted(inst.last)
    ends = [worker_end(inst.last.get(name)) for name in names] or [WorkerEnd(None, missing="deleted")]
    first = inst.pods.index(inst.culprit) if inst.culprit in inst.pods else None
    ended = gang_exit(inst.instance_id, ends, first, inst.stopping)
    return Ending(ended.exit_code, ended.reason, ended.lost)


def pods_verdict(
    inst: KubeInstance, states: list[PodState | None], now: float, timeout: float
) -> Ending | Doomed | None:
    """The end of a gang of pods (`states` in rank order, None for a pod not present); None: it goes on."""
    present = [s for s in states if s is not None]
    if inst.stopping or inst.culprit is not None:
        # Pods we delete ourselves end the instance once none of them runs any more.
        return None if any(not s.terminal for s in present) else gang_ending(inst)
    if len(present) < len(states):
        missing = [n for n, s in zip(inst.pods, states, strict=True) if s is None and n in inst.last]
        if missing:
            return Ending(None, f"pod {missing[0]} was deleted outside hai", lost=True)
    failed = [s for s in present if s.terminal and s.exit_code != 0]
    if failed and any(not s.terminal for s in present):
        # One failed worker dooms a gang: the others would wait for it in a collective.
        return Doomed(failed[0].name, [s.name for s in present if not s.terminal])
    if present and len(present) == len(states) and all(s.terminal for s in present):
        return gang_ending(inst)
    broken = next((s for s in present if s.waiting_reason in BROKEN_AT_START), None)
    if broken is not None:
        return Ending(None, f"pod {broken.name} cannot start: {describe(broken)}")
    if not inst.formed and now - inst.started_at > timeout:
        return start_timed_out(present, len(states), timeout)
    return None


def mpijob_verdict(
    inst: KubeInstance, pods: list[PodState], ended: MpiJobEnd | None, now: float, timeout: float
) -> Ending | None:
    """The end of an MPIJob from its operator's word (`ended`) and its present pods; None: it goes on."""
    launcher = next((s for s in pods if s.role == "launcher"), None)
    if launcher is None:
        launcher = next((s for s in inst.last.values() if s.role == "launcher"), None)
        if inst.stopping and not pods:
            return gang_ending(inst)
    if ended is not None and not inst.stopping:
        # The operator's word decides; the launcher's exit code, when seen, says more of a failure.
        code = launcher.exit_code if launcher is not None and launcher.terminal else None
        if ended.succeeded:
            return Ending(0, "completed")
        return Ending(code if code else None, ended.words)
    if launcher is not None and launcher.running:
        inst.formed = True
    if launcher is not None and launcher.terminal:
        return Ending(launcher.exit_code, describe(launcher))
    if now - inst.started_at > timeout and not inst.formed and not inst.stopping:
        return start_timed_out(pods, None, timeout)
    return None


def start_timed_out(present: list[PodState], expected: int | None, timeout: float) -> Ending:
    """An instance whose workers were not all Running in time: lost (scheduled again), unless its image
    cannot be pulled, which no retry mends."""
    running = sum(1 for s in present if s.running)
    waiting = next((s for s in present if s.waiting_reason), None)
    if waiting is not None and waiting.waiting_reason in PULL_FAILURES:
        return Ending(None, f"the image cannot be pulled: {describe(waiting)}")
    why = f"; {waiting.name} waits: {describe(waiting)}" if waiting else ""
    total = f" of {expected}" if expected is not None else ""
    reason = (
        f"not every worker was Running within {timeout:g} s "
        f"({running}{total} running{why}); torn down to be scheduled again"
    )
    return Ending(None, reason, lost=True)
