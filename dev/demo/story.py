"""`make demo`: an Airflow pipeline's training on hai is preempted by a high-priority job and resumes."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from hai_airflow.client import HaiClient
from hai_airflow.spec import TERMINAL_STATES, JobState, JobView

REPO = Path(__file__).resolve().parents[1]
DAGS = REPO / "dags"
INCLUDE = REPO / "include"
PIPELINE = "cpu_gpu_pipeline"
TRAIN_TASK = f"{PIPELINE}.train"
URGENT_TASK = "urgent-8gpu"


def log(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


DEMO_USER = "demo"
"""The demo's one hai user, a platform admin."""
SERVICE_USER = "airflow"
"""The service identity Airflow's connection holds: it acts for the people who trigger runs."""


class Tokens(NamedTuple):
    """The secrets of one demo or `make up` home."""

    person: str
    """The demo user's own token (for `hai` commands)."""
    service: str
    """Airflow's: a service identity acting for the members of group default, never for itself."""
    jwt: str
    """Airflow's [api_auth] jwt_secret, shared by its services."""

    @classmethod
    def fresh(cls) -> Tokens:
        return cls(*(secrets.token_hex(16) for _ in cls._fields))

    @classmethod
    def kept_in(cls, home: Path) -> Tokens:
        """The home's tokens, each in a file private to this user, made on first use."""
        home.mkdir(parents=True, exist_ok=True)
        values = []
        for name in cls._fields:
            path = home / f"{name}-token"
            if not path.exists():
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    out.write(secrets.token_hex(16))
            values.append(path.read_text(encoding="utf-8").strip())
        return cls(*values)


def platform_config(tokens: Tokens) -> str:
    """One node of 8 virtual V100s, the document's packages, one unlimited group, one admin and
    Airflow's service identity; image `local` runs jobs in this Python environment (so the sample
    code finds torch)."""
    packages = [(100, "CPU 8 cores", "CPU", 0), (454, "1xV100", "V100", 1), (455, "2xV100", "V100", 2)]
    packages += [(456, "4xV100", "V100", 4), (457, "8xV100", "V100", 8)]
    text = f"""[server]
backend = "local"

[backend]
images = {{ local = "{sys.prefix}" }}

[[nodes]]
name = "node1"
gpu_type = "V100"
gpus = 8
cpus = 64
memory_gb = 512
virtual = true

[[groups]]
name = "default"
admins = ["{DEMO_USER}"]

[[users]]
name = "{DEMO_USER}"
group = "default"
role = "platform_admin"
token = "{tokens.person}"

[[users]]
name = "{SERVICE_USER}"
group = "default"
token = "{tokens.service}"
acts_for = ["group:default"]
"""
    for pid, name, gpu_type, gpus in packages:
        text += (
            f'\n[[resource_packages]]\nid = {pid}\nname = "{name}"\ngpu_type = "{gpu_type}"\n'
            f"gpus = {gpus}\ncpus = {max(4 * gpus, 8)}\nmemory_gb = {max(32 * gpus, 32)}\n"
        )
    return text


def descendants(roots: Sequence[int]) -> list[int]:
    """Every live process below `roots` (children, theirs...), from /proc; a process that has
    started a session of its own is still found through its parent."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # the command name, in parentheses, may hold spaces: the fields after it are fixed
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(stat[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def processes_with(variable: Callable[[bytes], bool]) -> list[int]:
    """Processes (not this one) with an environment variable (b"NAME=value") that `variable` accepts."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(variable(v) for v in environ):
            found.append(int(entry.name))
    return found


