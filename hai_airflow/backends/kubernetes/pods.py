"""What the kubernetes backend needs to know of a pod, and how an instance's pods decide its end."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hai_airflow.backends.common.launches import NO_CODE, WorkerEnd, exit_words
from hai_airflow.backends.kubernetes.manifests import LABEL_INSTANCE, LABEL_WORKER, MAIN, MPI_ROLE_LABEL

TERMINAL = frozenset({"Succeeded", "Failed"})
BROKEN_AT_START = frozenset({"InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError"})
"""Waiting reasons no retry will cure: the instance fails at once instead of at the start timeout."""


@dataclass(frozen=True)
class PodState:
    """A pod as last seen by the watch."""

    name: str
    instance_id: int | None
    rank: int | None
    role: str | None
    """"launcher" or "worker" for MPIJob pods, None for our own pods."""
    phase: str
    exit_code: int | None
    """Exit code of the job container once it terminated."""
    reason: str
    """Why the container or pod ended or waits (OOMKilled, Evicted, ErrImagePull...), "" if nothing to say."""
    message: str
    deleting: bool
    grace_seconds: int | None
    """The grace of a requested deletion (metadata.deletionGracePeriodSeconds)."""
    ip: str = ""
    """The pod's IP once it has one (status.podIP)."""

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL

    @property
    def running(self) -> bool:
        return self.phase == "Running"

    @property
    def waiting_reason(self) -> str:
        return self.reason if self.phase == "Pending" else ""


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def pod_state(pod: Any) -> PodState:
    """Reduce a V1Pod (as the client returns it) to a PodState."""
    meta, status = pod.metadata, pod.status
    labels = meta.labels or {}
    phase = (status.phase if status else None) or "Pending"
    exit_code, reason, message = None, "", ""
    statuses = (status.container_statuses if status else None) or []
    main = next((c for c in statuses if c.name == MAIN), statuses[0] if statuses else None)
    if main is not None and main.state is not None:
        if main.state.terminated is not None:
            exit_code = main.state.terminated.exit_code
            reason = main.state.terminated.reason or ""
            message = main.state.terminated.message or ""
        elif main.state.waiting is not None:
            reason = main.state.waiting.reason or ""
            message = main.state.waiting.message or ""
    if not reason and status is not None:
        reason, message = status.reason or "", status.message or ""
    return PodState(
        name=meta.name,
        instance_id=_int(labels.get(LABEL_INSTANCE)),
        rank=_int(labels.get(LABEL_WORKER)),
        role=labels.get(MPI_ROLE_LABEL),
        phase=phase,
        exit_code=exit_code,
        reason=reason,
        message=message,
        deleting=meta.deletion_timestamp is not None,
        grace_seconds=meta.deletion_grace_period_seconds,
        ip=(status.pod_ip if status else None) or "",
    )


def worker_end(state: PodState | None) -> WorkerEnd:
    """How a pod ended, in the terms of the gang rule; None: it was never seen."""
    if state is None:
        return WorkerEnd(None)
    missing = f"{state.reason}: {state.message}".rstrip(": ") if state.reason else NO_CODE
    return WorkerEnd.of_container(state.exit_code, oom=state.reason == "OOMKilled", missing=missing)


def describe(state: PodState | None) -> str:
    """The words for how a pod ended."""
    return exit_words(worker_end(state))


@dataclass(frozen=True)
class MpiJobEnd:
    """How the MPI Operator says an MPIJob ended: its Succeeded or Failed condition."""

    succeeded: bool
    reason: str
    message: str

    @property
    def words(self) -> str:
        said = ": ".join(part for part in (self.reason, self.message) if part)
        return f"the MPIJob {'succeeded' if self.succeeded else 'failed'}" + (f" ({said})" if said else "")


def mpijob_end(mpijob: Mapping[str, Any]) -> MpiJobEnd | None:
    """The MPIJob's end from its status conditions (v2beta1 JobCondition); None while it has not ended."""
    conditions = (mpijob.get("status") or {}).get("conditions") or []
    for cond in reversed(conditions):
        if cond.get("type") in ("Succeeded", "Failed") and cond.get("status") == "True":
            return MpiJobEnd(cond["type"] == "Succeeded", cond.get("reason") or "", cond.get("message") or "")
    return None


def dropped_fields(sent: Mapping[str, Any], kept: Mapping[str, Any], path: str = "") -> list[str]:
    """Fields of `sent` missing from `kept` (the object as the API server stored it), as dotted paths.

    An API server prunes the fields a structural schema does not know, silently before Kubernetes 1.25
    (where `fieldValidation=Strict` refuses them instead): a dropped field is a mismatch to report.
    """
    dropped = []
    for key, value in sent.items():
        where = f"{path}.{key}" if path else key
        if key not in kept:
            dropped.append(where)
        elif isinstance(value, Mapping) and isinstance(kept[key], Mapping):
            dropped += dropped_fields(value, kept[key], where)
        elif isinstance(value, list) and isinstance(kept[key], list):
            for i, (a, b) in enumerate(zip(value, kept[key], strict=False)):
                if isinstance(a, Mapping) and isinstance(b, Mapping):
                    dropped += dropped_fields(a, b, f"{where}[{i}]")
    return dropped
