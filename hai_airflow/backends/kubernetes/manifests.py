"""Kubernetes objects of an instance (worker pods, headless Service, MPIJob, the Secret of its job
credential) and the server's RBAC."""

from __future__ import annotations

import base64
import os
import shlex
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hai_airflow.backends.common.base import Launch, StartError
from hai_airflow.backends.common.confine import PathRefused, confine
from hai_airflow.backends.common.credential import credential_env
from hai_airflow.backends.common.jobuser import JobUser, RunAs
from hai_airflow.backends.common.launches import image_of
from hai_airflow.backends.common.mounts import job_paths, launch_rules
from hai_airflow.backends.common.workerenv import (
    Gang,
    WorkerSlot,
    host_ports,
    rank_env,
    worker_argv,
    worker_slots,
)
from hai_airflow.scheduling.model import WorkerPlacement
from hai_airflow.spec import DistributedJobSpec

LABEL_OWNER = "hai.io/owner"
LABEL_JOB = "hai.io/job-id"
LABEL_INSTANCE = "hai.io/instance-id"
LABEL_WORKER = "hai.io/worker"
ANNOTATION_TASK = "hai.io/task-name"
ANNOTATION_NODE = "hai.io/planned-node"
ANNOTATION_STOP = "hai.io/stop-requested"
MPI_ROLE_LABEL = "training.kubeflow.org/job-role"
MPI_GROUP, MPI_VERSION, MPI_PLURAL = "kubeflow.org", "v2beta1", "mpijobs"
GPU_RESOURCE = "nvidia.com/gpu"
"""The NVIDIA device plugin's resource name, the default of `gpu_resource`."""
LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
"""A Kubernetes label key or extended resource name: an optional DNS prefix, then a name."""
MAIN = "job"
"""Name of the container that runs the job's command in every pod."""
RUN_DIR = "/hai/run"
NOTICE_PATH = f"{RUN_DIR}/preempt-notice"
GIT_DIR = "/hai/code"
CREDENTIAL_DIR = "/hai/credential"
CREDENTIAL_PATH = f"{CREDENTIAL_DIR}/token"
"""Where a pod sees its instance's job credential (`HAI_TOKEN_FILE`): a Secret of its own, read-only."""
MASTER_PORT = 29500
POD_IP_ENV = "HAI_POD_IP"
"""A pod's own IP (downward API), in the pods of a gang that finds worker 0 by its pod IP."""
RENDEZVOUS_PORT = 29400
SSHD_CAPABILITIES: tuple[str, ...] = (
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "NET_BIND_SERVICE", "SETGID", "SETUID",
    "SYS_CHROOT",
)  # fmt: skip
"""What sshd in an MPIJob worker needs (privilege separation, port 22); every other container keeps none."""


