"""The docker backend: one container per worker on one Docker engine, found again by its labels."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.models.containers import Container
from docker.types import DeviceRequest
from requests.exceptions import ConnectionError as RequestsConnectionError

from hai_airflow.backends.common import procs
from hai_airflow.backends.common.base import BackendUnavailable, Exit, Handle, Launch, StartError
from hai_airflow.backends.common.credential import write_credential
from hai_airflow.backends.common.execs import CONTAINER_WRAPPER, ExecRefused, ExecRun, split_pid
from hai_airflow.backends.common.gitcode import CLONE_FAILED_EXIT, clone_argv
from hai_airflow.backends.common.instances import InstanceTable
from hai_airflow.backends.common.jobuser import SYSTEM_PATH, JobUser, job_account, job_user
from hai_airflow.backends.common.launches import WorkerEnd, gang_exit, handle_data, read_handles
from hai_airflow.backends.common.live_logs import ServedLogs, WorkerLog
from hai_airflow.backends.common.log_files import UnreadableLog, keep_log
from hai_airflow.backends.common.merged_logs import merge_lines
from hai_airflow.backends.common.notice import give_notice
from hai_airflow.backends.common.workerenv import WorkerSlot
from hai_airflow.backends.docker import containers as cfg
from hai_airflow.scheduling.model import Node

log = logging.getLogger(__name__)

CLONE_OUTPUT = "git-clone.log"
"""The file in the work dir that takes the clone's stdout and stderr."""
CLONE_OUTPUT_BYTES = 64 * 1024
"""As much of the clone's output as the server reads back (for the end reason and the kept log)."""
CLONE_REASON_CHARS = 1000
"""The longest git message an end reason quotes."""
REAP_SECONDS = 1.0
"""How long `poll` waits for a clone it has just killed to be gone."""
ENGINE_WAIT_SECONDS = 2.0
"""How long `poll` waits for an engine that does not answer (dockerd restarting) before it raises
`EngineUnreachable`."""


class EngineUnreachable(BackendUnavailable):
    """The Docker engine does not answer: the controller must neither plan nor start now (a start would
    fail its job), only wait; with live-restore the containers run on and their exits are read later."""


@dataclass
class _Clone:
    """The `git clone` of an instance's code, run as the job's account before its containers exist."""

    launch: Launch
    account: JobUser
    process: subprocess.Popen[bytes]
    started: int
    """The process's start time (/proc), to tell it from a later process with the same pid."""
    output: int
    """An fd of the file the clone writes to, opened by the server: read back whatever the job does."""
    limit: float
    """Seconds it may take ([backend] git_timeout_seconds)."""
    deadline: float
    timed_out: bool = False

    @property
    def what(self) -> str:
        spec = self.launch.spec
        return f"git clone of {spec.code_path}" + (f" (branch {spec.git_branch})" if spec.git_branch else "")

    def read_output(self) -> str:
        try:
            return os.pread(self.output, CLONE_OUTPUT_BYTES, 0).decode(errors="replace")
        except OSError as e:
            return f"(its output could not be read: {e})\n"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.output)


@dataclass
class _Instance:
    """An instance this backend watches: its containers in rank order and where its log goes.

    A git job's instance first clones its code (`clone`); its containers are named from the start but
    created only once the clone has succeeded.
    """

    instance_id: int
    containers: list[str]
    network: str | None
    log_path: Path
    notice: Path
    stopping: bool = False
    """The platform asked it to stop (suspend or cancel)."""
    culprit: int | None = None
    """Rank of the worker whose failure, before any stop request, ended the gang."""
    clone: _Clone | None = None
    """The clone still running in this server; None once the containers were created."""
    saved_clone: tuple[int, int] | None = None
    """(pid, start time) of the clone a saved handle names: it ran when the handle was saved."""

    def handle(self) -> Handle:
        data: dict[str, Any] = {
            "backend": DockerBackend.name,
            "containers": list(self.containers),
            "network": self.network,
            "log_path": str(self.log_path),
            "notice": str(self.notice),
        }
        clone = (self.clone.process.pid, self.clone.started) if self.clone is not None else self.saved_clone
        if clone is not None:
            data["clone"] = {"pid": clone[0], "started": clone[1]}
        return Handle(self.instance_id, data)

    @classmethod
    def from_handle(cls, handle: Handle) -> _Instance:
        data = handle_data(handle, DockerBackend.name)
        clone = data.get("clone")
        return cls(
            handle.instance_id,
            list(data["containers"]),
            data.get("network"),
            Path(data["log_path"]),
            Path(data["notice"]),
            saved_clone=(int(clone["pid"]), int(clone["started"])) if clone else None,
        )