def _signal_all(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


class Stack:
    """The processes this run started, each in its own session, and everything they start.

    :param marker: an environment variable (NAME=value) every process of the stack carries, so a
        process that escaped its parent is still stopped.
    """

    def __init__(self, marker: str | None = None) -> None:
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.marker = marker

    def start(
        self, name: str, args: Sequence[str], env: dict[str, str], log_path: Path
    ) -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                list(args),
                env=env,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs.append((name, proc))
        return proc

    def _marked(self) -> list[int]:
        marker = self.marker.encode() if self.marker else None
        return processes_with(lambda v: v == marker) if marker else []

    def stop_all(self, timeout: float = 10.0) -> None:
        """SIGTERM every process of the stack, SIGKILL what is left after `timeout` seconds, or at
        once when a second Ctrl-C or SIGTERM comes meanwhile (it never cuts the stop short)."""
        hurry = threading.Event()
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, lambda *_: hurry.set())
        roots = [proc.pid for _name, proc in self.procs if proc.poll() is None]
        tree = sorted({*roots, *descendants(roots), *self._marked()})
        for pid in roots:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
        _signal_all(tree, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not hurry.is_set():
            for _name, proc in self.procs:
                proc.poll()  # reap, so a service that exited is not counted as alive
            if not any(_alive(pid) for pid in tree):
                break
            time.sleep(0.1)
        # what ignored SIGTERM, and anything started meanwhile
        _signal_all(sorted({*(p for p in tree if _alive(p)), *self._marked()}), signal.SIGKILL)
        for _name, proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


def kill_jobs_left_behind(hai_home: Path) -> None:
    """SIGKILL processes whose environment carries this HAI_HOME (jobs the stopped server left)."""
    # Jobs do not inherit HAI_HOME; their notice file lies under it.
    marker, notice = f"HAI_HOME={hai_home}".encode(), f"HAI_PREEMPT_NOTICE={hai_home}/".encode()
    _signal_all(processes_with(lambda v: v == marker or v.startswith(notice)), signal.SIGKILL)


class HaiService:
    """`hai serve` (``python -m hai_airflow.server``) with its own HAI_HOME on a free port."""

    def __init__(self, stack: Stack, home: Path, tokens: Tokens, port: int | None = None) -> None:
        self.home = home
        self.tokens = tokens
        self.token = tokens.person
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        home.mkdir(parents=True, exist_ok=True)
        config = home / "config.toml"
        # a home made before Airflow had its own identity gets the current config
        if not config.exists() or f'name = "{SERVICE_USER}"' not in config.read_text(encoding="utf-8"):
            config.write_text(platform_config(tokens), encoding="utf-8")
        env = {**os.environ, "HAI_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        for name in ("HAI_SERVER", "HAI_TOKEN", "HAI_REGION"):
            env.pop(name, None)
        args = [sys.executable, "-m", "hai_airflow.server", "--config", str(config), "--host", "127.0.0.1"]
        self.proc = stack.start("hai serve", [*args, "--port", str(self.port)], env, home / "server.log")
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"hai serve exited with {self.proc.returncode}; see {self.home / 'server.log'}"
                )
            with contextlib.suppress(httpx.HTTPError, ValueError):
                if httpx.get(f"{self.url}/health", timeout=2).json().get("lease_holder"):
                    return
            time.sleep(0.2)
        raise RuntimeError(f"hai serve did not answer in {timeout:.0f} s; see {self.home / 'server.log'}")

    @property
    def env(self) -> dict[str, str]:
        """What a `hai` command needs to reach this server."""
        return {"HAI_SERVER": self.url, "HAI_TOKEN": self.token, "HAI_HOME": str(self.home)}

    def client(self) -> HaiClient:
        return HaiClient(server=self.url, token=self.token)

    def cancel_unfinished(self) -> None:
        with contextlib.suppress(Exception), self.client() as client:
            for job in client.jobs(all=True, limit=1000):
                if job.state not in TERMINAL_STATES:
                    client.cancel(job.id)


def airflow_env(airflow_home: Path, hai: HaiService, **extra: str) -> dict[str, str]:
    """Airflow on SQLite in `airflow_home`, this repo's DAGs, `hai_default` pointing at `hai` with
    the service identity, as a deployment has it."""
    # The demo's one hai user stands behind every Airflow user: `airflow dags test` runs are
    # triggered by "dag_test", the UI's by "admin" (how to map people: README, Airflow).
    people = {"user_map": {"dag_test": DEMO_USER, "admin": DEMO_USER}}
    connection = {
        "conn_type": "hai",
        "host": hai.url,
        "password": hai.tokens.service,
        "extra": json.dumps(people),
    }
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow_home}/airflow.db",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW_CONN_HAI_DEFAULT": json.dumps(connection),
        "PYTHONUNBUFFERED": "1",
        # `airflow standalone` starts its services as `airflow ...` from PATH
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    env.update(extra)
    return env