class KubernetesOptions(BaseModel):
    """The `[backend]` table of `hai serve` for `backend = "kubernetes"`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str = Field(default="default", description="Namespace of every pod, Service and MPIJob.")
    kubeconfig: str | None = Field(
        default=None, description="kubeconfig file; default: in-cluster config, else ~/.kube/config."
    )
    context: str | None = Field(default=None, description="kubeconfig context; default: the current one.")
    owner: str = Field(
        default="hai",
        pattern=r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$",
        description="Label value and name prefix of this server's objects; a restarted server adopts these.",
    )
    pin: Literal["affinity", "node_name"] = Field(
        default="affinity",
        description="affinity: required node affinity to the planned node (the kube-scheduler binds); "
        "node_name: spec.nodeName (the planner alone decides, bypassing the kube-scheduler).",
    )
    network: Literal["pod", "host"] = Field(
        default="pod",
        description="pod: each pod has its own network; a gang finds worker 0 as `gang_address` says "
        "(by default the DNS name its headless Service gives). host: pods use their node's network "
        "(hostNetwork, as RDMA and NCCL set-ups often want); a gang meets at worker 0's node's InternalIP "
        "on ports spread by instance id, and no Service is made.",
    )
    gang_address: Literal["dns", "pod_ip"] = Field(
        default="dns",
        description="With network = pod, how the workers of a gang find worker 0. dns: by its pod's name "
        "under the headless Service (needs cluster DNS). pod_ip: by its pod IP: worker 0's pod is made "
        "first and the others once it has an IP (no DNS needed; a start takes one pod's sandbox longer).",
    )
    host_iface: str = Field(
        default="eth0",
        pattern=r"^[A-Za-z0-9_.:-]{1,15}$",
        description="With network = host: the nodes' interface gloo and NCCL use between workers.",
    )
    gpu_type_label: str = Field(
        default="hai.io/gpu-type",
        pattern=LABEL_KEY,
        description="Node label holding the GPU type (V100, A100...), which job pods select nodes by; "
        "`gpu_product_label` is read when it is missing.",
    )
    gpu_product_label: str = Field(
        default="nvidia.com/gpu.product",
        pattern=LABEL_KEY,
        description="Node label naming the GPU model, as NVIDIA's GPU feature discovery sets it "
        "(e.g. Tesla-V100-SXM2-16GB); the GPU type is read from it.",
    )
    gpu_resource: str = Field(
        default=GPU_RESOURCE,
        pattern=LABEL_KEY,
        description="Extended resource a GPU worker requests, as the device plugin advertises it "
        "(NVIDIA's: nvidia.com/gpu); the nodes' allocatable amount of it is their GPU count.",
    )
    virtual_gpus: bool = Field(
        default=False, description="Request no `gpu_resource`; jobs only see CUDA_VISIBLE_DEVICES."
    )
    nas_pvc: str | None = Field(
        default=None,
        description="ReadWriteMany PVC holding the NAS (code paths, model dirs, $HAI_HOME); a job pod "
        "mounts only its own sub-paths of it (code path, model dir), at the same paths as the hai server, "
        "which must mount it at nas_mount_path.",
    )
    nas_mount_path: str = Field(default="/nas", description="Where nas_pvc is mounted, in pods and server.")
    storage_mount_root: str = Field(
        default="/mnt/storage", description="Project storage PVC <id> is mounted at <root>/<id>."
    )
    git_image: str = Field(
        default="alpine/git:2.45.2", description="Image of the init container that clones git code."
    )
    mpi_operator: Literal["auto", "always", "never"] = Field(
        default="auto",
        description="Distributed jobs as Kubeflow MPIJobs: auto = when the MPIJob CRD is installed.",
    )
    mpi_launcher_cpus: float = Field(default=1, gt=0, description="CPU cores of the MPIJob launcher.")
    start_timeout_seconds: float = Field(
        default=300,
        gt=0,
        description="All workers of an instance must be Running within this time, else it is torn down.",
    )
    service_account: str | None = Field(
        default=None,
        description="Service account of job pods; without one, pods get no API token mounted.",
    )
    run_as: RunAs = Field(
        default=None,
        min_length=1,
        description='"{user}": each job\'s pods run as the uid, gid and groups of the account named like '
        "its owner (looked up on the server, as the local and docker backends do; hai serve must run as "
        "root), so users' jobs cannot read or overwrite each other's files on a shared NAS. Not with "
        "run_as_user.",
    )
    run_as_user: int | None = Field(
        default=None, ge=0, description="UID every job container runs as; default: the image's user."
    )
    run_as_group: int | None = Field(
        default=None, ge=0, description="GID job containers run as; default: the image's group."
    )
    run_as_non_root: bool = Field(
        default=False,
        description="Refuse to start images whose user is root (MPIJob workers run sshd as root).",
    )
    fs_group: int | None = Field(
        default=None, ge=0, description="Group that owns the pods' volumes (their files are writable to it)."
    )
    image_pull_secrets: tuple[str, ...] = Field(default=(), description="Pull secrets of job pods.")

    @model_validator(mode="after")
    def _one_account_rule(self) -> KubernetesOptions:
        if self.run_as is not None and (self.run_as_user is not None or self.run_as_group is not None):
            raise ValueError(
                "run_as and run_as_user/run_as_group both name the pods' account; keep one "
                '(run_as = "{user}" for each owner\'s own account)'
            )
        return self

    @model_validator(mode="after")
    def _mpijob_needs_pod_network(self) -> KubernetesOptions:
        if self.mpi_operator == "always" and self.network == "host":
            raise ValueError(
                'mpi_operator = "always" needs network = "pod": an MPIJob worker runs sshd on port 22, '
                "which the node's own sshd holds on the host network"
            )
        return self


# ---- names ---------------------------------------------------------------------------------------


def instance_name(opts: KubernetesOptions, instance_id: int) -> str:
    """Name of the instance's Service or MPIJob."""
    return f"{opts.owner}-{instance_id}"


