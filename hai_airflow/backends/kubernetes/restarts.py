"""After a server restart: delete what this owner made that no saved handle names."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from hai_airflow.backends.kubernetes import manifests as m
from hai_airflow.backends.kubernetes.cluster import Cluster
from hai_airflow.backends.kubernetes.instance import KubeInstance
from hai_airflow.backends.kubernetes.pods import PodState

log = logging.getLogger(__name__)


def delete_orphans(
    cluster: Cluster,
    present: Iterable[PodState],
    adopted: list[KubeInstance],
    mpijobs: Mapping[str, int | None],
) -> None:
    """Delete the pods and MPIJobs no adopted instance owns, and their instances' credentials."""
    known_instances = {inst.instance_id for inst in adopted}
    known_pods = {name for inst in adopted for name in inst.pods}
    orphans = [s for s in present if s.instance_id not in known_instances and s.name not in known_pods]
    for state in orphans:
        # Started by this server but never recorded (it died in between): the job is requeued,
        # so this copy must not run beside the new one.
        log.warning("deleting pod %s: no instance of this server owns it", state.name)
        cluster.delete("pod", state.name, 0)
    for name, instance_id in mpijobs.items():
        if instance_id not in known_instances:
            cluster.delete("mpijob", name, 0)
    # Their credentials (found by name: the server never lists Secrets).
    lone = {s.instance_id for s in orphans} | {i for i in mpijobs.values() if i not in known_instances}
    for instance_id in sorted(i for i in lone if i is not None):
        cluster.delete_credential(instance_id)


def reap_instance(cluster: Cluster, instance_id: int) -> None:
    """Delete the instance's pods and MPIJob (found by label), its gang Service and its credential's
    Secret: it started, but its handle was never saved."""
    for pod in cluster.instance_pods(instance_id):
        name = pod.metadata.name
        log.warning("deleting pod %s: the handle of instance %d was never saved", name, instance_id)
        cluster.delete("pod", name, 0)
    for name, owner in cluster.list_mpijobs().items():
        if owner == instance_id:
            cluster.delete("mpijob", name, 0)
    cluster.delete("service", m.instance_name(cluster.options, instance_id), 0)
    cluster.delete_credential(instance_id)
