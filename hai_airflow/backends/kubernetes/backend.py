"""The kubernetes backend: pods per worker (or a Kubeflow MPIJob), followed with a watch, found by labels."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from hai_airflow.backends.common.base import Exit, Handle, Launch, StartError
from hai_airflow.backends.common.execs import ExecRun
from hai_airflow.backends.common.instances import InstanceTable
from hai_airflow.backends.common.jobuser import JobUser
from hai_airflow.backends.common.launches import read_handles
from hai_airflow.backends.common.live_logs import ServedLogs, WorkerLog
from hai_airflow.backends.kubernetes import manifests as m
from hai_airflow.backends.kubernetes.cluster import Cluster, explain
from hai_airflow.backends.kubernetes.execs import exec_in_pod, pod_account
from hai_airflow.backends.kubernetes.exits import Doomed, Ending, mpijob_verdict, pods_verdict
from hai_airflow.backends.kubernetes.instance import BACKEND, KubeInstance
from hai_airflow.backends.kubernetes.pod_logs import PodLogs
from hai_airflow.backends.kubernetes.pod_watch import ApiUnreachable, PodWatch
from hai_airflow.backends.kubernetes.pods import PodState
from hai_airflow.backends.kubernetes.restarts import delete_orphans, reap_instance
from hai_airflow.backends.kubernetes.starts import (
    create_mpijob,
    create_pods,
    make_model_dir,
    owner_account,
    put_credential,
    uses_mpijob,
)
from hai_airflow.scheduling.model import Node

__all__ = ["ApiUnreachable", "KubernetesBackend"]

log = logging.getLogger(__name__)


class KubernetesBackend(ServedLogs):
    """Runs instances as pods; pod states come from one watch, exits are decided in `poll`.

    :param options: the `[backend]` table (see `KubernetesOptions`).
    :param home: the platform home (unused: launches bring their own paths).
    """

    name = BACKEND
    on_exit: Callable[[], None] | None = None
    """Never called: exits are learnt inside `poll()`."""

    def __init__(self, options: Mapping[str, Any] | None = None, home: Path | None = None) -> None:
        self.options = m.KubernetesOptions.model_validate(dict(options or {}))
        self.home = home
        self.cluster = Cluster(self.options)
        self.ns = self.options.namespace
        self._table: InstanceTable[KubeInstance] = InstanceTable()
        self._lock = self._table.lock
        self.watch = PodWatch(self.cluster, self._lock, self._remember, self._changed)
        self.logs = PodLogs(self.cluster, self._lock, home)

    @property
    def core(self) -> client.CoreV1Api:
        """The core API the backend calls (pods, services, secrets, logs)."""
        return self.cluster.core

    @property
    def _pods(self) -> dict[str, PodState]:
        return self.watch.pods

    def inventory(self) -> list[Node] | None:
        return self.cluster.nodes()

    # ---- start ------------------------------------------------------------------------------------

    def start(self, launch: Launch) -> Handle:
        # Check the job's paths before anything is created (a refused one raises StartError).
        m.nas_mounts(launch, self.options)
        account = owner_account(self.options, launch)
        make_model_dir(self.options, launch)
        self.watch.ensure()
        use_mpijob = uses_mpijob(self.cluster, launch, account)
        created: list[tuple[str, str]] = []
        try:
            launch = put_credential(self.cluster, launch, created)
            if use_mpijob:
                inst = create_mpijob(self.cluster, launch, created)
            else:
                inst = create_pods(self.cluster, launch, account, created)
        except ApiException as e:
            self.cluster.delete_all(created)
            raise StartError(f"the Kubernetes API refused it: {explain(e)}") from None
        with self._lock:
            self._table.add(inst)
            # The watch may have seen the new pods before the instance was registered.
            inst.last.update(self.watch.of_instance(launch.instance_id))
            first = self._pods.get(inst.pods[0]) if inst.pods else None
        if first is not None:
            self._make_the_others(inst, first)
        return inst.handle(self.ns)

    def _make_the_others(self, inst: KubeInstance, first: PodState) -> None:
        """Once worker 0's pod has an IP, make the other workers' pods of a gang that meets there.

        Called from the watch: a refusal here is logged, and the gang, never formed, is torn down when
        its start times out (`_check`)."""
        if not first.ip or first.terminal:
            return
        with self._lock:
            launch, inst.pending = inst.pending, None
            if launch is None or inst.stopping:
                return
        for pod in m.worker_pods(launch, self.options, first.ip, owner_account(self.options, launch))[1:]:
            try:
                self.cluster.core.create_namespaced_pod(self.ns, pod)
            except ApiException as e:
                log.warning("cannot make pod %s: %s", pod["metadata"]["name"], explain(e))
                return

    # ---- stop -------------------------------------------------------------------------------------

    def stop(self, instance_id: int, grace_seconds: int, notice: bool) -> None:
        """Delete the pods with the grace; an elastic pod's preStop hook writes the notice before SIGTERM."""
        with self._lock:
            inst = self._table.ask_stop(instance_id)
            if inst is None:
                return
            inst.pending = None
            names = self._pod_names(inst)
        grace = max(0, grace_seconds)
        for name in names:
            # A pod deleted without grace takes its log with it.
            self.logs.capture(inst, name)
            if grace > 0:
                # What it prints in its grace (the save on notice) comes after this read, and the kubelet
                # removes the pod as soon as its containers stopped: follow its log to the end instead.
                self.logs.follow_to_end(inst, name)
            if notice:
                self._annotate_stop(name, grace)
        if inst.mpijob:
            self.cluster.delete("mpijob", inst.mpijob, grace)
        for name in names:
            self.cluster.delete("pod", name, grace)

    def _annotate_stop(self, name: str, grace: int) -> None:
        """Tell pod `name` a stop with notice is coming: its preStop hook writes the notice from this."""
        stamp = json.dumps({"at": time.time(), "grace_seconds": grace, "notice": True})
        try:
            body = {"metadata": {"annotations": {m.ANNOTATION_STOP: stamp}}}
            self.cluster.core.patch_namespaced_pod(name, self.ns, body)
        except ApiException:
            return

    # ---- the watch --------------------------------------------------------------------------------

    def _remember(self, state: PodState) -> None:
        inst = self._table.get(state.instance_id) if state.instance_id is not None else None
        if inst is not None:
            inst.last[state.name] = state

    def _changed(self, state: PodState) -> None:
        inst = self._table.get(state.instance_id) if state.instance_id is not None else None
        if inst is None:
            return
        if state.terminal and state.name not in inst.logs:
            self.logs.capture(inst, state.name)
        if inst.pending is not None and inst.pods and state.name == inst.pods[0]:
            self._make_the_others(inst, state)

    # ---- exits ------------------------------------------------------------------------------------

    def poll(self) -> list[Exit]:
        """Instances whose pods ended; `ApiUnreachable` while the API server does not answer."""
        self.watch.wait_answering()
        exits = []
        for inst in self._table.live():
            ended = self._check(inst, time.time())
            if ended is not None:
                exits.append(ended)
        return exits

    def _pod_names(self, inst: KubeInstance) -> list[str]:
        if inst.kind == "pods":
            return list(inst.pods)
        with self._lock:
            known = set(inst.last) | set(self.watch.of_instance(inst.instance_id))
        return sorted(known)

    def _check(self, inst: KubeInstance, now: float) -> Exit | None:
        timeout = self.options.start_timeout_seconds
        # Asked before taking the lock: the watch thread must not wait on an API call.
        ended = self.cluster.mpijob_end(inst.mpijob) if inst.mpijob else None
        verdict: Ending | Doomed | None
        with self._lock:
            if inst.kind == "mpijob":
                pods = list(self.watch.of_instance(inst.instance_id).values())
                verdict = mpijob_verdict(inst, pods, ended, now, timeout)
            else:
                states = [self._pods.get(n) for n in inst.pods]
                if all(s is not None and s.running for s in states):
                    inst.formed = True
                verdict = pods_verdict(inst, states, now, timeout)
        if isinstance(verdict, Doomed):
            inst.culprit = verdict.culprit
            for name in verdict.running:
                self.logs.capture(inst, name)
                self.cluster.delete("pod", name, 0)
            return None
        return self._finish(inst, verdict) if verdict is not None else None

    def _finish(self, inst: KubeInstance, ending: Ending) -> Exit:
        """Keep the instance's log, delete all it made, and forget it: its Exit."""
        names = self._pod_names(inst)
        for follower in inst.followers:
            follower.join(timeout=10)
        for name in names:
            if name in self._pods:
                self.logs.capture(inst, name)
        self.logs.keep(inst, names)
        if inst.mpijob:
            self.cluster.delete("mpijob", inst.mpijob, 0)
        for name in names:
            if name in self._pods:
                self.cluster.delete("pod", name, 0)
        if inst.service:
            self.cluster.delete("service", inst.service, 0)
        # The credential ends with the instance (the server refuses it from now on in any case).
        self.cluster.delete_credential(inst.instance_id)
        self._table.forget(inst)
        return Exit(inst.instance_id, ending.code, ending.reason, lost=ending.lost)

    # ---- logs, exec -------------------------------------------------------------------------------

    def worker_logs(self, handle: Handle) -> list[WorkerLog]:
        """A running instance's pod logs in rank order; an MPIJob's is its launcher's (mpirun's)."""
        return self.logs.of_running(KubeInstance.from_handle(handle))

    def account(self, owner: str) -> JobUser | None:
        return pod_account(self.options, owner)

    def exec_in(self, handle: Handle, rank: int, argv: Sequence[str], owner: str) -> ExecRun:
        return exec_in_pod(self.cluster, KubeInstance.from_handle(handle), rank, list(argv))

    def running_handle(self, instance_id: int) -> Handle | None:
        inst = self._table.get(instance_id)
        return inst.handle(self.ns) if inst is not None else None

    def explain_log_error(self, error: Exception) -> str:
        return explain(error) if isinstance(error, ApiException) else str(error)

    # ---- restart ----------------------------------------------------------------------------------

    def reattach(self, handles: list[Handle]) -> list[Exit]:
        """Adopt instances whose pods (or MPIJob) exist; delete this owner's objects no handle names."""
        self.watch.relist()
        mpijobs = self.cluster.list_mpijobs()
        adopted, lost = read_handles(handles, self.name, KubeInstance.from_handle)
        lost += [ended for inst in adopted if (ended := self._adopt(inst, mpijobs)) is not None]
        with self._lock:
            present = list(self._pods.values())
        delete_orphans(self.cluster, present, adopted, mpijobs)
        self.watch.ensure()
        return lost

    def _adopt(self, inst: KubeInstance, mpijobs: Mapping[str, int | None]) -> Exit | None:
        """Follow an instance a saved handle names again; its Exit when it cannot go on."""
        with self._lock:
            states = self.watch.of_instance(inst.instance_id)
            alive = bool(states) or (inst.mpijob is not None and inst.mpijob in mpijobs)
            if not alive:
                self._table.forget(inst)
            else:
                inst.last.update(states)
                inst.formed = all(s.running for s in states.values()) and bool(states)
                self._table.add(inst)
        if not alive:
            if inst.service:
                self.cluster.delete("service", inst.service, 0)
            self.cluster.delete_credential(inst.instance_id)
            return Exit(inst.instance_id, None, "its pods are gone after a restart", lost=True)
        if missing := [n for n in inst.pods if n not in states]:
            # A gang of pods missing one cannot go on, formed or not. With `gang_address = "pod_ip"`
            # the others are made once worker 0 has an IP: a restart in between leaves such a gang.
            why = f"pod {missing[0]} is missing after a restart (never made, or deleted meanwhile)"
            return self._finish(inst, Ending(None, why, lost=True))
        return None

    def reap(self, instance_id: int, work_dir: Path) -> None:
        """Delete the instance's pods and MPIJob (found by label), its gang Service and its credential's
        Secret; `work_dir` unused."""
        reap_instance(self.cluster, instance_id)

    def close(self) -> None:
        self.watch.close()
        self.cluster.close()