def pod_name(opts: KubernetesOptions, instance_id: int, rank: int) -> str:
    return f"{opts.owner}-{instance_id}-w{rank}"


def credential_name(opts: KubernetesOptions, instance_id: int) -> str:
    """Name of the Secret holding the instance's job credential."""
    return f"{opts.owner}-{instance_id}-credential"


def instance_labels(opts: KubernetesOptions, launch: Launch) -> dict[str, str]:
    return {
        LABEL_OWNER: opts.owner,
        LABEL_JOB: str(launch.job_id),
        LABEL_INSTANCE: str(launch.instance_id),
    }


def instance_selector(opts: KubernetesOptions, instance_id: int | None = None) -> str:
    selector = f"{LABEL_OWNER}={opts.owner}"
    return selector if instance_id is None else f"{selector},{LABEL_INSTANCE}={instance_id}"


def _annotations(launch: Launch, node: str | None) -> dict[str, str]:
    out = {ANNOTATION_TASK: launch.spec.task_name}
    if node:
        out[ANNOTATION_NODE] = node
    return out


# ---- the pieces of a pod ---------------------------------------------------------------------------


def slots(launch: Launch) -> list[WorkerSlot]:
    # A CPU job may come without a placement: one worker holding no GPU, wherever it fits.
    return worker_slots(launch.placement or (WorkerPlacement(node="", gpus=()),))


def is_distributed(launch: Launch) -> bool:
    return isinstance(launch.spec, DistributedJobSpec)


def _storage_path(opts: KubernetesOptions, storage_id: int) -> str:
    return f"{opts.storage_mount_root.rstrip('/')}/{storage_id}"


def environment(
    launch: Launch, slot: WorkerSlot, opts: KubernetesOptions, gang: Gang, launcher: bool = True
) -> dict[str, str]:
    """Section 4 variables, the job's `env`, the worker's ranks; paths rewritten to the pod's view.

    Without `launcher` (an MPIJob's pods) a per-gpu job gets no rendezvous of the platform: mpirun's.
    """
    env = {**launch.env, **launch.spec.env}
    env |= rank_env(launch.spec, slot, len(slots(launch)), gang, launcher, renumber=not opts.virtual_gpus)
    # No exec into pods: an elastic pod's preStop hook creates the notice here, then SIGTERM follows.
    env["HAI_PREEMPT_NOTICE"] = NOTICE_PATH
    env |= credential_env(launch, CREDENTIAL_PATH)
    for storage_id in launch.spec.project_storage:
        if storage_id in launch.storages:
            env[f"HAI_PROJECT_STORAGE_{storage_id}"] = _storage_path(opts, storage_id)
    return env


def gang_of(launch: Launch, opts: KubernetesOptions, master_host: str) -> Gang:
    """Where an instance's processes meet: worker 0 at `master_host` (its pod's DNS name, or its node's
    address on the host network), or inside the one pod of a standalone job."""
    if opts.network == "host":
        # The node's ports are shared by every pod on it.
        port, rendezvous = host_ports(launch.instance_id)
        if is_distributed(launch):
            return Gang(master_host, port, master_host, rendezvous, opts.host_iface, "0.0.0.0")
        return Gang("127.0.0.1", port, "127.0.0.1", rendezvous, "lo", "127.0.0.1")
    if is_distributed(launch):
        return Gang(master_host, MASTER_PORT, master_host, RENDEZVOUS_PORT, "eth0", "0.0.0.0")
    return Gang("127.0.0.1", MASTER_PORT, "127.0.0.1", RENDEZVOUS_PORT, "lo", "127.0.0.1")


def waits_for_worker0(launch: Launch, opts: KubernetesOptions) -> bool:
    """Whether the other workers' pods are made only once worker 0's pod has an IP (`gang_address`)."""
    return uses_service(launch, opts) and opts.gang_address == "pod_ip" and len(slots(launch)) > 1


def uses_service(launch: Launch, opts: KubernetesOptions) -> bool:
    """Whether the instance's pods need a headless Service: a gang on the pod network finds worker 0 by it."""
    return is_distributed(launch) and opts.network == "pod"


