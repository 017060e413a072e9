"""An instance the kubernetes backend follows: its pods (or MPIJob), what was seen of them, its handle."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from hai_airflow.backends.common.base import Handle, Launch
from hai_airflow.backends.common.launches import handle_data
from hai_airflow.backends.kubernetes.pods import PodState

BACKEND = "kubernetes"
"""The backend's name, as its handles carry it."""


@dataclass
class KubeInstance:
    """An instance this backend follows."""

    instance_id: int
    kind: str
    """"pods" (one per worker, a gang when distributed) or "mpijob"."""
    pods: list[str]
    """Our pods in rank order; empty for an MPIJob, whose pods the operator names."""
    service: str | None
    mpijob: str | None
    log_path: Path
    started_at: float
    stopping: bool = False
    formed: bool = False
    """Every worker has been Running at once."""
    culprit: str | None = None
    logs: dict[str, bytes] = field(default_factory=dict)
    """Pod name -> its log as last captured (timestamped), kept for when the pod is gone."""
    last: dict[str, PodState] = field(default_factory=dict)
    """Pod name -> its last state seen, kept after the pod is deleted."""
    followers: list[threading.Thread] = field(default_factory=list)
    """Threads reading the logs of pods stopping with a grace, to their last line."""
    pending: Launch | None = None
    """The launch whose other workers' pods wait for worker 0's pod IP (`gang_address = "pod_ip"`)."""

    def handle(self, namespace: str) -> Handle:
        return Handle(
            self.instance_id,
            {
                "backend": BACKEND,
                "namespace": namespace,
                "kind": self.kind,
                "pods": list(self.pods),
                "service": self.service,
                "mpijob": self.mpijob,
                "log_path": str(self.log_path),
                "started_at": self.started_at,
            },
        )

    @classmethod
    def from_handle(cls, handle: Handle) -> KubeInstance:
        d = handle_data(handle, BACKEND)
        return cls(
            handle.instance_id,
            str(d["kind"]),
            list(d["pods"]),
            d.get("service"),
            d.get("mpijob"),
            Path(d["log_path"]),
            float(d["started_at"]),
        )
