"""The local backend: every worker is a process group on this machine (the embedded default)."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import shlex
import signal
import socket
import threading
import time
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hai_airflow.backends.common import log_files, procs
from hai_airflow.backends.common.base import Exit, Handle, Launch, StartError
from hai_airflow.backends.common.confine import PathRefused, confine
from hai_airflow.backends.common.credential import credential_env, write_credential
from hai_airflow.backends.common.execs import ExecRefused, ExecRun
from hai_airflow.backends.common.gitcode import clone_script
from hai_airflow.backends.common.instances import InstanceTable
from hai_airflow.backends.common.inventory import detect
from hai_airflow.backends.common.jobuser import (
    JobUser,
    RunAs,
    base_env,
    default_job_path,
    job_account,
    job_user,
    open_job_log,
    server_user,
)
from hai_airflow.backends.common.launches import WorkerEnd, gang_exit, handle_data, image_of, read_handles
from hai_airflow.backends.common.notice import give_notice
from hai_airflow.backends.common.workerenv import (
    MASTER_ADDR,
    Gang,
    WorkerSlot,
    free_port,
    gang_env,
    image_env,
    launcher_argv,
    per_gpu,
    worker_env,
    worker_slots,
)
from hai_airflow.backends.local.execs import LocalWorker, environ, run_local, worker_command
from hai_airflow.backends.local.spawner import SPAWNER, Spawner
from hai_airflow.backends.local.supervisor import (
    CODE_DIR_VARIABLE,
    LOG_LIMIT_VARIABLE,
    RUN_AS_VARIABLE,
    kill_tree,
)
from hai_airflow.scheduling.model import Node, WorkerPlacement
from hai_airflow.spec import DistributedJobSpec

WorkerPlan = tuple[WorkerSlot, dict[str, str], str]
"""A worker to start: its slot, its environment and its command."""
log = logging.getLogger(__name__)

SUPERVISOR = Path(__file__).with_name("supervisor.py")
HANDLE_VERSION = 1
REAP_WAIT_SECONDS = 5.0
"""How long `reap` waits for SIGKILLed process groups to be gone."""
ENDED_KEPT = 1024
"""Ended instances the backend still knows (their logs readable through it), the latest to end; older
ones are forgotten, so a server's memory does not grow with every job it ever ran."""


class LocalOptions(BaseModel):
    """`[backend.options]` of the local backend."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    images: dict[str, str] = Field(
        default_factory=dict,
        description="Image name -> a virtual environment whose bin/ goes first on PATH; "
        "images not listed are only recorded.",
    )
    unlisted_images: Literal["note", "refuse"] = Field(
        default="note",
        description='A job naming an image not listed in `images` runs with the server\'s Python: "note" '
        'records that in the task at start; "refuse" refuses the submit (HTTP 422) instead.',
    )
    nvidia_smi: str = Field(default="nvidia-smi", description="The nvidia-smi command used by inventory().")
    failure_grace_seconds: float = Field(
        default=2.0,
        ge=0,
        description="When a worker of a distributed instance fails: seconds between SIGTERM and SIGKILL "
        "to the other workers.",
    )
    watch_interval_seconds: float = Field(
        default=0.2,
        gt=0,
        le=10,
        description="How often running workers are checked besides the moment one exits (a worker "
        "adopted after a restart whose exit cannot be waited for is seen this late).",
    )
    git_timeout_seconds: float = Field(default=600, gt=0, description="Limit for one git checkout.")
    path: str | None = Field(
        default=None,
        min_length=1,
        description="PATH of every job; default: the server's Python environment's bin/, then "
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin.",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Variables the platform adds to every job (e.g. LD_LIBRARY_PATH); nothing of the "
        "server's own environment reaches a job.",
    )
    run_as: RunAs = Field(
        default=None,
        min_length=1,
        description='OS user the jobs run as, or "{user}" for the account named like the job\'s owner '
        "(hai serve must run as root); unset: the server's own user.",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_launcher(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "launcher" in data:
            raise ValueError(
                "launcher is no longer a backend option: how a job's processes start is the job's own "
                "`processes` field (per-gpu, the default for distributed jobs, starts one process per GPU "
                "with no mpirun; per-worker runs the command once per worker, e.g. `mpirun ...`); "
                "remove launcher from [backend.options]"
            )
        return data


def unlisted_images(options: LocalOptions, images: Iterable[str | None]) -> list[str]:
    """The images a job names that the local backend has no environment for (`local`, the spec's
    default, names none), sorted."""
    return sorted({i for i in images if i} - {"local"} - set(options.images))


@dataclass
class _Worker:
    rank: int
    node: str
    pid: int
    pgid: int
    started: int
    exit_file: Path
    log_path: Path
    done: bool = False
    exit_code: int | None = None
    """None once done means lost: it vanished without an exit file."""
    exit_fd: int | None = None
    """A pidfd of the supervisor (Linux 5.3+), readable once it has exited: while it is not, the worker
    runs, and neither `_check` nor the watcher reads /proc for it. None where there is none."""
    killed: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "node": self.node,
            "pid": self.pid,
            "pgid": self.pgid,
            "start_time": self.started,
            "exit_file": str(self.exit_file),
            "log_path": str(self.log_path),
        }

    @classmethod
    def adopted(cls, data: Mapping[str, Any]) -> _Worker:
        return cls(
            rank=int(data["rank"]),
            node=str(data["node"]),
            pid=int(data["pid"]),
            pgid=int(data["pgid"]),
            started=int(data["start_time"]),
            exit_file=Path(data["exit_file"]),
            log_path=Path(data["log_path"]),
        )


@dataclass
class _Instance:
    instance_id: int
    workers: list[_Worker]
    log_path: Path
    notice_path: Path
    stopping: bool = False
    """The platform asked it to stop."""
    kill_at: float | None = None
    culprit: _Worker | None = None
    """The first worker found failing before any stop was asked; it decides the instance's exit code."""
    ended: bool = False