def _resources(worker: WorkerPlacement, opts: KubernetesOptions) -> dict[str, Any]:
    amounts: dict[str, str] = {}
    if worker.cpus > 0:
        amounts["cpu"] = f"{round(worker.cpus * 1000)}m"
    if worker.memory_gb > 0:
        amounts["memory"] = f"{round(worker.memory_gb * 1024)}Mi"
    if worker.gpus and not opts.virtual_gpus:
        amounts[opts.gpu_resource] = str(len(worker.gpus))
    # Requests equal to limits: the pod gets exactly what the planner counted (Guaranteed QoS).
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def nas_mounts(launch: Launch, opts: KubernetesOptions) -> list[dict[str, str]]:
    """The sub-paths of the NAS a job's pod mounts (its code path and model dir), never the whole volume.

    Each is checked against the path rule and its symlinks resolved now, on the server, which mounts
    the NAS at the same path; the kubelet keeps a `subPath` inside the volume.
    """
    if not opts.nas_pvc:
        return []
    rules = launch_rules(launch)
    roots = dict.fromkeys((os.path.normpath(opts.nas_mount_path), os.path.realpath(opts.nas_mount_path)))
    mounts: dict[str, dict[str, str]] = {}
    for path, field in job_paths(launch):
        try:
            source = confine(path, rules, field)
        except PathRefused as e:
            raise StartError(f"{e.field} {e.path} cannot be mounted: {e.reason}") from None
        subs = [os.path.relpath(source, root) for root in roots]
        sub = next((p for p in subs if p != "." and not p.startswith("..")), None)
        if sub is None:
            raise StartError(
                f"{field} {path} cannot be mounted: pods see only sub-paths of the NAS "
                f"({opts.nas_mount_path}), never all of it or what lies outside"
            )
        target = os.path.normpath(path)
        mounts.setdefault(target, {"name": "nas", "mountPath": target, "subPath": sub})
    return list(mounts.values())


def _volumes(launch: Launch, opts: KubernetesOptions) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts of the main container)."""
    volumes: list[dict[str, Any]] = [{"name": "hai-run", "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [{"name": "hai-run", "mountPath": RUN_DIR}]
    if launch.spec.shm:
        volumes.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{launch.spec.shm}Mi"}})
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
    if launch.spec.code_src == "git":
        volumes.append({"name": "code", "emptyDir": {}})
        mounts.append({"name": "code", "mountPath": GIT_DIR})
    if launch.job.credential is not None:
        volumes.append({"name": "hai-credential", "secret": credential_volume(launch, opts)})
        mounts.append({"name": "hai-credential", "mountPath": CREDENTIAL_DIR, "readOnly": True})
    if nas := nas_mounts(launch, opts):
        volumes.append({"name": "nas", "persistentVolumeClaim": {"claimName": opts.nas_pvc}})
        mounts += nas
    for storage_id in launch.spec.project_storage:
        claim = launch.storages.get(storage_id)
        if claim:
            name = f"storage-{storage_id}"
            volumes.append({"name": name, "persistentVolumeClaim": {"claimName": claim}})
            mounts.append({"name": name, "mountPath": _storage_path(opts, storage_id)})
    return volumes, mounts


def credential_volume(launch: Launch, opts: KubernetesOptions) -> dict[str, Any]:
    """The Secret volume of the job credential. Its file belongs to root, so the pod's account reads it
    through `fs_group` where one is set (0440), else as anyone in the pod (0444): only the job runs there."""
    mode = 0o440 if opts.fs_group is not None else 0o444
    return {
        "secretName": credential_name(opts, launch.instance_id),
        "items": [{"key": "token", "path": "token"}],
        "defaultMode": mode,
    }


def credential_secret(launch: Launch, opts: KubernetesOptions) -> dict[str, Any]:
    """The Secret the instance's pods mount their job credential from (`CREDENTIAL_PATH`)."""
    token = launch.job.credential or ""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": credential_name(opts, launch.instance_id),
            "namespace": opts.namespace,
            "labels": instance_labels(opts, launch),
        },
        "data": {"token": base64.b64encode(token.encode("ascii")).decode("ascii")},
    }


