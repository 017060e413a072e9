"""The states of this owner's pods, kept current by one watch of the API server."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from hai_airflow.backends.common.base import BackendUnavailable
from hai_airflow.backends.kubernetes import manifests as m
from hai_airflow.backends.kubernetes.cluster import Cluster, explain
from hai_airflow.backends.kubernetes.pods import PodState, pod_state

log = logging.getLogger(__name__)

WATCH_SECONDS = 20
"""A watch request ends after this long and is renewed from the last resourceVersion (bounds close())."""
API_WAIT_SECONDS = 2.0
"""How long `poll` waits for an API server the watch cannot reach before it raises `ApiUnreachable`
(longer than the watch's one second between tries, so a cut stream alone never raises)."""


class ApiUnreachable(BackendUnavailable):
    """The pod watch cannot reach the API server: the controller must neither plan nor start now (a
    start would fail its job), only wait; exits that happened meanwhile are read once it answers."""


class PodWatch:
    """Pod name -> its last state, from a list and then one watch thread renewed from where it was.

    :param seen: called under `lock` with every state the list or the watch brings.
    :param changed: called after each watch event, outside the lock (it may call the API).
    """

    def __init__(
        self,
        cluster: Cluster,
        lock: threading.RLock,
        seen: Callable[[PodState], None],
        changed: Callable[[PodState], None],
    ) -> None:
        self.cluster = cluster
        self.lock = lock
        self.pods: dict[str, PodState] = {}
        self._seen = seen
        self._changed = changed
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

    def ensure(self) -> None:
        """Start the watch thread unless it runs (listing first when nothing was listed yet)."""
        with self.lock:
            if self._watcher is not None and self._watcher.is_alive():
                return
            if self._resource_version is None:
                self.relist()
            self._closing.clear()
            self._watcher = threading.Thread(target=self._watch, name="hai-kube-watch", daemon=True)
            self._watcher.start()

    def relist(self) -> None:
        """List this owner's pods anew: what the watch goes on from."""
        core, ns = self.cluster.core, self.cluster.ns
        listed = core.list_namespaced_pod(ns, label_selector=m.instance_selector(self.cluster.options))
        with self.lock:
            self.pods = {p.metadata.name: pod_state(p) for p in listed.items}
            for state in self.pods.values():
                self._seen(state)
            self._resource_version = listed.metadata.resource_version
        self._answering.set()

    def wait_answering(self) -> None:
        """Return once the API server answers the watch; `ApiUnreachable` when it does not in time."""
        if not self._answering.wait(API_WAIT_SECONDS):
            raise ApiUnreachable(
                f"the Kubernetes API server does not answer ({self._unreachable}); nothing starts and "
                "no exit is recorded until it does"
            )

    def of_instance(self, instance_id: int) -> dict[str, PodState]:
        """The present pods of the instance, by name."""
        with self.lock:
            return {n: s for n, s in self.pods.items() if s.instance_id == instance_id}

    def _watch(self) -> None:
        while not self._closing.is_set():
            try:
                if self._resource_version is None:
                    self.relist()
                self._watch_stream = watch.Watch()
                stream = self._watch_stream.stream(
                    self.cluster.core.list_namespaced_pod,
                    self.cluster.ns,
                    label_selector=m.instance_selector(self.cluster.options),
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
                    log.warning("pod watch failed (%s); retrying", explain(e))
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
        with self.lock:
            if kind == "DELETED":
                self.pods.pop(state.name, None)
            else:
                self.pods[state.name] = state
            self._seen(state)
            self._resource_version = pod.metadata.resource_version
        self._changed(state)

    def close(self) -> None:
        self._closing.set()
        if self._watch_stream is not None:
            self._watch_stream.stop()  # shuts the socket: the watch thread wakes up now
        watcher = self._watcher
        if watcher is not None:
            watcher.join(WATCH_SECONDS + 5)
