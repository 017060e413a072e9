"""Races between a check and a use, run under the race harness (tests/security/race.py)."""

from __future__ import annotations

import contextlib
import os
import pwd
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hai_airflow.client import HaiClient, HaiError
from hai_airflow.spec import TERMINAL_STATES, CpuJobSpec, JobView
from tests.security.race import Flipper
from tests.support.live_server import TEST_CONFIG, TOKENS, LiveServer

SUBMITS = 200


@pytest.fixture
def server(tmp_path: Path, store_env: dict[str, str]) -> Iterator[LiveServer]:
    with LiveServer(tmp_path / "hai", TEST_CONFIG, store_env).start() as live:
        yield live


def never_placed(code: Path, name: str) -> dict[str, object]:
    """A CPU job no node can hold: refused by the planner, so the test starts no process."""
    return {"mode": "cpu", "task_name": name, "code_path": str(code), "cmd": "true", "cpus": 1000}


def test_one_users_race_never_fails_another_users_submissions(server: LiveServer, tmp_path: Path) -> None:
    """Finding 6: bob swaps his own code path while he and alice submit; a check that meets the swap
    is bob's own 4xx, and alice, uninvolved, gets every job accepted."""
    dave = tmp_path / "dave" / "code"
    dave.mkdir(parents=True)
    alice = tmp_path / "alice"
    alice.mkdir()
    answers: dict[str, Counter[int]] = {"alice": Counter(), "bob": Counter()}

    def submit(user: str, code: Path) -> None:
        with httpx.Client(base_url=f"{server.url}/api/v1", timeout=60) as http:
            for i in range(SUBMITS):
                body = {"spec": never_placed(code, f"{user}-{i}")}
                r = http.post("/jobs", json=body, headers={"Authorization": f"Bearer {TOKENS[user]}"})
                answers[user][r.status_code] += 1

    with Flipper(tmp_path / "bob" / "c2", dave) as flipper:
        threads = [
            threading.Thread(target=submit, args=("alice", alice)),
            threading.Thread(target=submit, args=("bob", flipper.path)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
    assert flipper.flips >= 500
    assert answers["alice"] == Counter({201: SUBMITS}), answers
    assert sum(answers["bob"].values()) == SUBMITS
    assert all(status < 500 for status in answers["bob"]), answers


RUN_AS = 'run_as = "nobody"'
SCANNED_JOBS = 8
JOBS = 30


@pytest.mark.parametrize(
    "home_mode",
    [
        pytest.param(0o700, id="in a home the job's account may not enter"),
        pytest.param(0o755, id="readable, outside bob's roots"),
    ],
)
def test_swapping_the_code_path_at_launch_reads_nobody_elses_files(open_dir: Path, home_mode: int) -> None:
    """Finding 1: bob flips his code path between his directory and a symlink to dave's while his jobs
    start. The command enters its directory as the job's account, and only the one the platform
    checked: no job prints dave's file, however the race falls."""
    home, dave = open_dir / "hai", open_dir / "nas" / "dave" / "code"
    dave.mkdir(parents=True)
    (dave / "train.py").write_text("DAVE-SECRET\n")
    (dave / "train.py").chmod(0o644)
    dave.chmod(0o755)
    (open_dir / "nas").chmod(0o755)
    (open_dir / "nas" / "dave").chmod(home_mode)
    config = TEST_CONFIG.replace("[[nodes]]", f"[backend]\n{RUN_AS}\n\n[[nodes]]", 1)
    config = f'[paths]\nallowed = ["{open_dir}/nas/{{user}}"]\n\n' + config
    mine = open_dir / "nas" / "bob" / "c2"
    mine.mkdir(parents=True)
    (mine / "train.py").write_text("bob's own code\n")
    for d in (mine, mine.parent):
        d.chmod(0o755)
    with LiveServer(home, config).start() as server, server.client(TOKENS["bob"]) as bob:
        with Flipper(mine, dave, min_flips=500, hold=0.002) as flipper:
            jobs = []
            for i in range(JOBS):
                spec = {"task_name": f"swap-{i}", "code_path": str(mine), "cmd": "pwd -P; cat train.py"}
                with contextlib.suppress(HaiError):  # caught mid-swap at submit: refused, 422
                    jobs.append(bob.submit(CpuJobSpec(**spec)))
            ended = [wait_ended(bob, job.id) for job in jobs]
        logs = [bob.log(bob.instances(job.id)[-1].id) if job.instances else job.reason for job in ended]
    assert flipper.flips >= 500
    assert jobs, "every submit was refused: the race never let one through"
    leaks = [log for log in logs if "DAVE-SECRET" in log or str(dave) in log]
    assert leaks == [], leaks
    assert any("bob's own code" in log for log in logs) or all(j.state == "FAILED" for j in ended)


def wait_ended(client: HaiClient, job_id: int, timeout: float = 120) -> JobView:
    deadline = time.monotonic() + timeout
    job = client.job(job_id)
    while job.state not in TERMINAL_STATES:
        assert time.monotonic() < deadline, f"job {job_id} stuck in {job.state}"
        job = client.wait(job_id, since_state=job.state, timeout=5)
    return job


def test_the_checkpoint_scan_never_follows_a_swapped_model_dir(tmp_path: Path) -> None:
    """Finding 5: alice flips her running jobs' model dir between her directory and a symlink into
    dave's model dir, whose checkpoint is newer; the scan walks down from her allowed root without
    following a link that leads out, so no job of hers ever reports dave's checkpoint."""
    nas = tmp_path / "nas"
    daves = nas / "dave" / "m"
    daves.mkdir(parents=True)
    mine = nas / "alice" / "m2"
    mine.mkdir(parents=True)
    (mine / "checkpoint-00000001.pt").write_text("alice's")
    os.utime(mine / "checkpoint-00000001.pt", (time.time() - 600, time.time() - 600))
    (daves / "checkpoint-99999999.pt").write_text("DAVE-SECRET")
    config = f'[paths]\nallowed = ["{nas}/{{user}}"]\n\n' + TEST_CONFIG
    seen: set[str | None] = set()
    with LiveServer(tmp_path / "hai", config).start() as server, server.client(TOKENS["alice"]) as alice:
        code = nas / "alice" / "code"
        code.mkdir()
        spec = CpuJobSpec(task_name="t", code_path=str(code), cmd="sleep 60", model_dir=str(mine))
        jobs = [alice.submit(spec).id for _ in range(SCANNED_JOBS)]
        deadline = time.monotonic() + 60
        while {j.state for j in alice.jobs() if j.id in jobs} != {"RUNNING"}:
            assert time.monotonic() < deadline, [(j.state, j.reason) for j in alice.jobs()]
            time.sleep(0.2)
        with Flipper(mine, daves, min_flips=500) as flipper:
            deadline = time.monotonic() + 16  # eight scans of each job or more
            while time.monotonic() < deadline:
                seen.update(j.latest_checkpoint for j in alice.jobs() if j.id in jobs)
                time.sleep(0.2)
        seen.update(alice.job(job_id).latest_checkpoint for job_id in jobs)
        states = {alice.job(job_id).state for job_id in jobs}
        for job_id in jobs:
            alice.cancel(job_id)
    assert states == {"RUNNING"}, states  # a scan that met the race failed no job
    assert flipper.flips >= 500
    leaked = [c for c in seen if c is not None and ("dave" in c or "99999999" in c)]
    assert leaked == [], leaked
    assert str(mine / "checkpoint-00000001.pt") in seen, seen


def test_a_model_dir_is_made_by_the_jobs_account_never_through_a_swap(open_dir: Path) -> None:
    """Finding 7: bob flips a parent of his jobs' new model dirs between his directory and a symlink
    into a root-only directory outside his roots. The dir is made by the job's account (or, inside the
    job's own dir, by a walk that follows no link), so nothing ever appears in the root-only
    directory, and a model dir made without any race is the job's account's, not root's."""
    nas, secret = open_dir / "nas", open_dir / "root-only"
    secret.mkdir(mode=0o700)
    parent = nas / "bob" / "p"
    parent.mkdir(parents=True)
    for d in (nas, nas / "bob", parent):
        d.chmod(0o777)  # the job's account (nobody) may create its model dirs here
    code = nas / "bob" / "code"
    code.mkdir(mode=0o755)
    config = TEST_CONFIG.replace("[[nodes]]", f"[backend]\n{RUN_AS}\n\n[[nodes]]", 1)
    config = f'[paths]\nallowed = ["{nas}/{{user}}"]\n\n' + config
    with LiveServer(open_dir / "hai", config).start() as server, server.client(TOKENS["bob"]) as bob:
        plain = bob.submit(
            CpuJobSpec(
                task_name="plain",
                code_path=str(code),
                cmd="touch $HAI_MODEL_DIR/ok",
                model_dir=str(nas / "bob" / "new" / "m"),
            )
        )
        assert wait_ended(bob, plain.id).state == "SUCCEEDED", bob.job(plain.id).reason
        with Flipper(parent, secret, min_flips=500, hold=0.002) as flipper:
            jobs = []
            for i in range(JOBS):
                spec = {
                    "task_name": f"m-{i}",
                    "code_path": str(code),
                    "cmd": "true",
                    "model_dir": str(parent / f"m-{i}"),
                }
                with contextlib.suppress(HaiError):  # caught mid-swap at submit: refused, 422
                    jobs.append(bob.submit(CpuJobSpec(**spec)))
            ended = [wait_ended(bob, job.id) for job in jobs]
    nobody = pwd.getpwnam("nobody").pw_uid
    made = nas / "bob" / "new" / "m"
    assert (made.stat().st_uid, (made / "ok").stat().st_uid) == (nobody, nobody)
    assert flipper.flips >= 500
    assert list(secret.iterdir()) == [], "a model dir was created through the swapped link"
    assert jobs and all(j.state in ("SUCCEEDED", "FAILED") for j in ended), [
        (j.state, j.reason) for j in ended
    ]
    assert {p.stat().st_uid for p in parent.iterdir()} <= {nobody}