def pod_security(opts: KubernetesOptions, account: JobUser | None = None) -> dict[str, Any]:
    """The pod's securityContext: the job owner's `account` (with `run_as`) or the configured user and
    group, and the runtime's default seccomp profile."""
    context: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    uid, gid = (account.uid, account.gid) if account is not None else (opts.run_as_user, opts.run_as_group)
    if uid is not None:
        context["runAsUser"] = uid
    if gid is not None:
        context["runAsGroup"] = gid
    if account is not None and (extra := sorted(set(account.groups) - {account.gid})):
        context["supplementalGroups"] = extra
    if opts.run_as_non_root:
        context["runAsNonRoot"] = True
    if opts.fs_group is not None:
        context["fsGroup"] = opts.fs_group
    return context


def container_security(keep: tuple[str, ...] = ()) -> dict[str, Any]:
    """A container's securityContext: not privileged, no privilege escalation, no capability but `keep`."""
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if keep:
        capabilities["add"] = list(keep)
    return {"privileged": False, "allowPrivilegeEscalation": False, "capabilities": capabilities}


def _git_init(launch: Launch, opts: KubernetesOptions) -> dict[str, Any]:
    argv = ["git", "clone", "--quiet", "--depth", "1", "--single-branch"]
    if launch.spec.git_branch:
        argv += ["--branch", launch.spec.git_branch]
    argv += ["--", launch.spec.code_path, GIT_DIR]
    return {
        "name": "git-clone",
        "image": opts.git_image,
        "imagePullPolicy": "IfNotPresent",
        "command": argv,
        "env": [{"name": "GIT_TERMINAL_PROMPT", "value": "0"}],
        "volumeMounts": [{"name": "code", "mountPath": GIT_DIR}],
        "securityContext": container_security(),
    }


def _pre_stop() -> dict[str, Any]:
    # Runs in the container before the kubelet's SIGTERM; the grace period covers both.
    script = (
        f'mkdir -p {RUN_DIR} && printf \'{{"reason": "preempted"}}\\n\' > {NOTICE_PATH}.tmp '
        f"&& mv {NOTICE_PATH}.tmp {NOTICE_PATH}"
    )
    return {"preStop": {"exec": {"command": ["/bin/sh", "-c", script]}}}


def _affinity(nodes: list[str], spread: bool, labels: Mapping[str, str]) -> dict[str, Any]:
    affinity: dict[str, Any] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": nodes}]}
                ]
            }
        }
    }
    if spread:
        affinity["podAntiAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": dict(labels)}, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    return affinity


def pod_spec(
    launch: Launch,
    opts: KubernetesOptions,
    worker: WorkerPlacement,
    env: Mapping[str, str],
    command: list[str],
    nodes: list[str],
    spread: bool = False,
    pod_labels: Mapping[str, str] | None = None,
    keep_capabilities: tuple[str, ...] = (),
    account: JobUser | None = None,
) -> dict[str, Any]:
    """The spec of a pod that runs `command` in the job's image on one of `nodes`, as `account` (the
    owner's, with `run_as`)."""
    volumes, mounts = _volumes(launch, opts)
    container: dict[str, Any] = {
        "name": MAIN,
        "image": image_of(launch),
        # Never pull an image the node already has: jobs run what was built, not the newest tag.
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "workingDir": GIT_DIR if launch.spec.code_src == "git" else launch.spec.code_path,
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "volumeMounts": mounts,
        "securityContext": container_security(keep_capabilities),
    }
    if resources := _resources(worker, opts):
        container["resources"] = resources
    if launch.spec.elastic:
        container["lifecycle"] = _pre_stop()
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": launch.spec.effective_grace_seconds,
        "containers": [container],
        "volumes": volumes,
        "securityContext": pod_security(opts, account),
        # A job has no business with the Kubernetes API unless the admin gave its pods an account.
        "automountServiceAccountToken": opts.service_account is not None,
    }
    if launch.spec.code_src == "git":
        spec["initContainers"] = [_git_init(launch, opts)]
    if opts.network == "host":
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    real_nodes = [n for n in nodes if n]
    if real_nodes and opts.pin == "node_name" and len(real_nodes) == 1:
        spec["nodeName"] = real_nodes[0]
    elif real_nodes:
        spec["affinity"] = _affinity(real_nodes, spread, pod_labels or {})
    gpu_type = getattr(launch.spec, "gpu_type", None)
    if worker.gpus and gpu_type:
        spec["nodeSelector"] = {opts.gpu_type_label: gpu_type}
    if worker.gpus and not opts.virtual_gpus:
        spec["tolerations"] = [{"key": opts.gpu_resource, "operator": "Exists", "effect": "NoSchedule"}]
    if opts.service_account:
        spec["serviceAccountName"] = opts.service_account
    if opts.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in opts.image_pull_secrets]
    return spec


