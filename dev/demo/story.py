"""`make demo`: an Airflow pipeline's training on hai is preempted by a high-priority job and resumes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from dev.demo import INCLUDE, log
from dev.demo.processes import Stack, kill_jobs_left_behind
from dev.demo.services import HaiService, Tokens, airflow_command, airflow_env, hai_command
from hai_airflow.client import HaiClient
from hai_airflow.spec import TERMINAL_STATES, JobState, JobView

PIPELINE = "cpu_gpu_pipeline"
TRAIN_TASK = f"{PIPELINE}.train"
URGENT_TASK = "urgent-8gpu"


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
    """The whole story in `work`: hai serve, the pipeline under `airflow dags test`, the preemption
    and the resume; 0 when each happened as told. Everything it started is stopped at the end."""
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
