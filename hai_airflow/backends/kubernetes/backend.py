"""The kubernetes backend: pods per worker (or a Kubeflow MPIJob), followed with a watch, found by labels."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream
from kubernetes.stream.ws_client import STDERR_CHANNEL, STDOUT_CHANNEL
from kubernetes.utils.quantity import parse_quantity

from hai_airflow.backends.common.base import BackendUnavailable, Exit, Handle, Launch, StartError
from hai_airflow.backends.common.confine import make_beneath
from hai_airflow.backends.common.execs import CONTAINER_WRAPPER, ExecRefused, ExecRun, split_pid
from hai_airflow.backends.common.inventory import gpu_type
from hai_airflow.backends.common.jobuser import JobUser, job_user
from hai_airflow.backends.common.launches import WorkerEnd, gang_exit, handle_data, read_handles
from hai_airflow.backends.common.live_logs import ServedLogs, WorkerLog
from hai_airflow.backends.common.merged_logs import merge, stamped_only
from hai_airflow.backends.common.safefs import trusted_root, write_below
from hai_airflow.backends.common.workerenv import per_gpu
from hai_airflow.backends.kubernetes import manifests as m
from hai_airflow.backends.kubernetes.pods import (
    BROKEN_AT_START,
    MpiJobEnd,
    PodState,
    describe,
    dropped_fields,
    mpijob_end,
    pod_state,
    worker_end,
)
from hai_airflow.scheduling.model import Node
from hai_airflow.spec import canonical_gpu_type

EXEC_KILL_SECONDS = 10.0
"""How long killing a command of `hai exec` (by a second exec) and its stream's end may take."""
log = logging.getLogger(__name__)
WATCH_SECONDS = 20
"""A watch request ends after this long and is renewed from the last resourceVersion (bounds close())."""
API_WAIT_SECONDS = 2.0
"""How long `poll` waits for an API server the watch cannot reach before it raises `ApiUnreachable`
(longer than the watch's one second between tries, so a cut stream alone never raises)."""


class ApiUnreachable(BackendUnavailable):
    """The pod watch cannot reach the API server: the controller must neither plan nor start now (a
    start would fail its job), only wait; exits that happened meanwhile are read once it answers."""


@dataclass
class _Instance:
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
                "backend": KubernetesBackend.name,
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
    def from_handle(cls, handle: Handle) -> _Instance:
        d = handle_data(handle, KubernetesBackend.name)
        return cls(
            handle.instance_id,
            str(d["kind"]),
            list(d["pods"]),
            d.get("service"),
            d.get("mpijob"),
            Path(d["log_path"]),
            float(d["started_at"]),
        )


def api_client(opts: m.KubernetesOptions) -> client.ApiClient:
    """A client from the configured kubeconfig, else the in-cluster service account, else ~/.kube/config."""
    if opts.kubeconfig:
        return config.new_client_from_config(config_file=opts.kubeconfig, context=opts.context)
    try:
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)
        return client.ApiClient(cfg)
    except config.ConfigException:
        return config.new_client_from_config(context=opts.context)


