"""Pod logs: served while the pods exist, captured before they go, kept as the instance's log at its end."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from pathlib import Path

from kubernetes.client.exceptions import ApiException

from hai_airflow.backends.common.live_logs import WorkerLog
from hai_airflow.backends.common.log_files import keep_log
from hai_airflow.backends.common.merged_logs import merge, stamped_only
from hai_airflow.backends.kubernetes import manifests as m
from hai_airflow.backends.kubernetes.cluster import Cluster
from hai_airflow.backends.kubernetes.instance import KubeInstance
from hai_airflow.backends.kubernetes.pods import pod_state

log = logging.getLogger(__name__)

UNSERVED = "[hai] no log could be read from the pods (their node did not serve it)\n"


class PodLogs:
    """The logs of one namespace's pods, captured into their instance under the backend's lock."""

    def __init__(self, cluster: Cluster, lock: threading.RLock, home: Path | None) -> None:
        self.cluster = cluster
        self.lock = lock
        self.home = home

    def capture(self, inst: KubeInstance, name: str, follow: bool = False) -> None:
        """Keep pod `name`'s log, timestamped as `merge` reads it; `follow`: until its container ends."""
        try:
            if follow:
                answer = self.cluster.core.read_namespaced_pod_log(
                    name, self.cluster.ns, container=m.MAIN, follow=True, timestamps=True,
                    _preload_content=False,
                )  # fmt: skip
                raw = b"".join(answer.stream())
            else:
                raw = b"".join(self.worker_log(name).open(False, None))
        except ApiException:
            return  # no kubelet answered (or the pod is gone): keep what was captured before
        except Exception as e:
            log.debug("cannot read the log of pod %s: %s", name, e)
            return
        raw = stamped_only(raw)
        with self.lock:
            # A later read never replaces a longer one (a follower may end after the pod's last read).
            if len(raw) >= len(inst.logs.get(name, b"")):
                inst.logs[name] = raw

    def follow_to_end(self, inst: KubeInstance, name: str) -> None:
        """Capture pod `name`'s log to its last line in a thread of its own, which the end joins."""
        follower = threading.Thread(target=self.capture, args=(inst, name, True), daemon=True)
        follower.start()
        inst.followers.append(follower)

    def keep(self, inst: KubeInstance, names: list[str]) -> None:
        """Write the pods' captured logs, merged by time, as the instance's log."""
        if names and not any(inst.logs.get(n) for n in names):
            text = UNSERVED
        else:
            text = merge([inst.logs.get(n, b"") for n in names])
        keep_log(inst.instance_id, inst.log_path, text.encode(), self.home)

    def of_running(self, inst: KubeInstance) -> list[WorkerLog]:
        """A running instance's pod logs in rank order; an MPIJob's is its launcher's (mpirun's)."""
        if inst.kind == "pods":
            names = inst.pods
        else:
            listed = self.cluster.instance_pods(inst.instance_id)
            names = sorted(p.metadata.name for p in listed if pod_state(p).role == "launcher")
        return [self.worker_log(name) for name in names]

    def worker_log(self, name: str) -> WorkerLog:
        core, ns = self.cluster.core, self.cluster.ns

        def open_log(follow: bool, tail: int | None) -> Iterable[bytes]:
            answer = core.read_namespaced_pod_log(
                name, ns, container=m.MAIN, follow=follow, timestamps=not follow,
                tail_lines=tail, _preload_content=False,
            )  # fmt: skip
            # A followed answer is read as it comes; the rest is read whole (it ends with the request).
            chunks: Iterable[bytes] = answer.stream() if follow else [answer.data]
            return chunks

        return WorkerLog(f"pod {name}", open_log)