def airflow_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "airflow", *args]


def hai_command(*args: str) -> list[str]:
    return [sys.executable, "-c", "from hai_airflow.cli.main import app; app(prog_name='hai')", *args]


def follow_log(path: Path, keep: Callable[[str], str | None], stop: threading.Event) -> threading.Thread:
    """Print the lines of a growing log that `keep` turns into a message."""

    def run() -> None:
        while not path.exists() and not stop.is_set():
            time.sleep(0.2)
        with open(path, encoding="utf-8", errors="replace") as source:
            while True:
                line = source.readline()
                if not line:
                    if stop.is_set():
                        return
                    time.sleep(0.2)
                    continue
                message = keep(line.rstrip("\n"))
                if message:
                    print(f"  airflow | {message}", flush=True)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


_STRUCTLOG = re.compile(r"\[\s*\w+\s*\] (?P<message>.*?)(?: \[[\w.]+\])?(?: \w+=\S+)*$")


def airflow_story(line: str) -> str | None:
    """The lines of `airflow dags test` that tell the story: task starts and ends, hai job events."""
    if "[DAG TEST] starting" in line or "[DAG TEST] end task" in line or "hai job" in line:
        match = _STRUCTLOG.search(line)
        return (match.group("message") if match else line).strip()
    return None


def wait_job(
    client: HaiClient,
    find: Callable[[], JobView | None],
    done: Callable[[JobView], bool],
    timeout: float,
    what: str,
) -> JobView:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = find()
        if job is not None and done(job):
            return job
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def job_named(client: HaiClient, task_name: str) -> Callable[[], JobView | None]:
    def find() -> JobView | None:
        jobs = [j for j in client.jobs(all=True) if j.task_name == task_name]
        return max(jobs, key=lambda j: j.id) if jobs else None

    return find


def suspension_reason(client: HaiClient, job_id: int) -> str:
    """Why the server suspended the job, from its first suspension event."""
    events = [e for e in client.job(job_id).events if e.to_state == JobState.SUSPENDING]
    return events[0].reason if events else "(no suspension event)"


def run_demo(work: Path, steps: int, step_sleep: float) -> int:
    stack = Stack()
    hai: HaiService | None = None
    stop_tail = threading.Event()
    try:
        log(f"working directory {work}")
        hai = HaiService(stack, work / "hai", Tokens.fresh())
        log(f"hai serve is up at {hai.url}: one node of 8 virtual V100s")
        env = airflow_env(work / "airflow", hai)
        migrate = subprocess.run(airflow_command("db", "migrate"), env=env, capture_output=True, text=True)
        if migrate.returncode != 0:
            raise RuntimeError(
                f"airflow db migrate failed:\n{migrate.stdout[-2000:]}{migrate.stderr[-2000:]}"
            )
        conf = {"steps": steps, "ckpt_every": 10, "step_sleep": step_sleep, "data_dir": str(work / "data")}
        log(f"airflow dags test {PIPELINE} (low priority training, {steps} steps)")
        dags_log = work / "airflow-dags-test.log"
        pipeline = stack.start(
            "airflow dags test",
            airflow_command("dags", "test", PIPELINE, "-c", json.dumps(conf)),
            env,
            dags_log,
        )
        follow_log(dags_log, airflow_story, stop_tail)

        train_id, urgent_id = watch_preemption(hai)

        rc = pipeline.wait(timeout=600)
        stop_tail.set()
        time.sleep(0.5)
        if rc != 0:
            raise RuntimeError(f"airflow dags test exited {rc}; see {dags_log}")
        return check_and_summarise(hai, train_id, urgent_id)
    finally:
        stop_tail.set()
        if hai is not None:
            hai.cancel_unfinished()
        stack.stop_all()
        if hai is not None:
            kill_jobs_left_behind(hai.home)