class DockerBackend(ServedLogs):
    """Runs instances as containers of one engine; `poll` reports those whose workers have all exited."""

    name = "docker"
    on_exit: Callable[[], None] | None = None
    """Never called: exits are learnt inside `poll()`."""

    def __init__(self, options: Mapping[str, Any] | None = None, home: Path | None = None) -> None:
        self.options = cfg.DockerOptions.model_validate(dict(options or {}))
        self.home = home
        timeout = self.options.api_timeout_seconds
        try:
            if self.options.docker_host:
                self.client = docker.DockerClient(base_url=self.options.docker_host, timeout=timeout)
            else:
                self.client = docker.from_env(timeout=timeout)
            info = self.client.info()
            self.host = str(info.get("Name") or self.options.docker_host or "localhost")
            self.host_cpus = float(info.get("NCPU") or 0)
        except DockerException as e:
            raise RuntimeError(
                f"cannot reach the Docker engine ({self.options.docker_host or 'DOCKER_HOST'}): {e}. "
                "Start dockerd or set [backend] docker_host."
            ) from e
        if not info.get("LiveRestoreEnabled"):
            log.warning(
                "the Docker engine on %s runs without live-restore: restarting dockerd kills the "
                'containers of every running job, which then fail; set "live-restore": true in its '
                "daemon.json",
                self.host,
            )
        if self.options.run_as is None and os.geteuid() == 0:
            log.warning(
                "docker jobs run as root (uid 0, without capabilities) and may leave root-owned, setuid "
                'files wherever root may write on their mounts; set [backend] run_as = "{user}"'
            )
        self._table: InstanceTable[_Instance] = InstanceTable()
        self._lock = self._table.lock

    # ---- inventory --------------------------------------------------------------------------------

    def inventory(self) -> list[Node] | None:
        """The engine reports no GPUs: nodes come from the server's [[nodes]] configuration."""
        return None

    # ---- start ------------------------------------------------------------------------------------

    def start(self, launch: Launch) -> Handle:
        """Create and start the containers; a git job only starts its clone, and `poll` creates them."""
        image = cfg.image_of(launch)
        try:
            self.client.images.get(image)
        except ImageNotFound:
            # Never pull: an image that is not there is a mistake to fix, not a download to wait for.
            raise StartError(
                f"image {image} is not present on host {self.host}; build or load it first"
            ) from None
        # Refuse a path that became a symlink out of bounds before anything is written through it.
        cfg.mounts(launch, self.options)
        account = job_account(self.options.run_as, launch, self.home) or cfg.server_account()
        write_credential(launch, account, self.home)
        notice = cfg.notice_path(launch)
        notice.unlink(missing_ok=True)
        network = cfg.network_name(launch.instance_id) if cfg.uses_bridge(launch, self.options) else None
        names = [cfg.container_name(launch.instance_id, s.rank) for s in cfg.slots_of(launch)]
        inst = _Instance(launch.instance_id, names, network, launch.log_path, notice)
        if launch.spec.code_src == "git":
            # Off the controller's loop: a clone that hangs holds its own instance only.
            inst.clone = self._start_clone(launch, account)
        else:
            self._run(launch, account)
        self._table.add(inst)
        return inst.handle()

    def _start_clone(self, launch: Launch, account: JobUser) -> _Clone:
        """Start `git clone` of the job's code into its work dir as its account; `poll` watches it."""
        git = shutil.which("git")
        if git is None:
            raise StartError(
                f"git is not installed on {self.host}; install it to run jobs whose code is in git"
            )
        spec, work = launch.spec, launch.work_dir
        dest = work / "code"
        # A retried start of the same instance must not run code left from an earlier attempt.
        if dest.is_symlink():
            dest.unlink()
        elif dest.exists():
            shutil.rmtree(dest)
        # The server's own fd of a fresh file: whatever the job later does to its work dir, the server
        # reads back exactly what git wrote.
        output = _fresh_file(work, CLONE_OUTPUT)
        env = {
            "PATH": SYSTEM_PATH,
            "HOME": str(work),
            "LANG": "C.UTF-8",
            # Never wait for a password: a clone that needs one fails with git's own message.
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_ASKPASS": "true",
        }
        switch: dict[str, Any] = {}
        if self.options.run_as is not None:
            switch = {"user": account.uid, "group": account.gid, "extra_groups": list(account.groups)}
        try:
            process = subprocess.Popen(
                clone_argv(spec.code_path, spec.git_branch, str(dest), launch.git_schemes),
                executable=git,
                cwd=work,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                start_new_session=True,
                **switch,
            )
        except OSError as e:
            os.close(output)
            raise StartError(f"git clone could not be started as {account.name}: {e}") from None
        started = procs.start_time(process.pid) or 0
        limit = self.options.git_timeout_seconds
        return _Clone(launch, account, process, started, output, limit, time.monotonic() + limit)

    def _run(self, launch: Launch, account: JobUser) -> None:
        """Create and start every worker's container (and the gang's network); StartError if refused."""
        slots = cfg.slots_of(launch)
        network = cfg.network_name(launch.instance_id) if cfg.uses_bridge(launch, self.options) else None
        names = [cfg.container_name(launch.instance_id, s.rank) for s in slots]
        # A retried start of the same instance must not trip over what an earlier attempt left.
        self._remove(names, network)
        try:
            if network:
                self.client.networks.create(
                    network, driver="bridge", labels={cfg.LABEL_OWNER: self.options.owner}
                )
            containers = [self._create(launch, slot, account) for slot in slots]
            for c in containers:
                c.start()
        except StartError:
            self._remove(names, network)
            raise
        except (APIError, DockerException) as e:
            self._remove(names, network)
            why = _explain(e)
            if "device driver" in why:
                why += (
                    "; the engine cannot pass GPUs: install the NVIDIA Container Toolkit on "
                    f"{self.host} or set [backend] virtual_gpus = true"
                )
            raise StartError(f"the Docker engine on {self.host} refused it: {why}") from None

    def _create(self, launch: Launch, slot: WorkerSlot, account: JobUser) -> Container:
        kwargs = cfg.create_kwargs(launch, slot, self.options, account)
        if self.host_cpus and kwargs.get("nano_cpus", 0) > self.host_cpus * 1e9:
            # The engine refuses a CPU limit above the machine's (virtual nodes may promise more).
            kwargs["nano_cpus"] = int(self.host_cpus * 1e9)
        if slot.gpus and not self.options.virtual_gpus:
            kwargs["device_requests"] = [
                DeviceRequest(device_ids=[str(g) for g in slot.gpus], capabilities=[["gpu"]])
            ]
        return self.client.containers.create(**kwargs)

    # ---- stop -------------------------------------------------------------------------------------

    def stop(self, instance_id: int, grace_seconds: int, notice: bool) -> None:
        with self._lock:
            inst = self._table.ask_stop(instance_id)
            if inst is None:
                return
            if inst.clone is not None:
                # Nothing of the job runs yet: its clone ends now, and `poll` reports the instance.
                _kill_clone(inst.clone)
                return
        if notice:
            give_notice(inst.notice, instance_id, grace_seconds, self.home)
        for name in inst.containers:
            if grace_seconds > 0:
                # The engine sends SIGTERM now and SIGKILL after the grace, even if this server stops
                # meanwhile; a thread keeps the controller from waiting out the grace.
                threading.Thread(
                    target=self._quietly, args=(name, "stop", grace_seconds), daemon=True
                ).start()
            else:
                self._quietly(name, "kill", 0)

    def _quietly(self, name: str, action: str, grace: int) -> None:
        # A container that already exited (or was removed) is stopped enough.
        with contextlib.suppress(NotFound, APIError):
            c = self.client.containers.get(name)
            if action == "stop":
                c.stop(timeout=grace)
            else:
                c.kill(signal=signal.SIGKILL.name)

    # ---- exits ------------------------------------------------------------------------------------

    def poll(self) -> list[Exit]:
        """Instances whose containers (or clone) ended; `EngineUnreachable` while the engine is away."""
        with self._lock:
            cloning = [i for i in self._table.live() if i.clone is not None]
            running = [i for i in self._table.live() if i.clone is None]
        # Asked first, even with nothing running: while the engine does not answer nothing goes on.
        states = self._states()
        exits = [ended for inst in cloning if (ended := self._advance_clone(inst)) is not None]
        exits += [ended for inst in running if (ended := self._check(inst, states)) is not None]
        return exits

    def _advance_clone(self, inst: _Instance) -> Exit | None:
        """Once the clone has ended: its failure (or stop) ends the instance, its success starts the
        containers. A clone past its time limit is killed. Never waits for the clone."""
        clone = inst.clone
        assert clone is not None
        with self._lock:
            code = clone.process.poll()
        if code is None:
            if not inst.stopping and time.monotonic() < clone.deadline:
                return None
            clone.timed_out = not inst.stopping
            code = self._end_process(clone)
            if code is None:
                return None  # still dying: seen on a later poll
        output = clone.read_output()
        clone.close()
        if inst.stopping:
            return self._end_clone(
                inst, output, 128 + signal.SIGKILL, "stopped by the platform during its git clone"
            )
        if code != 0:
            return self._end_clone(inst, output, CLONE_FAILED_EXIT, _clone_failure(clone, code, output))
        try:
            self._run(clone.launch, clone.account)
        except StartError as e:
            return self._end_clone(
                inst, output, None, f"its containers could not start after its git clone: {e}"
            )
        with self._lock:
            inst.clone = None
            stopped_meanwhile = inst.stopping
        if stopped_meanwhile:
            # A stop that came while the containers were created found no clone to end.
            for name in inst.containers:
                self._quietly(name, "kill", 0)
        return None

    def _end_process(self, clone: _Clone) -> int | None:
        """Kill the clone's process group and reap it; None while it has not died yet."""
        waited_until = time.monotonic() + REAP_SECONDS
        while True:
            # Reaped only under the lock that `stop` signals under: its group id is never reused then.
            with self._lock:
                _kill_clone(clone)
                code = clone.process.poll()
            if code is not None or time.monotonic() > waited_until:
                return code
            time.sleep(0.01)

    def _end_clone(self, inst: _Instance, output: str, code: int | None, reason: str) -> Exit:
        """The Exit of an instance that never got its containers, its log being the clone's output."""
        keep_log(inst.instance_id, inst.log_path, f"{output}[hai] {reason}\n".encode(), self.home)
        self._table.forget(inst)
        return Exit(inst.instance_id, code, reason)

    def _states(self) -> dict[str, str]:
        """Container name -> state ("running", "exited", ...) of every container this server owns."""
        waited_until = time.monotonic() + ENGINE_WAIT_SECONDS
        while True:
            try:
                listed = self.client.containers.list(
                    all=True, sparse=True, filters={"label": f"{cfg.LABEL_OWNER}={self.options.owner}"}
                )
                break
            except RequestsConnectionError as e:
                if time.monotonic() > waited_until:
                    raise EngineUnreachable(
                        f"the Docker engine on {self.options.docker_host or self.host} does not answer "
                        f"({e}); nothing starts and no exit is recorded until it does"
                    ) from None
                time.sleep(0.1)
        return {c.attrs["Names"][0].lstrip("/"): c.attrs.get("State", "") for c in listed}

    def _check(self, inst: _Instance, states: Mapping[str, str]) -> Exit | None:
        present = [n for n in inst.containers if n in states]
        if not present:
            self._table.forget(inst)
            return Exit(inst.instance_id, None, "its containers were removed outside hai", lost=True)
        # "created" counts as ended only when the rest has ended too (a worker that never started).
        running = [n for n in present if states[n] in ("running", "restarting", "paused")]
        if running:
            if inst.culprit is None and not inst.stopping:
                failed = [n for n in present if states[n] == "exited" and self._worker_end(n).code != 0]
                if failed:
                    # One failed worker dooms a gang: the others would wait for it in a collective.
                    inst.culprit = inst.containers.index(failed[0])
                    for name in running:
                        self._quietly(name, "kill", 0)
            return None
        return self._finish(inst)

    def _finish(self, inst: _Instance) -> Exit:
        ends = [self._worker_end(name) for name in inst.containers]
        self._keep_log(inst)
        self._remove(inst.containers, inst.network)
        self._table.forget(inst)
        return gang_exit(inst.instance_id, ends, inst.culprit, inst.stopping)

    def _worker_end(self, name: str) -> WorkerEnd:
        """How one container ended, as the engine tells it."""
        try:
            state = self.client.api.inspect_container(name)["State"]
        except NotFound:
            return WorkerEnd(None, missing="its container disappeared before its exit code was read")
        return WorkerEnd.of_container(int(state.get("ExitCode", 0)), oom=bool(state.get("OOMKilled")))

    def _keep_log(self, inst: _Instance) -> None:
        """Write the merged container logs to the instance's log as they are read, before removal."""
        keep_log(inst.instance_id, inst.log_path, self._merged(inst), self.home)

    def _remove(self, names: list[str], network: str | None) -> None:
        for name in names:
            with contextlib.suppress(NotFound):
                self.client.api.remove_container(name, force=True)
        if network:
            with contextlib.suppress(NotFound):
                self.client.api.remove_network(network)

    # ---- restart ----------------------------------------------------------------------------------

    def reattach(self, handles: list[Handle]) -> list[Exit]:
        """Adopt instances whose containers exist (their exits come from `poll`); remove unknown ones."""
        states = self._states()
        adopted, exits = read_handles(handles, self.name, _Instance.from_handle)
        known: set[str] = set()
        for inst in adopted:
            known.update(inst.containers)
            if not any(n in states for n in inst.containers):
                self._remove([], inst.network)
                exits.append(Exit(inst.instance_id, None, _gone_after_restart(inst), lost=True))
                self._table.forget(inst)
                continue
            self._table.add(inst)
        for name in sorted(set(states) - known):
            # Started by this server but never recorded (it died in between): the job will be requeued,
            # so this copy must not keep running beside the new one.
            log.warning("removing container %s: no instance of this server owns it", name)
            self._remove([name], None)
        return exits

    def reap(self, instance_id: int, work_dir: Path) -> None:
        """End a git clone started in `work_dir`, and remove the instance's containers (found by label)
        and its network."""
        _kill_clones_in(work_dir)
        owned = [f"{cfg.LABEL_OWNER}={self.options.owner}", f"{cfg.LABEL_INSTANCE}={instance_id}"]
        listed = self.client.containers.list(all=True, sparse=True, filters={"label": owned})
        names = [c.attrs["Names"][0].lstrip("/") for c in listed]
        for name in names:
            log.warning("removing container %s: the handle of instance %d was never saved", name, instance_id)
        self._remove(names, cfg.network_name(instance_id))

    # ---- logs -------------------------------------------------------------------------------------

    def worker_logs(self, handle: Handle) -> list[WorkerLog]:
        """The instance's container logs in rank order, as the engine serves them while they exist."""
        return [self._worker_log(name) for name in _Instance.from_handle(handle).containers]

    def _worker_log(self, name: str) -> WorkerLog:
        def open_log(follow: bool, tail: int | None) -> Iterable[bytes]:
            # follow=False with stream=True: the SDK would otherwise follow until the container exits.
            answer: Iterable[bytes] = self.client.api.logs(
                name, stdout=True, stderr=True, stream=True, follow=follow,
                timestamps=not follow, tail="all" if tail is None else tail,
            )  # fmt: skip
            return answer

        return WorkerLog(f"container {name}", open_log)

    def _merged(self, inst: _Instance) -> Iterator[bytes]:
        """The instance's log, its workers' container logs merged by time as the engine streams them."""
        try:
            streams: list[Iterable[bytes]] = []
            for name in inst.containers:
                try:
                    streams.append(self._worker_log(name).open(False, None))
                except NotFound:
                    streams.append([])
            yield from (text.encode() for text in merge_lines(streams))
        except DockerException as e:
            raise UnreadableLog(f"[hai] the container logs could not be read: {e}\n") from e

    # ---- exec --------------------------------------------------------------------------------------

    def account(self, owner: str) -> JobUser | None:
        return (
            job_user(self.options.run_as, owner) if self.options.run_as is not None else cfg.server_account()
        )

    def exec_in(self, handle: Handle, rank: int, argv: Sequence[str], owner: str) -> ExecRun:
        """`docker exec` in worker `rank`'s container: its user, environment and working dir. The
        command's pid in the container comes first on its output, to kill it with a second exec."""
        containers = _Instance.from_handle(handle).containers
        if rank >= len(containers):
            raise ExecRefused(f"the task has no worker {rank}")
        name, api = containers[rank], self.client.api
        try:
            made = api.exec_create(name, ["/bin/sh", "-c", CONTAINER_WRAPPER, "hai-exec", *argv], stdin=False)
            chunks = api.exec_start(made["Id"], stream=True)
        except NotFound:
            raise ExecRefused(f"worker {rank}'s container is not there (not started yet, or gone)") from None
        except DockerException as e:
            raise ExecRefused(f"the Docker engine refused: {_explain(e)}") from None
        pid: list[int] = []

        def kill() -> None:
            with contextlib.suppress(DockerException):
                if pid and api.exec_inspect(made["Id"]).get("Running"):
                    killer = api.exec_create(name, ["/bin/sh", "-c", f"kill -KILL {pid[0]}"])
                    api.exec_start(killer["Id"], detach=True)

        def exit_code() -> int | None:
            with contextlib.suppress(DockerException):
                code = api.exec_inspect(made["Id"]).get("ExitCode")
                return int(code) if code is not None else None
            return None

        def alive() -> bool:
            with contextlib.suppress(DockerException):
                return bool(api.inspect_container(name)["State"]["Running"])
            return False

        return ExecRun(split_pid(iter(chunks), pid.append), exit_code, kill, alive)

    def running_handle(self, instance_id: int) -> Handle | None:
        inst = self._table.get(instance_id)
        return inst.handle() if inst is not None else None

    def explain_log_error(self, error: Exception) -> str:
        return _explain(error)

    def close(self) -> None:
        self.client.close()