# ---- whole objects ----------------------------------------------------------------------------------


def worker_pods(
    launch: Launch, opts: KubernetesOptions, master_address: str = "", account: JobUser | None = None
) -> list[dict[str, Any]]:
    """One pod per worker: standalone and CPU jobs, and the gang of a distributed job without MPIJob.

    On the host network a gang meets at `master_address`, worker 0's planned node's address. On the pod
    network it meets at worker 0's DNS name, or with `gang_address = "pod_ip"` at `master_address`,
    worker 0's pod IP (empty: worker 0's own, as the downward API gives it: what its own pod is made with).
    """
    service = instance_name(opts, launch.instance_id)
    if opts.network == "host":
        gang = gang_of(launch, opts, master_address)
    elif opts.gang_address == "pod_ip":
        gang = gang_of(launch, opts, master_address or f"$({POD_IP_ENV})")
    else:
        gang = gang_of(launch, opts, f"{pod_name(opts, launch.instance_id, 0)}.{service}")
    pods = []
    for slot in slots(launch):
        worker = launch.placement[slot.rank] if launch.placement else WorkerPlacement(node="", gpus=())
        name = pod_name(opts, launch.instance_id, slot.rank)
        labels = {**instance_labels(opts, launch), LABEL_WORKER: str(slot.rank)}
        env = environment(launch, slot, opts, gang)
        command = worker_argv(launch.spec, slot, gang, ["/bin/sh", "-c", launch.spec.cmd])
        spec = pod_spec(launch, opts, worker, env, command, [worker.node], account=account)
        if waits_for_worker0(launch, opts):
            # Defined first: Kubernetes expands $(HAI_POD_IP) only in variables that come after it.
            own_ip = {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
            spec["containers"][0]["env"].insert(0, own_ip)
        if uses_service(launch, opts):
            # With the headless Service of the same name, rank 0 is reachable as <pod>.<service>.
            spec["hostname"] = name
            spec["subdomain"] = service
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": opts.namespace,
                    "labels": labels,
                    "annotations": _annotations(launch, worker.node),
                },
                "spec": spec,
            }
        )
    return pods


