"""What a start prepares before the pods: the job's account, its model dir on the NAS, its credential."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace

from kubernetes.client.exceptions import ApiException

from hai_airflow.backends.common.base import Launch, StartError
from hai_airflow.backends.common.confine import make_beneath
from hai_airflow.backends.common.jobuser import JobUser, job_user
from hai_airflow.backends.common.workerenv import per_gpu
from hai_airflow.backends.kubernetes import manifests as m
from hai_airflow.backends.kubernetes.cluster import Cluster, explain
from hai_airflow.backends.kubernetes.instance import KubeInstance
from hai_airflow.backends.kubernetes.pods import dropped_fields

log = logging.getLogger(__name__)


def owner_account(opts: m.KubernetesOptions, launch: Launch) -> JobUser | None:
    """With `run_as`, the account the job's pods run as (its owner's); StartError when missing."""
    if opts.run_as is None:
        return None
    try:
        return job_user(opts.run_as, launch.job.user)
    except KeyError:
        raise StartError(
            f"run_as: there is no OS user for {launch.job.user!r} on this server; "
            "create it or change [backend] run_as"
        ) from None


def make_model_dir(opts: m.KubernetesOptions, launch: Launch) -> None:
    """Create a missing model dir on the NAS, walking down from its mount without following a
    link, for the pods' account (`run_as_user`); the pods mount it by `subPath`. A server that
    does not mount the NAS itself leaves that to the kubelet."""
    model_dir = launch.job.model_dir
    if not opts.nas_pvc or model_dir.is_dir() or not os.path.isdir(opts.nas_mount_path):
        return
    account = owner_account(opts, launch)
    uid: int | None = account.uid if account else opts.run_as_user
    gid: int | None = account.gid if account else opts.run_as_group
    if gid is None:
        gid = opts.fs_group
    owner = (uid if uid is not None else -1, gid if gid is not None else -1)
    try:
        make_beneath(opts.nas_mount_path, str(model_dir), owner=owner)
    except OSError as e:
        raise StartError(f"cannot create model_dir {model_dir}: {e.strerror or e}") from None


def put_credential(cluster: Cluster, launch: Launch, created: list[tuple[str, str]]) -> Launch:
    """Make the Secret of the instance's job credential, which its pods mount (replacing one an
    earlier start of the same instance left): the launch to start. Where the server may not make
    Secrets (RBAC from before credentials), the job starts without one, and the log says why."""
    if launch.job.credential is None:
        return launch
    secret = m.credential_secret(launch, cluster.options)
    name = secret["metadata"]["name"]
    try:
        try:
            cluster.core.create_namespaced_secret(cluster.ns, secret)
        except ApiException as e:
            if e.status != 409:
                raise
            cluster.delete("secret", name, 0)
            cluster.core.create_namespaced_secret(cluster.ns, secret)
    except ApiException as e:
        if e.status != 403:
            raise
        log.warning(
            "instance %d starts without a job credential (no HAI_TOKEN_FILE): the server may not "
            "create Secrets in %s (%s); apply the RBAC that `python -m hai_airflow.backends."
            "kubernetes.manifests` prints",
            launch.instance_id,
            cluster.ns,
            explain(e),
        )
        return replace(launch, job=replace(launch.job, credential=None))
    created.append(("secret", name))
    return launch


def uses_mpijob(cluster: Cluster, launch: Launch, account: JobUser | None) -> bool:
    """mpirun starts a process per GPU: the MPIJob fits per-gpu jobs only; its workers' sshd runs as
    root, so jobs that run as their owner's account are gangs of pods."""
    return (
        account is None
        and m.is_distributed(launch)
        and per_gpu(launch.spec)
        and cluster.options.network == "pod"
        and cluster.mpi_operator_installed()
    )


def create_mpijob(cluster: Cluster, launch: Launch, created: list[tuple[str, str]]) -> KubeInstance:
    """Create the instance's MPIJob (a distributed job the MPI Operator runs)."""
    body = m.mpijob(launch, cluster.options)
    # Strict: a field the installed operator's schema does not know is refused, not dropped.
    stored = cluster.custom.create_namespaced_custom_object(
        m.MPI_GROUP, m.MPI_VERSION, cluster.ns, m.MPI_PLURAL, body, field_validation="Strict"
    )
    name = body["metadata"]["name"]
    created.append(("mpijob", name))
    # Before Kubernetes 1.25 the API server drops such a field instead: compare what it kept.
    dropped = dropped_fields(body["spec"], (stored or {}).get("spec") or {}, "spec")
    if dropped:
        cluster.delete_all(created)
        raise StartError(
            f"the installed MPI Operator's MPIJob schema has no field {dropped[0]}: upgrade the "
            f"operator to one serving {m.MPI_GROUP}/{m.MPI_VERSION} with it, or set "
            '[backend] mpi_operator = "never" to run distributed jobs as pods'
        )
    return KubeInstance(launch.instance_id, "mpijob", [], None, name, launch.log_path, time.time())


def create_pods(
    cluster: Cluster, launch: Launch, account: JobUser | None, created: list[tuple[str, str]]
) -> KubeInstance:
    """Create the instance's gang Service and pods; with `gang_address = "pod_ip"` worker 0's only,
    the others waiting (`pending`) for its IP."""
    opts, ns = cluster.options, cluster.ns
    service = None
    if m.uses_service(launch, opts):
        svc = m.gang_service(launch, opts)
        cluster.core.create_namespaced_service(ns, svc)
        service = svc["metadata"]["name"]
        created.append(("service", service))
    pods = m.worker_pods(launch, opts, cluster.master_node_address(launch), account)
    later = m.waits_for_worker0(launch, opts)
    for pod in pods[:1] if later else pods:
        cluster.core.create_namespaced_pod(ns, pod)
        created.append(("pod", pod["metadata"]["name"]))
    names = [pod["metadata"]["name"] for pod in pods]
    inst = KubeInstance(launch.instance_id, "pods", names, service, None, launch.log_path, time.time())
    inst.pending = launch if later else None
    return inst