class LocalBackend:
    """Runs instances as process groups on this machine; see `hai_airflow.backends.common.base.Backend`.

    :param options: the backend's options (see `LocalOptions`).
    :param home: the platform home (`$HAI_HOME`); launches bring their own log and work paths.
    """

    name = "local"

    def __init__(self, options: Mapping[str, Any] | None = None, home: Path | None = None) -> None:
        self.options = LocalOptions.model_validate(dict(options or {}))
        self.home = home
        self._table: InstanceTable[_Instance] = InstanceTable()
        """The instances not ended yet (what a sweep checks, so its cost follows the running ones), and
        the logs of the last ENDED_KEPT that ended."""
        self._lock = self._table.lock
        self._ended: list[Exit] = []
        self._closing = threading.Event()
        self._watcher: threading.Thread | None = None
        self._wake_pipe: tuple[int, int] | None = None
        """Written to when the watcher must look again at once: a new instance, or closing."""
        self.on_exit: Callable[[], None] | None = None
        self._spawner = Spawner()

    # ---- Backend protocol -------------------------------------------------------------------

    def inventory(self) -> list[Node] | None:
        return detect(self.options.nvidia_smi)

    def start(self, launch: Launch) -> Handle:
        with self._lock:
            if self._table.get(launch.instance_id) is not None:
                raise StartError(f"instance {launch.instance_id} is already running")
        spec = launch.spec
        placement = launch.placement or (WorkerPlacement(node=socket.gethostname(), gpus=()),)
        if isinstance(spec, DistributedJobSpec) and not spec.runs_at(len(placement)):
            asked = spec.workers
            raise StartError(f"the placement has {len(placement)} workers but the job asks for {asked}")
        launch.work_dir.mkdir(parents=True, exist_ok=True)
        launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        cwd = self._code_dir(launch)
        notice_path = launch.notice_path
        # A notice left from an earlier suspension would make the resumed run stop at once.
        notice_path.unlink(missing_ok=True)
        image = image_of(launch)
        user = job_account(self.options.run_as, launch, self.home)
        write_credential(launch, user, self.home)
        base = self._environment(launch, image, user)
        slots = worker_slots(placement)
        port = free_port()
        plans = self._plans(launch, slots, base, port)
        if spec.code_src == "git":
            count = len(plans)
            plans = [(s, env, self._clone(launch, checkout_name(s.rank, count)) + c) for s, env, c in plans]
        workers = self._spawn_all(launch, plans, cwd, user)
        inst = _Instance(launch.instance_id, workers, launch.log_path, notice_path)
        with self._lock:
            self._table.add(inst)
        self._ensure_watcher()
        return Handle(
            launch.instance_id,
            {
                "backend": self.name,
                "version": HANDLE_VERSION,
                "log_path": str(launch.log_path),
                "notice_path": str(notice_path),
                "work_dir": str(launch.work_dir),
                "cwd": str(cwd / checkout_name(0, len(plans)) if spec.code_src == "git" else cwd),
                "image": image,
                "processes": "per-gpu" if per_gpu(spec) else "per-worker",
                "master_port": port,
                "workers": [w.to_json() for w in workers],
            },
        )

    def _environment(self, launch: Launch, image: str, user: JobUser | None) -> dict[str, str]:
        """A clean start: the platform's variables, the backend's, the launch's and the job's, over
        the image's; the server's own environment (database URL, secrets) never reaches a job."""
        platform = base_env(
            self.options.path or default_job_path(),
            launch.work_dir,
            user.name if user is not None else server_user(),
        )
        notice = {"HAI_PREEMPT_NOTICE": str(launch.notice_path), **credential_env(launch)}
        return image_env(
            {**platform, **self.options.env, **launch.env, **launch.spec.env, **notice},
            self.options.images.get(image),
        )

    def _spawn_all(
        self, launch: Launch, plans: list[WorkerPlan], cwd: Path, user: JobUser | None
    ) -> list[_Worker]:
        """Every worker started, or none: a failed spawn kills those already started."""
        workers: list[_Worker] = []
        try:
            for slot, env, command in plans:
                workers.append(self._spawn(launch, slot, env, command, cwd, len(plans) > 1, user))
        except OSError as exc:
            for w in workers:
                procs.signal_group(w.pgid, signal.SIGKILL)
                _unwatch(w)
            # A worker whose answer was lost with the spawner may have started all the same.
            self.reap(launch.instance_id, launch.work_dir)
            raise StartError(f"could not start worker {len(workers)}: {exc}") from exc
        return workers

    def stop(self, instance_id: int, grace_seconds: int, notice: bool) -> None:
        with self._lock:
            inst = self._table.ask_stop(instance_id)
            if inst is None:
                return
            running = [w for w in inst.workers if not w.done]
            if notice:
                give_notice(inst.notice_path, instance_id, grace_seconds, self.home)
            if grace_seconds <= 0 and not notice:
                self._signal(running, signal.SIGKILL)
                return
            self._signal(running, signal.SIGTERM)
            deadline = time.monotonic() + max(0, grace_seconds)
            inst.kill_at = min(inst.kill_at or math.inf, deadline)

    def poll(self) -> list[Exit]:
        self._sweep(notify=False)
        with self._lock:
            ended, self._ended = self._ended, []
        return ended

    def reattach(self, handles: list[Handle]) -> list[Exit]:
        """Adopt the instances of `handles`; return those lost. Ones that ended meanwhile come from poll()."""
        now = time.monotonic()
        with self._lock:
            fresh = [h for h in handles if not self._table.knows(h.instance_id)]
            adopted, lost = read_handles(fresh, self.name, _adopt)
            exited = _exited(adopted)
            for inst in adopted:
                ended = self._advance(inst, now, exited)
                if ended is None:
                    self._table.add(inst)
                else:
                    self._table.forget(inst, kept=ENDED_KEPT)
                    (lost if ended.lost else self._ended).append(ended)
        self._ensure_watcher()
        return lost

    def reap(self, instance_id: int, work_dir: Path) -> None:
        """Kill the process groups of the instance's supervisors, found in `work_dir`."""
        groups = _supervisors_in(work_dir)
        for pgid in groups:
            log.warning("killing process group %d of instance %d: it has no handle", pgid, instance_id)
            kill_tree(pgid, signal.SIGKILL)
            procs.signal_group(pgid, signal.SIGKILL)
        deadline = time.monotonic() + REAP_WAIT_SECONDS
        while any(procs.group_is_alive(pgid) for pgid in groups):
            if time.monotonic() >= deadline:
                log.warning("processes of instance %d are still alive after SIGKILL", instance_id)
                return
            time.sleep(0.02)

    def read_log(self, instance_id: int, tail: int = 0) -> str:
        return log_files.read_tail(self._log_path(instance_id), tail, home=self.home)

    def follow_log(self, instance_id: int) -> Iterator[str]:
        inst = self._table.get(instance_id)
        path = self._log_path(instance_id)

        def ended() -> bool:
            self._sweep()
            return inst is None or inst.ended

        return log_files.follow(path, ended, self.options.watch_interval_seconds, home=self.home)

    def account(self, owner: str) -> JobUser | None:
        return None if self.options.run_as is None else job_user(self.options.run_as, owner)

    def exec_in(self, handle: Handle, rank: int, argv: Sequence[str], owner: str) -> ExecRun:
        """Run `argv` beside worker `rank`: with its environment, in its directory, as its account,
        under an exec reaper that ends all it starts with it, and with the worker."""
        worker = next((w for w in handle.data.get("workers", ()) if int(w["rank"]) == rank), None)
        if worker is None:
            raise ExecRefused(f"the task has no worker {rank}")
        pid, started = int(worker["pid"]), int(worker["start_time"])
        command = worker_command(pid, started)
        env = None if command is None else environ(command)
        if command is None or env is None:
            raise ExecRefused(f"worker {rank} is not running on this machine")
        # Where the command is now (a git checkout of its own per worker); entered as its account.
        cwd = str(procs.cwd(command) or handle.data.get("cwd") or "/")
        return run_local(argv, env, cwd, self.account(owner), LocalWorker(pid, started))

    def close(self) -> None:
        self._closing.set()
        self._wake()
        if self._watcher is not None:
            self._watcher.join()
            self._watcher = None
        self._spawner.close()
        with self._lock:
            for inst in self._table.live():
                for w in inst.workers:
                    _unwatch(w)

    # ---- starting ---------------------------------------------------------------------------

    def _code_dir(self, launch: Launch) -> Path:
        """Where each command starts: the checked code path, or (git) its work dir, where the command's
        own process clones the code first (`_plans`)."""
        spec = launch.spec
        if spec.code_src == "git":
            return Path(os.path.realpath(launch.work_dir))
        path = Path(spec.code_path).expanduser()
        if not path.is_dir():
            raise StartError(
                f"code_path {spec.code_path} is not a directory on this machine; "
                "point --code-path at the job's code directory on the NAS"
            )
        # Where the checked path leads now; the command enters exactly this, as the job's account.
        if launch.paths is None:
            return Path(os.path.realpath(path))
        try:
            return Path(confine(str(path), launch.paths, "spec.code_path", whole_tree=False))
        except PathRefused as refused:
            raise StartError(str(refused)) from None

    def _clone(self, launch: Launch, dest: str) -> str:
        spec = launch.spec
        timeout = self.options.git_timeout_seconds
        return clone_script(spec.code_path, spec.git_branch, dest, timeout, launch.git_schemes)

    def _plans(
        self, launch: Launch, slots: list[WorkerSlot], base: dict[str, str], port: int
    ) -> list[WorkerPlan]:
        """(worker, environment, command) for each worker to start."""
        spec = launch.spec
        if per_gpu(spec):
            # Every worker runs on this machine: the gang meets on the loopback interface.
            gang = Gang(MASTER_ADDR, port, MASTER_ADDR, free_port(), "lo", MASTER_ADDR)
            return [
                (
                    s,
                    base | gang_env(s, len(slots), gang),
                    "exec " + shlex.join(launcher_argv(spec.cmd, s, gang)),
                )
                for s in slots
            ]
        distributed = spec.mode == "distributed"
        return [(s, base | worker_env(s, len(slots), distributed, port), spec.cmd) for s in slots]

    def _spawn(
        self,
        launch: Launch,
        slot: WorkerSlot,
        env: dict[str, str],
        command: str,
        cwd: Path,
        combined: bool,
        user: JobUser | None,
    ) -> _Worker:
        # Beside the work dir, not in it: the job may move, replace or lock up its own dir, never its
        # parent, and the exit file is how the server learns how the worker ended.
        exit_file = launch.work_dir.parent / f"{launch.work_dir.name}.worker{slot.rank}.exit"
        exit_file.unlink(missing_ok=True)
        args = [str(SUPERVISOR), str(exit_file), command]
        log_path = launch.log_path
        if combined:
            # Each worker has its own log; the supervisors add prefixed lines to the instance log.
            log_path = worker_log_path(launch.log_path, slot.rank)
            args += [str(launch.log_path), f"[worker {slot.rank}] "]
        # Only the platform says whom the command runs as, never the job's own env.
        env = {
            k: v for k, v in env.items() if k not in (RUN_AS_VARIABLE, CODE_DIR_VARIABLE, LOG_LIMIT_VARIABLE)
        }
        if (limit := launch.worker_log_bytes(len(launch.placement) or 1)) is not None:
            env[LOG_LIMIT_VARIABLE] = str(limit)
        if user is not None:
            # The supervisor stays the server's user; only the command becomes the job's.
            env[RUN_AS_VARIABLE] = f"{user.uid}:{user.gid}:{','.join(map(str, user.groups))}"
        # Entered by the command's own process after the switch: root never follows the user's path.
        env[CODE_DIR_VARIABLE] = str(cwd)
        out = open_job_log(log_path)
        try:
            pid, started = self._spawner.spawn(args, env, str(launch.work_dir), None, out)
        finally:
            os.close(out)
        # It leads a session and a process group of its own; started 0: it has already ended.
        return _watched(_Worker(slot.rank, slot.node, pid, pid, started, exit_file, log_path))

    # ---- watching ---------------------------------------------------------------------------

    def _ensure_watcher(self) -> None:
        with self._lock:
            if self._watcher is not None and self._watcher.is_alive():
                self._wake()  # a new worker to wait for
                return
            self._closing.clear()
            self._wake_pipe = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._watcher = threading.Thread(
                target=self._watch, args=(self._wake_pipe,), name="hai-local-backend", daemon=True
            )
            self._watcher.start()

    def _wake(self) -> None:
        with self._lock:
            if self._wake_pipe is not None:
                with contextlib.suppress(OSError):  # full (it wakes the watcher all the same) or closed
                    os.write(self._wake_pipe[1], b"\0")

    def _watch(self, wake_pipe: tuple[int, int]) -> None:
        """Sweep the moment a worker exits (its pidfd becomes readable), else every watch interval.

        A pidfd may be closed by a sweep on another thread while this one waits on it: then it wakes
        for nothing (the fd is gone, or is another's by now) and looks again.
        """
        try:
            while not self._closing.is_set():
                with self._lock:
                    waits = [
                        w.exit_fd
                        for inst in self._table.live()
                        for w in inst.workers
                        if not w.done and w.exit_fd is not None
                    ]
                    timeout = self._next_timeout(time.monotonic())
                poller = select.poll()
                poller.register(wake_pipe[0], select.POLLIN)
                for fd in waits:
                    poller.register(fd, select.POLLIN)
                poller.poll(timeout * 1000)
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_pipe[0], 4096)
                if self._closing.is_set():
                    break
                try:
                    self._sweep()
                except Exception:
                    log.exception("checking local workers failed; retrying")
        finally:
            with self._lock:
                if self._wake_pipe == wake_pipe:
                    self._wake_pipe = None
                os.close(wake_pipe[0])
                os.close(wake_pipe[1])

    def _next_timeout(self, now: float) -> float:
        """Seconds until the watcher must look without being woken: the interval, or a kill that falls due."""
        due = [i.kill_at - now for i in self._table.live() if i.kill_at is not None]
        return max(0.0, min([self.options.watch_interval_seconds, *due]))

    def _sweep(self, notify: bool = True) -> None:
        """Check every live instance; with `notify`, tell the owner (`on_exit`) when one has ended."""
        now = time.monotonic()
        with self._lock:
            before = len(self._ended)
            live = self._table.live()
            exited = _exited(live)
            for inst in live:
                ended = self._advance(inst, now, exited)
                if ended is not None:
                    self._table.forget(inst, kept=ENDED_KEPT)
                    self._ended.append(ended)
            ended_now = len(self._ended) > before
        if notify and ended_now and self.on_exit is not None:
            self.on_exit()

    def _advance(self, inst: _Instance, now: float, exited: Container[int]) -> Exit | None:
        """Check the instance's workers (`exited`: the pidfds that have ended), stop the rest after a
        failure or a grace; its Exit once all ended."""
        if inst.ended:
            return None
        for w in inst.workers:
            _check(w, exited)
        running = [w for w in inst.workers if not w.done]
        # Once a stop is asked, its own grace governs: a worker that saved and left is not a failure,
        # and a second SIGTERM could reach another while its interpreter shuts down, unhandled.
        if inst.culprit is None and not inst.stopping:
            inst.culprit = next((w for w in inst.workers if w.done and w.exit_code != 0), None)
            if inst.culprit is not None and running:
                # The others would wait forever in a collective for the failed worker.
                self._signal(running, signal.SIGTERM)
                inst.kill_at = min(inst.kill_at or math.inf, now + self.options.failure_grace_seconds)
        if running and inst.kill_at is not None and now >= inst.kill_at:
            self._signal(running, signal.SIGKILL)
            inst.kill_at = None
        if running:
            return None
        inst.ended = True
        return _exit_of(inst)

    def _signal(self, workers: list[_Worker], sig: signal.Signals) -> None:
        for w in workers:
            # A worker's pid may have been reused once it ended; only signal the one started.
            if procs.is_alive(w.pid, w.started):
                if sig == signal.SIGKILL:
                    # Below the supervisor first (a `setsid` child left the group), while it still
                    # adopts orphans; then the group, the supervisor with it.
                    kill_tree(w.pid, sig)
                    procs.signal_group(w.pgid, sig)
                    w.killed = True
                else:
                    # The group at once, as the notice promised (the supervisor ignores it and stays,
                    # a rank launcher passes it on); then what left the session (the supervisor leads
                    # it), found by the slower scan of /proc.
                    procs.signal_group(w.pgid, sig)
                    kill_tree(w.pid, sig, session=w.pgid)

    def _log_path(self, instance_id: int) -> Path:
        """The instance's log, while it runs and after it ended; KeyError when it is not known."""
        inst = self._table.get(instance_id)
        path = inst.log_path if inst is not None else self._table.ended_log(instance_id)
        if path is None:
            raise KeyError(f"instance {instance_id} is not known to the local backend")
        return path