def gang_service(launch: Launch, opts: KubernetesOptions) -> dict[str, Any]:
    """Headless Service giving every gang pod a DNS name, before readiness (rendezvous comes first)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": instance_name(opts, launch.instance_id),
            "namespace": opts.namespace,
            "labels": instance_labels(opts, launch),
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": instance_labels(opts, launch),
            "ports": [
                {"name": "torch", "port": MASTER_PORT, "targetPort": MASTER_PORT},
                {"name": "horovod", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT},
            ],
        },
    }


def mpirun_argv(launch: Launch, forwarded: Iterable[str]) -> list[str]:
    """The launcher's command: one process per GPU over every worker (the operator writes the hostfile).

    Ranks start under the workers' sshd, which does not pass its container's environment on: every
    variable named in `forwarded` (the launcher's own: the job's `HAI_*` set and its `env`) goes to every
    rank with `-x NAME`, so a rank sees the same model dir, resume flag and notice path as a pod would.
    """
    total = sum(max(1, len(w.gpus)) for w in launch.placement) or 1
    inner = shlex.join(["/bin/sh", "-c", launch.spec.cmd])
    names = sorted(set(forwarded) - {"NCCL_DEBUG", "PATH", "LD_LIBRARY_PATH"})
    exports = [arg for name in names for arg in ("-x", name)]
    return [
        "mpirun", "--allow-run-as-root", "-np", str(total), "-bind-to", "none", "-map-by", "slot",
        "-x", "NCCL_DEBUG=WARN", "-x", "PATH", "-x", "LD_LIBRARY_PATH", *exports,
        "/bin/sh", "-c", inner,
    ]  # fmt: skip


def mpijob(launch: Launch, opts: KubernetesOptions) -> dict[str, Any]:
    """A Kubeflow MPIJob (v2beta1): one launcher running mpirun, the workers running sshd."""
    placement = launch.placement
    gpus_per_worker = len(placement[0].gpus) if placement else 0
    nodes = sorted({w.node for w in placement if w.node})
    labels = instance_labels(opts, launch)
    first = slots(launch)[0]
    env = environment(launch, first, opts, gang_of(launch, opts, ""), launcher=False)
    # mpirun gives every process its rank; the per-worker rank variables would contradict it.
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
                "HAI_WORKER_INDEX", "HAI_NODE"):  # fmt: skip
        env.pop(key, None)
    worker_template_spec = pod_spec(
        launch, opts, placement[0], env, ["/usr/sbin/sshd", "-De"], nodes,
        spread=len(nodes) == len(placement), pod_labels={**labels, MPI_ROLE_LABEL: "worker"},
        keep_capabilities=SSHD_CAPABILITIES,
    )  # fmt: skip
    launcher_worker = WorkerPlacement(node="", gpus=(), cpus=opts.mpi_launcher_cpus, memory_gb=1)
    launcher_env = {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}
    argv = mpirun_argv(launch, launcher_env)
    launcher_spec = pod_spec(launch, opts, launcher_worker, launcher_env, argv, [])
    # v2beta1 takes the restart policy from each replica spec and warns (SetPodTemplateRestartPolicy)
    # when a template sets its own.
    for spec in (launcher_spec, worker_template_spec):
        spec.pop("restartPolicy", None)
    return {
        "apiVersion": f"{MPI_GROUP}/{MPI_VERSION}",
        "kind": "MPIJob",
        "metadata": {
            "name": instance_name(opts, launch.instance_id),
            "namespace": opts.namespace,
            "labels": labels,
            "annotations": _annotations(launch, ",".join(nodes)),
        },
        "spec": {
            "slotsPerWorker": max(1, gpus_per_worker),
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 0},
            # mpirun starts once every worker's sshd is ready, not into a race with them.
            "launcherCreationPolicy": "WaitForWorkersReady",
            "mpiImplementation": "OpenMPI",
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "restartPolicy": "Never",
                    "template": {
                        "metadata": {"labels": dict(labels), "annotations": _annotations(launch, None)},
                        "spec": launcher_spec,
                    },
                },
                "Worker": {
                    "replicas": len(placement),
                    "restartPolicy": "Never",
                    "template": {
                        "metadata": {"labels": dict(labels), "annotations": _annotations(launch, None)},
                        "spec": worker_template_spec,
                    },
                },
            },
        },
    }


# ---- RBAC --------------------------------------------------------------------------------------------


def rbac(namespace: str, subject: Mapping[str, str]) -> list[dict[str, Any]]:
    """The least the server needs: pods, logs, exec, Services, MPIJobs and the Secrets of job credentials
    (made and deleted, never read or listed) in its namespace; nodes to read.

    `subject` is an RBAC subject, e.g. {"kind": "ServiceAccount", "name": "hai", "namespace": "hai"}.
    """
    name = "hai-server"
    watchable = ["get", "list", "watch", "create", "delete"]
    namespaced_rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": [*watchable, "patch"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
        # `hai exec`: its websocket is a GET, which newer API servers also check as create
        {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get", "create"]},
        {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "create", "delete"]},
        # each instance's job credential, mounted by its pods: made and deleted by name, never read
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "delete"]},
        {"apiGroups": [MPI_GROUP], "resources": [MPI_PLURAL], "verbs": watchable},
    ]
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": namespace},
            "rules": namespaced_rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [dict(subject)],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{name}-{namespace}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [dict(subject)],
        },
    ]


def rbac_yaml(namespace: str, service_account: str) -> str:
    """`rbac` for a service account, as a multi-document YAML for `kubectl apply -f -`."""
    import json

    subject = {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}
    # JSON is YAML: no YAML library is needed to print manifests kubectl accepts.
    return "".join(f"---\n{json.dumps(doc, indent=2)}\n" for doc in rbac(namespace, subject))


if __name__ == "__main__":
    import sys

    # python -m hai_airflow.backends.kubernetes.manifests NAMESPACE [SERVICE_ACCOUNT] | kubectl apply -f -
    ns = sys.argv[1] if len(sys.argv) > 1 else "default"
    sys.stdout.write(rbac_yaml(ns, sys.argv[2] if len(sys.argv) > 2 else "hai"))
