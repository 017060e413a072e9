"""`hai exec` in a pod: the command runs in a worker's main container, through the API server."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream
from kubernetes.stream.ws_client import STDERR_CHANNEL, STDOUT_CHANNEL

from hai_airflow.backends.common.execs import CONTAINER_WRAPPER, ExecRefused, ExecRun, split_pid
from hai_airflow.backends.common.jobuser import JobUser, job_user
from hai_airflow.backends.kubernetes import manifests as m
from hai_airflow.backends.kubernetes.cluster import Cluster, api_client, explain
from hai_airflow.backends.kubernetes.instance import KubeInstance
from hai_airflow.backends.kubernetes.pods import pod_state

EXEC_KILL_SECONDS = 10.0
"""How long killing a command of `hai exec` (by a second exec) and its stream's end may take."""


def pod_account(opts: m.KubernetesOptions, owner: str) -> JobUser | None:
    """The pods' account: the owner's with `run_as`, else `run_as_user`, `run_as_group`,
    `fs_group`; None: they run as their image says, and the server reads for them as itself."""
    if opts.run_as is not None:
        return job_user(opts.run_as, owner)
    if opts.run_as_user is None:
        return None
    gid = opts.run_as_group if opts.run_as_group is not None else (opts.fs_group or 0)
    groups = tuple(g for g in (gid, opts.fs_group) if g is not None)
    return JobUser(str(opts.run_as_user), opts.run_as_user, gid, groups)


def exec_in_pod(cluster: Cluster, inst: KubeInstance, rank: int, argv: list[str]) -> ExecRun:
    """The pod's exec in worker `rank`'s main container (its user, environment and dir), through
    the API server; the command's pid comes first on its output, to kill it with a second exec."""
    if inst.kind != "pods" or rank >= len(inst.pods):
        raise ExecRefused(f"the task has no worker {rank} this server can reach")
    name, ns = inst.pods[rank], cluster.ns
    # A client of its own: the stream swaps the request function of the client it is given.
    core = client.CoreV1Api(api_client(cluster.options))
    command = ["/bin/sh", "-c", CONTAINER_WRAPPER, "hai-exec", *argv]
    try:
        ws = _exec_stream(core, ns, name, command)
    except ApiException as e:
        raise ExecRefused(f"the API server refused: {explain(e)}") from None
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
                killer = _exec_stream(core, ns, name, ["/bin/sh", "-c", f"kill -KILL {pid[0]}"])
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
            return pod_state(cluster.core.read_namespaced_pod(name, ns)).phase == "Running"
        return False

    return ExecRun(split_pid(chunks(), pid.append), exit_code, kill, alive)


def _exec_stream(core: client.CoreV1Api, ns: str, name: str, command: list[str]) -> Any:
    return stream(
        core.connect_get_namespaced_pod_exec, name, ns, command=command, container=m.MAIN,
        stderr=True, stdin=False, stdout=True, tty=False, _preload_content=False,
    )  # fmt: skip