def _watched(w: _Worker) -> _Worker:
    """The worker with a pidfd of its supervisor, where pidfds exist and it is still the one started."""
    try:
        fd = os.pidfd_open(w.pid)
    except (AttributeError, OSError):
        return w
    # The pid could name another process by now (or the supervisor may have ended already).
    if procs.is_alive(w.pid, w.started):
        w.exit_fd = fd
    else:
        os.close(fd)
    return w


def _unwatch(w: _Worker) -> None:
    if w.exit_fd is not None:
        os.close(w.exit_fd)
        w.exit_fd = None


def _exited(instances: Iterable[_Instance]) -> set[int]:
    """The pidfds of these instances' running workers whose process has ended, asked in one system call:
    one per worker would hand the interpreter lock to the API's threads and wait to get it back, each
    time, for every sweep."""
    poller = select.poll()
    for inst in instances:
        for w in inst.workers:
            if not w.done and w.exit_fd is not None:
                poller.register(w.exit_fd, select.POLLIN)
    return {fd for fd, _ in poller.poll(0)}


def checkout_name(rank: int, processes: int) -> str:
    """The dir in the work dir where a process clones the job's git code: one clone per process."""
    return "code" if processes == 1 else f"code-{rank}"


def worker_log_path(log_path: Path, rank: int) -> Path:
    """The log of one worker of a multi-worker instance, next to the instance's combined log."""
    return log_path.with_name(f"{log_path.stem}.worker{rank}{log_path.suffix}")