class KubernetesBackend(ServedLogs):
    """Runs instances as pods; pod states come from one watch, exits are decided in `poll`.

    :param options: the `[backend]` table (see `KubernetesOptions`).
    :param home: the platform home (unused: launches bring their own paths).
    """

    name = "kubernetes"
    on_exit: Callable[[], None] | None = None
    """Never called: exits are learnt inside `poll()`."""

    def __init__(self, options: Mapping[str, Any] | None = None, home: Path | None = None) -> None:
        self.options = m.KubernetesOptions.model_validate(dict(options or {}))
        self.home = home
        self.api = api_client(self.options)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.ns = self.options.namespace
        self._lock = threading.RLock()
        self._instances: dict[int, _Instance] = {}
        self._pods: dict[str, PodState] = {}
        self._ended_logs: dict[int, Path] = {}
        self._closing = threading.Event()
        self._resource_version: str | None = None
        self._answering = threading.Event()
        """Set while the watch reaches the API server (cleared when a request fails to, set again by
        the list that follows)."""
        self._answering.set()
        self._unreachable = ""
        """Why the watch last failed to reach the API server."""
        self._watcher: threading.Thread | None = None
        self._watch_stream: watch.Watch | None = None

    # ---- inventory --------------------------------------------------------------------------------

    def inventory(self) -> list[Node] | None:
        """Schedulable nodes with their allocatable GPUs, CPUs, memory and GPU-type label."""
        try:
            items = self.core.list_node().items
        except ApiException as e:
            log.warning("cannot list nodes (%s); using the configured [[nodes]]", e.reason)
            return None
        nodes = []
        for n in items:
            if n.spec is not None and n.spec.unschedulable:
                continue
            alloc = (n.status.allocatable if n.status else None) or {}
            labels = n.metadata.labels or {}
            product = labels.get(self.options.gpu_product_label, "")
            named = labels.get(self.options.gpu_type_label) or (gpu_type(product) if product else "")
            kind = canonical_gpu_type(named) if named else "none"
            nodes.append(
                Node(
                    name=n.metadata.name,
                    gpu_type=kind,
                    gpus=int(parse_quantity(alloc.get(self.options.gpu_resource, "0"))),
                    cpus=float(parse_quantity(alloc.get("cpu", "0"))),
                    memory_gb=round(float(parse_quantity(alloc.get("memory", "0"))) / 1024**3, 1),
                )
            )
        return sorted(nodes, key=lambda node: node.name)

    # ---- start ------------------------------------------------------------------------------------

    def _make_model_dir(self, launch: Launch) -> None:
        """Create a missing model dir on the NAS, walking down from its mount without following a
        link, for the pods' account (`run_as_user`); the pods mount it by `subPath`. A server that
        does not mount the NAS itself leaves that to the kubelet."""
        opts, model_dir = self.options, launch.job.model_dir
        if not opts.nas_pvc or model_dir.is_dir() or not os.path.isdir(opts.nas_mount_path):
            return
        account = self._owner_account(launch)
        uid: int | None = account.uid if account else opts.run_as_user
        gid: int | None = account.gid if account else opts.run_as_group
        if gid is None:
            gid = opts.fs_group
        owner = (uid if uid is not None else -1, gid if gid is not None else -1)
        try:
            make_beneath(opts.nas_mount_path, str(model_dir), owner=owner)
        except OSError as e:
            raise StartError(f"cannot create model_dir {model_dir}: {e.strerror or e}") from None

    def _owner_account(self, launch: Launch) -> JobUser | None:
        """With `run_as`, the account the job's pods run as (its owner's); StartError when missing."""
        if self.options.run_as is None:
            return None
        try:
            return job_user(self.options.run_as, launch.job.user)
        except KeyError:
            raise StartError(
                f"run_as: there is no OS user for {launch.job.user!r} on this server; "
                "create it or change [backend] run_as"
            ) from None

    def start(self, launch: Launch) -> Handle:
        # Check the job's paths before anything is created (a refused one raises StartError).
        m.nas_mounts(launch, self.options)
        account = self._owner_account(launch)
        self._make_model_dir(launch)
        self._ensure_watch()
        use_mpijob = self._uses_mpijob(launch, account)
        created: list[tuple[str, str]] = []
        try:
            launch = self._put_credential(launch, created)
            if use_mpijob:
                body = m.mpijob(launch, self.options)
                # Strict: a field the installed operator's schema does not know is refused, not dropped.
                stored = self.custom.create_namespaced_custom_object(
                    m.MPI_GROUP, m.MPI_VERSION, self.ns, m.MPI_PLURAL, body, field_validation="Strict"
                )
                name = body["metadata"]["name"]
                created.append(("mpijob", name))
                # Before Kubernetes 1.25 the API server drops such a field instead: compare what it kept.
                dropped = dropped_fields(body["spec"], (stored or {}).get("spec") or {}, "spec")
                if dropped:
                    for kind, made in created:
                        self._delete(kind, made, 0)
                    raise StartError(
                        f"the installed MPI Operator's MPIJob schema has no field {dropped[0]}: upgrade the "
                        f"operator to one serving {m.MPI_GROUP}/{m.MPI_VERSION} with it, or set "
                        '[backend] mpi_operator = "never" to run distributed jobs as pods'
                    )
                inst = _Instance(launch.instance_id, "mpijob", [], None, name, launch.log_path, time.time())
            else:
                service = None
                if m.uses_service(launch, self.options):
                    svc = m.gang_service(launch, self.options)
                    self.core.create_namespaced_service(self.ns, svc)
                    service = svc["metadata"]["name"]
                    created.append(("service", service))
                pods = m.worker_pods(launch, self.options, self._master_node_address(launch), account)
                later = m.waits_for_worker0(launch, self.options)
                for pod in pods[:1] if later else pods:
                    self.core.create_namespaced_pod(self.ns, pod)
                    created.append(("pod", pod["metadata"]["name"]))
                names = [pod["metadata"]["name"] for pod in pods]
                inst = _Instance(
                    launch.instance_id, "pods", names, service, None, launch.log_path, time.time()
                )
                inst.pending = launch if later else None
        except ApiException as e:
            for kind, name in created:
                self._delete(kind, name, 0)
            raise StartError(f"the Kubernetes API refused it: {_explain(e)}") from None
        with self._lock:
            self._instances[launch.instance_id] = inst
            # The watch may have seen the new pods before the instance was registered.
            inst.last.update({n: st for n, st in self._pods.items() if st.instance_id == launch.instance_id})
            first = self._pods.get(inst.pods[0]) if inst.pods else None
        if first is not None:
            self._make_the_others(inst, first)
        return inst.handle(self.ns)

    def _uses_mpijob(self, launch: Launch, account: JobUser | None) -> bool:
        """mpirun starts a process per GPU: the MPIJob fits per-gpu jobs only; its workers' sshd runs as
        root, so jobs that run as their owner's account are gangs of pods."""
        return (
            account is None
            and m.is_distributed(launch)
            and per_gpu(launch.spec)
            and self.options.network == "pod"
            and self._mpi_operator_installed()
        )

    def _put_credential(self, launch: Launch, created: list[tuple[str, str]]) -> Launch:
        """Make the Secret of the instance's job credential, which its pods mount (replacing one an
        earlier start of the same instance left): the launch to start. Where the server may not make
        Secrets (RBAC from before credentials), the job starts without one, and the log says why."""
        if launch.job.credential is None:
            return launch
        secret = m.credential_secret(launch, self.options)
        name = secret["metadata"]["name"]
        try:
            try:
                self.core.create_namespaced_secret(self.ns, secret)
            except ApiException as e:
                if e.status != 409:
                    raise
                self._delete("secret", name, 0)
                self.core.create_namespaced_secret(self.ns, secret)
        except ApiException as e:
            if e.status != 403:
                raise
            log.warning(
                "instance %d starts without a job credential (no HAI_TOKEN_FILE): the server may not "
                "create Secrets in %s (%s); apply the RBAC that `python -m hai_airflow.backends."
                "k8s_manifests` prints",
                launch.instance_id,
                self.ns,
                _explain(e),
            )
            return replace(launch, job=replace(launch.job, credential=None))
        created.append(("secret", name))
        return launch

    def _make_the_others(self, inst: _Instance, first: PodState) -> None:
        """Once worker 0's pod has an IP, make the other workers' pods of a gang that meets there.

        Called from the watch: a refusal here is logged, and the gang, never formed, is torn down when
        its start times out (`_check`)."""
        if not first.ip or first.terminal:
            return
        with self._lock:
            launch, inst.pending = inst.pending, None
            if launch is None or inst.stopping:
                return
        for pod in m.worker_pods(launch, self.options, first.ip, self._owner_account(launch))[1:]:
            try:
                self.core.create_namespaced_pod(self.ns, pod)
            except ApiException as e:
                log.warning("cannot make pod %s: %s", pod["metadata"]["name"], _explain(e))
                return

    def _master_node_address(self, launch: Launch) -> str:
        """On the host network, where a gang meets: the InternalIP of worker 0's planned node."""
        if self.options.network != "host" or not m.is_distributed(launch) or not launch.placement:
            return ""
        node = launch.placement[0].node
        try:
            addresses = self.core.read_node(node).status.addresses or []
        except ApiException as e:
            raise StartError(f"cannot read node {node}'s address: {_explain(e)}") from None
        for kind in ("InternalIP", "ExternalIP"):
            for address in addresses:
                if address.type == kind:
                    return str(address.address)
        raise StartError(f"node {node} reports no InternalIP, so its workers cannot meet on the host network")

    def _mpi_operator_installed(self) -> bool:
        if self.options.mpi_operator != "auto":
            return self.options.mpi_operator == "always"
        try:
            resources = self.custom.get_api_resources(m.MPI_GROUP, m.MPI_VERSION)
        except ApiException as e:
            if e.status == 404:
                return False
            raise StartError(f"cannot tell whether the MPI Operator is installed: {_explain(e)}") from None
        return any(r.name == m.MPI_PLURAL for r in (resources.resources or []))

    # ---- stop -------------------------------------------------------------------------------------

    def stop(self, instance_id: int, grace_seconds: int, notice: bool) -> None:
        """Delete the pods with the grace; an elastic pod's preStop hook writes the notice before SIGTERM."""
        with self._lock:
            inst = self._instances.get(instance_id)
            if inst is None:
                return
            inst.stopping = True
            inst.pending = None
            names = self._pod_names(inst)
        grace = max(0, grace_seconds)
        for name in names:
            # A pod deleted without grace takes its log with it.
            self._capture(inst, name)
            if grace > 0:
                # What it prints in its grace (the save on notice) comes after this read, and the kubelet
                # removes the pod as soon as its containers stopped: follow its log to the end instead.
                follower = threading.Thread(target=self._capture, args=(inst, name, True), daemon=True)
                follower.start()
                inst.followers.append(follower)
            if notice:
                stamp = json.dumps({"at": time.time(), "grace_seconds": grace, "notice": True})
                with contextlib.suppress(ApiException):
                    self.core.patch_namespaced_pod(
                        name, self.ns, {"metadata": {"annotations": {m.ANNOTATION_STOP: stamp}}}
                    )
        if inst.mpijob:
            self._delete("mpijob", inst.mpijob, grace)
        for name in names:
            self._delete("pod", name, grace)

    def _delete(self, kind: str, name: str, grace: int) -> None:
        body = client.V1DeleteOptions(grace_period_seconds=grace, propagation_policy="Background")
        # The answer is not read: API servers before 1.22 answer a Service's delete with a Status, which
        # kubernetes>=37's typed client cannot read as the Service it expects.
        raw = {"body": body, "_preload_content": False}
        try:
            if kind == "pod":
                answer = self.core.delete_namespaced_pod(name, self.ns, **raw)
            elif kind == "service":
                answer = self.core.delete_namespaced_service(name, self.ns, **raw)
            elif kind == "secret":
                answer = self.core.delete_namespaced_secret(name, self.ns, **raw)
            else:
                answer = self.custom.delete_namespaced_custom_object(
                    m.MPI_GROUP, m.MPI_VERSION, self.ns, m.MPI_PLURAL, name, **raw
                )
            # Read to the end, so the connection goes back to the pool clean.
            answer.read()
            answer.release_conn()
        except ApiException as e:
            if e.status != 404:
                log.warning("cannot delete %s %s: %s", kind, name, _explain(e))

    # ---- the watch --------------------------------------------------------------------------------

    def _ensure_watch(self) -> None:
        with self._lock:
            if self._watcher is not None and self._watcher.is_alive():
                return
            if self._resource_version is None:
                self._relist()
            self._closing.clear()
            self._watcher = threading.Thread(target=self._watch, name="hai-kube-watch", daemon=True)
            self._watcher.start()

    def _relist(self) -> None:
        listed = self.core.list_namespaced_pod(self.ns, label_selector=m.instance_selector(self.options))
        with self._lock:
            self._pods = {p.metadata.name: pod_state(p) for p in listed.items}
            for state in self._pods.values():
                self._remember(state)
            self._resource_version = listed.metadata.resource_version
        self._answering.set()

    def _watch(self) -> None:
        while not self._closing.is_set():
            try:
                if self._resource_version is None:
                    self._relist()
                self._watch_stream = watch.Watch()
                stream = self._watch_stream.stream(
                    self.core.list_namespaced_pod,
                    self.ns,
                    label_selector=m.instance_selector(self.options),
                    resource_version=self._resource_version,
                    timeout_seconds=WATCH_SECONDS,
                )
                for event in stream:
                    if self._closing.is_set():
                        return
                    self._on_event(event["type"], event["object"])
            except ApiException as e:
                if e.status == 410:
                    self._resource_version = None  # too old: list again, then watch from there
                else:
                    log.warning("pod watch failed (%s); retrying", _explain(e))
                    self._closing.wait(1)
            except Exception as e:
                if self._closing.is_set():
                    return
                log.warning("pod watch interrupted (%s); retrying", e)
                # The API server may be gone (restarting): list again first, which shows it is back
                # and what changed while it was away.
                self._unreachable = str(e)
                self._answering.clear()
                self._resource_version = None
                self._closing.wait(1)

    def _on_event(self, kind: str, pod: Any) -> None:
        if kind == "ERROR" or not hasattr(pod, "metadata"):
            self._resource_version = None
            return
        state = pod_state(pod)
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(state.name, None)
            else:
                self._pods[state.name] = state
            self._remember(state)
            self._resource_version = pod.metadata.resource_version
            inst = self._instances.get(state.instance_id) if state.instance_id is not None else None
        if inst is not None and state.terminal and state.name not in inst.logs:
            self._capture(inst, state.name)
        if inst is not None and inst.pending is not None and inst.pods and state.name == inst.pods[0]:
            self._make_the_others(inst, state)

    def _remember(self, state: PodState) -> None:
        inst = self._instances.get(state.instance_id) if state.instance_id is not None else None
        if inst is not None:
            inst.last[state.name] = state

    # ---- exits ------------------------------------------------------------------------------------

    def poll(self) -> list[Exit]:
        """Instances whose pods ended; `ApiUnreachable` while the API server does not answer."""
        if not self._answering.wait(API_WAIT_SECONDS):
            raise ApiUnreachable(
                f"the Kubernetes API server does not answer ({self._unreachable}); nothing starts and "
                "no exit is recorded until it does"
            )
        with self._lock:
            tracked = list(self._instances.values())
        exits = []
        for inst in tracked:
            ended = self._check(inst, time.time())
            if ended is not None:
                exits.append(ended)
        return exits

    def _pod_names(self, inst: _Instance) -> list[str]:
        if inst.kind == "pods":
            return list(inst.pods)
        with self._lock:
            live = {s.name for s in self._pods.values() if s.instance_id == inst.instance_id}
            known = set(inst.last) | live
        return sorted(known)

    def _check(self, inst: _Instance, now: float) -> Exit | None:
        # Asked before taking the lock: the watch thread must not wait on an API call.
        ended = self._mpijob_end(inst) if inst.mpijob else None
        with self._lock:
            if inst.kind == "mpijob":
                return self._check_mpijob(inst, now, ended)
            states = [self._pods.get(n) for n in inst.pods]
        present = [s for s in states if s is not None]
        if all(s is not None and s.running for s in states):
            inst.formed = True
        if inst.stopping or inst.culprit is not None:
            # Pods we delete ourselves end the instance once none of them runs any more.
            if any(not s.terminal for s in present):
                return None
            return self._finish_gang(inst)
        if len(present) < len(states):
            missing = [n for n, s in zip(inst.pods, states, strict=True) if s is None and n in inst.last]
            if missing:
                return self._finish(inst, (None, f"pod {missing[0]} was deleted outside hai"), lost=True)
        failed = [s for s in present if s.terminal and s.exit_code != 0]
        if failed and any(not s.terminal for s in present):
            # One failed worker dooms a gang: the others would wait for it in a collective.
            inst.culprit = failed[0].name
            for s in present:
                if not s.terminal:
                    self._capture(inst, s.name)
                    self._delete("pod", s.name, 0)
            return None
        if present and len(present) == len(states) and all(s.terminal for s in present):
            return self._finish_gang(inst)
        broken = next((s for s in present if s.waiting_reason in BROKEN_AT_START), None)
        if broken is not None:
            return self._finish(inst, (None, f"pod {broken.name} cannot start: {describe(broken)}"))
        if not inst.formed and now - inst.started_at > self.options.start_timeout_seconds:
            return self._start_timed_out(inst, present, len(states))
        return None

    def _mpijob_end(self, inst: _Instance) -> MpiJobEnd | None:
        """The MPIJob's end as its operator set it in the status conditions; None while it has not ended."""
        try:
            obj = self.custom.get_namespaced_custom_object(
                m.MPI_GROUP, m.MPI_VERSION, self.ns, m.MPI_PLURAL, str(inst.mpijob)
            )
        except ApiException as e:
            if e.status != 404:
                log.warning("cannot read MPIJob %s: %s", inst.mpijob, _explain(e))
            return None
        return mpijob_end(obj)

    def _check_mpijob(self, inst: _Instance, now: float, ended: MpiJobEnd | None) -> Exit | None:
        pods = [s for s in self._pods.values() if s.instance_id == inst.instance_id]
        launcher = next((s for s in pods if s.role == "launcher"), None)
        if launcher is None:
            launcher = next((s for s in inst.last.values() if s.role == "launcher"), None)
            if inst.stopping and not pods:
                return self._finish_gang(inst)
        if ended is not None and not inst.stopping:
            # The operator's word decides; the launcher's exit code, when seen, says more of a failure.
            code = launcher.exit_code if launcher is not None and launcher.terminal else None
            if ended.succeeded:
                return self._finish(inst, (0, "completed"))
            return self._finish(inst, (code if code else None, ended.words))
        if launcher is not None and launcher.running:
            inst.formed = True
        if launcher is not None and launcher.terminal:
            code = launcher.exit_code
            return self._finish(inst, (code, describe(launcher)))
        late = now - inst.started_at > self.options.start_timeout_seconds
        if late and not inst.formed and not inst.stopping:
            return self._start_timed_out(inst, pods, None)
        return None

    def _start_timed_out(self, inst: _Instance, present: list[PodState], expected: int | None) -> Exit:
        running = sum(1 for s in present if s.running)
        waiting = next((s for s in present if s.waiting_reason), None)
        why = f"; {waiting.name} waits: {describe(waiting)}" if waiting else ""
        total = f" of {expected}" if expected is not None else ""
        reason = (
            f"not every worker was Running within {self.options.start_timeout_seconds:g} s "
            f"({running}{total} running{why}); torn down to be scheduled again"
        )
        if waiting is not None and waiting.waiting_reason in ("ErrImagePull", "ImagePullBackOff"):
            return self._finish(inst, (None, f"the image cannot be pulled: {describe(waiting)}"))
        return self._finish(inst, (None, reason), lost=True)

    def _finish_gang(self, inst: _Instance) -> Exit:
        """End the instance as the gang rule says, from the last state seen of each of its pods."""
        names = inst.pods or sorted(inst.last)
        ends = [worker_end(inst.last.get(name)) for name in names] or [WorkerEnd(None, missing="deleted")]
        first = inst.pods.index(inst.culprit) if inst.culprit in inst.pods else None
        ended = gang_exit(inst.instance_id, ends, first, inst.stopping)
        return self._finish(inst, (ended.exit_code, ended.reason), lost=ended.lost)

    def _finish(self, inst: _Instance, outcome: tuple[int | None, str], lost: bool = False) -> Exit:
        names = self._pod_names(inst)
        for follower in inst.followers:
            follower.join(timeout=10)
        for name in names:
            if name in self._pods:
                self._capture(inst, name)
        self._keep_log(inst, names)
        if inst.mpijob:
            self._delete("mpijob", inst.mpijob, 0)
        for name in names:
            if name in self._pods:
                self._delete("pod", name, 0)
        if inst.service:
            self._delete("service", inst.service, 0)
        # The credential ends with the instance (the server refuses it from now on in any case).
        self._delete("secret", m.credential_name(self.options, inst.instance_id), 0)
        with self._lock:
            self._instances.pop(inst.instance_id, None)
            self._ended_logs[inst.instance_id] = inst.log_path
        code, reason = outcome
        return Exit(inst.instance_id, code, reason, lost=lost)

    # ---- logs -------------------------------------------------------------------------------------

    def _capture(self, inst: _Instance, name: str, follow: bool = False) -> None:
        """Keep pod `name`'s log, timestamped as `merge` reads it; `follow`: until its container ends."""
        try:
            if follow:
                answer = self.core.read_namespaced_pod_log(
                    name, self.ns, container=m.MAIN, follow=True, timestamps=True, _preload_content=False
                )
                raw = b"".join(answer.stream())
            else:
                raw = b"".join(self._worker_log(name).open(False, None))
        except ApiException:
            return  # no kubelet answered (or the pod is gone): keep what was captured before
        except Exception as e:
            log.debug("cannot read the log of pod %s: %s", name, e)
            return
        raw = stamped_only(raw)
        with self._lock:
            # A later read never replaces a longer one (a follower may end after the pod's last read).
            if len(raw) >= len(inst.logs.get(name, b"")):
                inst.logs[name] = raw

    def _keep_log(self, inst: _Instance, names: list[str]) -> None:
        if names and not any(inst.logs.get(n) for n in names):
            text = "[hai] no log could be read from the pods (their node did not serve it)\n"
        else:
            text = merge([inst.logs.get(n, b"") for n in names])
        try:
            # The log lies where pods may write (the NAS): never write it through a link they planted.
            write_below(trusted_root(inst.log_path, self.home), inst.log_path, text.encode(), mode=0o600)
        except OSError as e:
            log.warning("cannot keep the log of instance %d: %s", inst.instance_id, e)

    def worker_logs(self, handle: Handle) -> list[WorkerLog]:
        """A running instance's pod logs in rank order; an MPIJob's is its launcher's (mpirun's)."""
        inst = _Instance.from_handle(handle)
        if inst.kind == "pods":
            names = inst.pods
        else:
            selector = m.instance_selector(self.options, inst.instance_id)
            listed = self.core.list_namespaced_pod(self.ns, label_selector=selector).items
            names = sorted(p.metadata.name for p in listed if pod_state(p).role == "launcher")
        return [self._worker_log(name) for name in names]

    def _worker_log(self, name: str) -> WorkerLog:
        def open_log(follow: bool, tail: int | None) -> Iterable[bytes]:
            answer = self.core.read_namespaced_pod_log(
                name, self.ns, container=m.MAIN, follow=follow, timestamps=not follow,
                tail_lines=tail, _preload_content=False,
            )  # fmt: skip
            # A followed answer is read as it comes; the rest is read whole (it ends with the request).
            chunks: Iterable[bytes] = answer.stream() if follow else [answer.data]
            return chunks

        return WorkerLog(f"pod {name}", open_log)

    # ---- exec --------------------------------------------------------------------------------------

    def account(self, owner: str) -> JobUser | None:
        """The pods' account: the owner's with `run_as`, else `run_as_user`, `run_as_group`,
        `fs_group`; None: they run as their image says, and the server reads for them as itself."""
        opts = self.options
        if opts.run_as is not None:
            return job_user(opts.run_as, owner)
        if opts.run_as_user is None:
            return None
        gid = opts.run_as_group if opts.run_as_group is not None else (opts.fs_group or 0)
        groups = tuple(g for g in (gid, opts.fs_group) if g is not None)
        return JobUser(str(opts.run_as_user), opts.run_as_user, gid, groups)

    def exec_in(self, handle: Handle, rank: int, argv: Sequence[str], owner: str) -> ExecRun:
        """The pod's exec in worker `rank`'s main container (its user, environment and dir), through
        the API server; the command's pid comes first on its output, to kill it with a second exec."""
        inst = _Instance.from_handle(handle)
        if inst.kind != "pods" or rank >= len(inst.pods):
            raise ExecRefused(f"the task has no worker {rank} this server can reach")
        name = inst.pods[rank]
        # A client of its own: the stream swaps the request function of the client it is given.
        core = client.CoreV1Api(api_client(self.options))
        command = ["/bin/sh", "-c", CONTAINER_WRAPPER, "hai-exec", *argv]
        try:
            ws = self._exec_stream(core, name, command)
        except ApiException as e:
            raise ExecRefused(f"the API server refused: {_explain(e)}") from None
        pid: list[int] = []
        killed: list[float] = []

        def chunks() -> Iterator[bytes]:
            while ws.is_open():
                try:
                    ws.update(timeout=1)
                except Exception:  # closed meanwhile (after a kill)
                    break
                for channel in (STDOUT_CHANNEL, STDERR_CHANNEL):
                    if data := ws.read_channel(channel):
                        yield data.encode() if isinstance(data, str) else data
                if killed and time.monotonic() - killed[0] > EXEC_KILL_SECONDS:
                    ws.close()  # killed, yet the stream stays open: no status will come

        def kill() -> None:
            if killed or not ws.is_open():
                return
            killed.append(time.monotonic())
            with contextlib.suppress(Exception):
                if pid:
                    killer = self._exec_stream(core, name, ["/bin/sh", "-c", f"kill -KILL {pid[0]}"])
                    killer.run_forever(timeout=EXEC_KILL_SECONDS)
            # Left open for the reader to take the command's status from; closed at the latest later.
            threading.Timer(EXEC_KILL_SECONDS, ws.close).start()

        def exit_code() -> int | None:
            try:
                code = ws.returncode
            except Exception:  # closed before the API server sent the command's status
                return None
            return int(code) if code is not None else None

        def alive() -> bool:
            with contextlib.suppress(ApiException):
                return pod_state(self.core.read_namespaced_pod(name, self.ns)).phase == "Running"
            return False

        return ExecRun(split_pid(chunks(), pid.append), exit_code, kill, alive)

    def _exec_stream(self, core: client.CoreV1Api, name: str, command: list[str]) -> Any:
        return stream(
            core.connect_get_namespaced_pod_exec, name, self.ns, command=command, container=m.MAIN,
            stderr=True, stdin=False, stdout=True, tty=False, _preload_content=False,
        )  # fmt: skip

    def running_handle(self, instance_id: int) -> Handle | None:
        with self._lock:
            inst = self._instances.get(instance_id)
        return inst.handle(self.ns) if inst is not None else None

    def explain_log_error(self, error: Exception) -> str:
        return _explain(error) if isinstance(error, ApiException) else str(error)

    # ---- restart ----------------------------------------------------------------------------------

    def reattach(self, handles: list[Handle]) -> list[Exit]:
        """Adopt instances whose pods (or MPIJob) exist; delete this owner's objects no handle names."""
        self._relist()
        mpijobs = self._list_mpijobs()
        adopted, lost = read_handles(handles, self.name, _Instance.from_handle)
        known_pods: set[str] = set()
        known_instances: set[int] = set()
        for inst in adopted:
            known_instances.add(inst.instance_id)
            known_pods.update(inst.pods)
            with self._lock:
                states = {n: s for n, s in self._pods.items() if s.instance_id == inst.instance_id}
                alive = bool(states) or (inst.mpijob is not None and inst.mpijob in mpijobs)
                if not alive:
                    self._ended_logs[inst.instance_id] = inst.log_path
                else:
                    inst.last.update(states)
                    inst.formed = all(s.running for s in states.values()) and bool(states)
                    self._instances[inst.instance_id] = inst
            if not alive:
                if inst.service:
                    self._delete("service", inst.service, 0)
                self._delete("secret", m.credential_name(self.options, inst.instance_id), 0)
                lost.append(Exit(inst.instance_id, None, "its pods are gone after a restart", lost=True))
            elif missing := [n for n in inst.pods if n not in states]:
                # A gang of pods missing one cannot go on, formed or not. With `gang_address = "pod_ip"`
                # the others are made once worker 0 has an IP: a restart in between leaves such a gang.
                why = f"pod {missing[0]} is missing after a restart (never made, or deleted meanwhile)"
                lost.append(self._finish(inst, (None, why), lost=True))
        with self._lock:
            orphans = [
                s
                for s in self._pods.values()
                if s.instance_id not in known_instances and s.name not in known_pods
            ]
        for state in orphans:
            # Started by this server but never recorded (it died in between): the job is requeued,
            # so this copy must not run beside the new one.
            log.warning("deleting pod %s: no instance of this server owns it", state.name)
            self._delete("pod", state.name, 0)
        for name, instance_id in mpijobs.items():
            if instance_id not in known_instances:
                self._delete("mpijob", name, 0)
        # Their credentials (found by name: the server never lists Secrets).
        lone = {s.instance_id for s in orphans} | {i for i in mpijobs.values() if i not in known_instances}
        for instance_id in sorted(i for i in lone if i is not None):
            self._delete("secret", m.credential_name(self.options, instance_id), 0)
        self._ensure_watch()
        return lost

    def reap(self, instance_id: int, work_dir: Path) -> None:
        """Delete the instance's pods and MPIJob (found by label), its gang Service and its credential's
        Secret; `work_dir` unused."""
        selector = m.instance_selector(self.options, instance_id)
        for pod in self.core.list_namespaced_pod(self.ns, label_selector=selector).items:
            name = pod.metadata.name
            log.warning("deleting pod %s: the handle of instance %d was never saved", name, instance_id)
            self._delete("pod", name, 0)
        for name, owner in self._list_mpijobs().items():
            if owner == instance_id:
                self._delete("mpijob", name, 0)
        self._delete("service", m.instance_name(self.options, instance_id), 0)
        self._delete("secret", m.credential_name(self.options, instance_id), 0)

    def _list_mpijobs(self) -> dict[str, int | None]:
        """This owner's MPIJobs (name -> instance id); none when the CRD is not installed."""
        try:
            listed = self.custom.list_namespaced_custom_object(
                m.MPI_GROUP,
                m.MPI_VERSION,
                self.ns,
                m.MPI_PLURAL,
                label_selector=m.instance_selector(self.options),
            )
        except ApiException as e:
            if e.status in (403, 404):
                return {}
            raise
        out: dict[str, int | None] = {}
        for item in listed.get("items", []):
            meta = item.get("metadata", {})
            label = (meta.get("labels") or {}).get(m.LABEL_INSTANCE)
            out[meta["name"]] = int(label) if label and label.isdigit() else None
        return out

    def close(self) -> None:
        self._closing.set()
        if self._watch_stream is not None:
            self._watch_stream.stop()  # shuts the socket: the watch thread wakes up now
        watcher = self._watcher
        if watcher is not None:
            watcher.join(WATCH_SECONDS + 5)
        self.api.close()


def _explain(e: ApiException) -> str:
    try:
        return str(json.loads(e.body)["message"])
    except (TypeError, ValueError, KeyError):
        # A refused websocket (an exec) carries the API server's answer at the end of its reason.
        said = re.search(r'"message":"((?:[^"\\]|\\.)*)"', str(e.reason))
        return json.loads(f'"{said[1]}"') if said else f"{e.status} {e.reason}"