def submit_urgent(hai: HaiService) -> None:
    """The high-priority job for all 8 GPUs, from the CLI as a user would type it."""
    log("submitting a high-priority job for all 8 GPUs from the CLI:")
    create = hai_command(
        "create",
        "--task-name",
        URGENT_TASK,
        "--model-id",
        "31",
        "--project-id",
        "10209",
        "--code-path",
        str(INCLUDE),
        "--image",
        "local",
        "--resource-pkg",
        "457",
        "--max-schedule",
        "4",
        "--cmd",
        "python3 train.py --steps 30 --ckpt-every 10 --step-sleep 0.05",
    )
    log("  $ hai create --task-name urgent-8gpu --resource-pkg 457 --max-schedule 4 ...")
    created = subprocess.run(create, env={**os.environ, **hai.env}, capture_output=True, text=True)
    print("  " + (created.stdout.strip() or created.stderr.strip()), flush=True)
    if created.returncode != 0:
        raise RuntimeError("hai create failed")


def watch_preemption(hai: HaiService) -> tuple[int, int]:
    """The pipeline's training job checkpoints, a high-priority job suspends it, runs, and the training
    job resumes: the ids of both."""
    with hai.client() as client:
        train = wait_job(
            client,
            job_named(client, TRAIN_TASK),
            lambda j: j.state == JobState.RUNNING and j.latest_checkpoint is not None,
            timeout=240,
            what="the pipeline's training job to run and checkpoint",
        )
        log(
            f"training job {train.id} runs on GPU {train.placement[0].gpus} and has checkpointed: "
            f"{Path(train.latest_checkpoint or '').name}"
        )
        submit_urgent(hai)

        suspended = wait_job(
            client,
            lambda: client.job(train.id),
            lambda j: j.preemptions >= 1,
            timeout=60,
            what="the training job to be suspended",
        )
        log(f"training job {train.id} was suspended: {suspension_reason(client, suspended.id)}")
        urgent = wait_job(
            client,
            job_named(client, URGENT_TASK),
            lambda j: j.state in TERMINAL_STATES,
            timeout=240,
            what="the high-priority job to finish",
        )
        log(f"high-priority job {urgent.id} {urgent.state}")
        resumed = wait_job(
            client,
            lambda: client.job(train.id),
            lambda j: j.instances >= 2,
            timeout=120,
            what="the training job to resume",
        )
        log(f"training job {train.id} resumed ({resumed.state}) from its checkpoint")
        return train.id, urgent.id


def check_and_summarise(hai: HaiService, train_id: int, urgent_id: int) -> int:
    with hai.client() as client:
        train, urgent = client.job(train_id), client.job(urgent_id)
        instances = client.instances(train_id)
        resumed = [i for i in instances if i.resume]
        loaded = trainer_loaded(client.log(resumed[0].id)) if resumed else None
    problems = []
    if train.state != JobState.SUCCEEDED:
        problems.append(f"training job ended {train.state}")
    if urgent.state != JobState.SUCCEEDED:
        problems.append(f"high-priority job ended {urgent.state}")
    if train.preemptions < 1 or not resumed or resumed[0].checkpoint is None:
        problems.append("the training job was not suspended and resumed from a checkpoint")
    elif loaded != Path(resumed[0].checkpoint or "").name:
        problems.append(
            f"the resume event names {Path(resumed[0].checkpoint or '').name} (its HAI_LATEST_CHECKPOINT) "
            f"but the trainer loaded {loaded}"
        )
    print(flush=True)
    for title, args in (
        ("hai task --all", ("task", "--all")),
        (f"hai instance --task-id {train_id}", ("instance", "--task-id", str(train_id))),
    ):
        out = subprocess.run(
            hai_command(*args), env={**os.environ, **hai.env}, capture_output=True, text=True
        )
        print(f"$ {title}\n{out.stdout}{out.stderr}", flush=True)
    if problems:
        log("FAILED: " + "; ".join(problems))
        return 1
    checkpoint = Path(resumed[0].checkpoint or "").name
    log(
        f"done: the pipeline's training job {train_id} was suspended {train.preemptions} time(s) for "
        f"high-priority job {urgent_id}, resumed from {checkpoint} and succeeded; "
        "the Airflow task just kept waiting"
    )
    return 0


def trainer_loaded(log_text: str) -> str | None:
    """The checkpoint file the trainer says it resumed from (`resumed from step 30 (checkpoint-…pt)`)."""
    said = re.search(r"^resumed from step \d+ \((.+)\)$", log_text, re.MULTILINE)
    return said[1] if said else None


AIRFLOW_SERVICES = ("scheduler", "dag-processor", "triggerer")
"""Started beside the api-server, as a deployment runs them."""