def _check(w: _Worker, exited: Container[int]) -> None:
    """Record the worker's end if it has ended (its pidfd among `exited`, or without one, its process
    gone): the exit file, else killed by us, else lost."""
    if w.done:
        return
    if w.exit_fd is not None:
        if w.exit_fd not in exited:
            return
        _unwatch(w)
    elif procs.is_alive(w.pid, w.started):
        return
    # No exit file: it was killed before it could write one, by us or by someone else.
    code = -signal.SIGKILL if w.killed else None
    from_file = procs.read_exit_file(w.exit_file)
    w.done = True
    w.exit_code = from_file if from_file is not None else code


def _exit_of(inst: _Instance) -> Exit:
    """The instance's end by the gang rule, once every worker has ended."""
    ends = [
        WorkerEnd.of_process(w.exit_code, w.node, f"its process (pid {w.pid}) vanished without an exit code")
        for w in inst.workers
    ]
    first = inst.workers.index(inst.culprit) if inst.culprit is not None else None
    return gang_exit(inst.instance_id, ends, first, inst.stopping)


def _supervisors_in(work_dir: Path) -> list[int]:
    """Supervisors of the instance whose work dir this is: each waits in it and leads its own group."""
    where = Path(os.path.realpath(work_dir))
    found = []
    for pid in procs.running():
        args = procs.cmdline(pid)
        # A child of the spawner: python -I -S .../spawner.py FD
        if not args or len(args) < 4 or args[1:3] != ["-I", "-S"] or Path(args[3]).name != SPAWNER.name:
            continue
        # A process that merely looks like one (the job's own, or another user's) is left alone.
        if procs.cwd(pid) == where and procs.group_of(pid) == pid and procs.owner(pid) == os.getuid():
            found.append(pid)
    return found


def _adopt(handle: Handle) -> _Instance:
    data = handle_data(handle, LocalBackend.name)
    workers = [_watched(_Worker.adopted(w)) for w in data["workers"]]
    if not workers:
        raise ValueError("it lists no workers")
    return _Instance(handle.instance_id, workers, Path(data["log_path"]), Path(data["notice_path"]))