def _fresh_file(directory: Path, name: str) -> int:
    """A read-write fd of a new, empty file `name` in `directory`, made without following a link."""
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.open(name, flags, 0o600, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def _kill_clone(clone: _Clone) -> None:
    """SIGKILL the clone's process group while its leader is not reaped (call with the lock held)."""
    if clone.process.returncode is None:
        procs.signal_group(clone.process.pid, signal.SIGKILL)


def _clone_failure(clone: _Clone, code: int, output: str) -> str:
    """The end reason of a failed clone: git's own words, without its warnings."""
    if clone.timed_out:
        why = f"it did not finish within {clone.limit:g} s ([backend] git_timeout_seconds)"
    elif code < 0:
        why = f"git was killed by signal {-code}"
    else:
        said = [
            line.strip()
            for line in output.splitlines()
            if line.strip() and not line.strip().lower().startswith("warning:")
        ]
        why = "; ".join(said)[:CLONE_REASON_CHARS] or f"git exited with code {code}"
    return f"{clone.what} failed: {why}"


def _gone_after_restart(inst: _Instance) -> str:
    """Why an adopted instance without containers is lost; a clone it was still running is ended."""
    if inst.saved_clone is not None:
        pid, started = inst.saved_clone
        if procs.is_alive(pid, started) and procs.group_of(pid) == pid:
            procs.signal_group(pid, signal.SIGKILL)
            return (
                "the server restarted during its git clone, which was stopped; its containers never started"
            )
        return "its containers are gone after a restart (the server may have stopped during its git clone)"
    return "its containers are gone after a restart"


def _kill_clones_in(work_dir: Path) -> None:
    """Kill a git clone a server that died left running in `work_dir` (it leads its own process group)."""
    target = Path(os.path.realpath(work_dir))
    for pid in procs.running():
        if (
            procs.cwd(pid) == target
            and procs.group_of(pid) == pid
            and (procs.cmdline(pid) or [""])[0] == "git"
        ):
            log.warning(
                "killing git clone %d in %s: the handle of its instance was never saved", pid, work_dir
            )
            procs.signal_group(pid, signal.SIGKILL)


def _explain(e: Exception) -> str:
    explanation = getattr(e, "explanation", None)
    return str(explanation or e)