def run_up(home: Path, port: int, airflow_port: int, airflow_host: str) -> int:
    """`make up`: hai serve and Airflow's four services in `home`, until Ctrl-C or SIGTERM."""
    tokens = Tokens.kept_in(home)
    airflow_home = home / "airflow"
    stack = Stack(marker=f"AIRFLOW_HOME={airflow_home}")
    hai: HaiService | None = None
    try:
        hai = HaiService(stack, home / "hai", tokens, port)
        local = "127.0.0.1" if airflow_host in ("0.0.0.0", "::") else airflow_host
        url = f"http://{local}:{airflow_port}"
        env = airflow_env(
            airflow_home,
            hai,
            AIRFLOW__CORE__EXECUTOR="LocalExecutor",
            AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
            AIRFLOW__API__BASE_URL=url,
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"{url}/execution/",
            AIRFLOW__API_AUTH__JWT_SECRET=tokens.jwt,
            # the pools mirror every group's quota, which only a platform admin may read
            AIRFLOW_CONN_HAI_ADMIN=json.dumps(
                {"conn_type": "hai", "host": hai.url, "password": tokens.person}
            ),
            AIRFLOW__HAI__POOL_SYNC_CONN_ID="hai_admin",
        )
        migrate = subprocess.run(airflow_command("db", "migrate"), env=env, capture_output=True, text=True)
        if migrate.returncode != 0:
            log(f"airflow db migrate failed:\n{migrate.stdout[-2000:]}{migrate.stderr[-2000:]}")
            return 1
        api = ("api-server", "--host", airflow_host, "--port", str(airflow_port))
        for name, args in (("api-server", api), *((n, (n,)) for n in AIRFLOW_SERVICES)):
            stack.start(f"airflow {name}", airflow_command(*args), env, home / f"airflow-{name}.log")
        log(f"hai serve: {hai.url} (HAI_SERVER={hai.url} HAI_TOKEN={hai.token})")
        log(
            f"Airflow UI: {url} on {airflow_host} (user admin, password in "
            f"{airflow_home}/simple_auth_manager_passwords.json.generated once it has started); "
            f"its connection hai_default acts for the signed-in person as hai user {SERVICE_USER}"
        )
        log(f"logs: {home}/*.log; Ctrl-C stops everything")
        while all(proc.poll() is None for _name, proc in stack.procs):
            time.sleep(1)
        log(f"{next(n for n, p in stack.procs if p.poll() is not None)} exited; stopping")
        return 1
    finally:
        log("stopping every process it started")
        stack.stop_all()
        if hai is not None:
            kill_jobs_left_behind(hai.home)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hai_airflow.demo", description=__doc__)
    parser.add_argument("--steps", type=int, default=150, help="training steps of the pipeline")
    parser.add_argument(
        "--step-sleep", type=float, default=0.1, help="seconds per step, so there is time to preempt"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--up", action="store_true", help="instead: run hai serve + Airflow until Ctrl-C")
    parser.add_argument("--home", type=Path, default=REPO / ".hai" / "up", help="state directory of --up")
    parser.add_argument("--port", type=int, default=8765, help="hai serve port of --up")
    parser.add_argument("--airflow-port", type=int, default=8080, help="Airflow UI port of --up")
    parser.add_argument(
        "--airflow-host",
        default="127.0.0.1",
        help="address the Airflow UI of --up listens on (0.0.0.0: every interface)",
    )
    args = parser.parse_args(argv)
    with sigterm_as_interrupt():
        if args.up:
            try:
                return run_up(args.home, args.port, args.airflow_port, args.airflow_host)
            except KeyboardInterrupt:
                return 130
        work = Path(tempfile.mkdtemp(prefix="hai-demo-"))
        try:
            return run_demo(work, args.steps, args.step_sleep)
        except KeyboardInterrupt:
            log("interrupted; everything it started is stopped")
            return 130
        except RuntimeError as e:
            log(f"FAILED: {e}")
            for name in ("airflow-dags-test.log", "hai/server.log"):
                path = work / name
                if path.exists():
                    tail = path.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
                    print(f"--- last lines of {path} ---\n" + "\n".join(tail), flush=True)
            return 1
        finally:
            if args.keep:
                log(f"kept {work}")
            else:
                shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
