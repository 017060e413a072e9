"""The CLI against a real `hai serve`: the document's workflow end to end, and every refusal path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hai_airflow.server.intake.submission import QUEUED
from hai_airflow.spec import TERMINAL_STATES, JobView
from tests.cli.conftest import Hai, free_port, json_out
from tests.support.live_server import TEST_CONFIG, LiveServer, reap_strays

SHORT_JOB = """\
import os
print("epoch 1 loss 0.90", flush=True)
print("训练完成 epoch 2 loss 0.45", flush=True)
print("gpus", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
"""

LONG_JOB = """\
import time
for step in range(600):
    print("step", step, flush=True)
    time.sleep(0.2)
"""


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    code = tmp_path / "训练代码"
    code.mkdir()
    (code / "train.py").write_text(SHORT_JOB, encoding="utf-8")
    (code / "long.py").write_text(LONG_JOB, encoding="utf-8")
    return code


def as_user(server: LiveServer, user: str) -> dict[str, str]:
    return {"HAI_SERVER": server.url, "HAI_TOKEN": f"{user}-token"}


def created_id(stdout: str) -> int:
    line = stdout.strip().splitlines()[-1]
    assert line.startswith("created task "), stdout
    return int(line.split()[-1])


def wait_for(server: LiveServer, job_id: int, states: set[str], timeout: float = 60) -> JobView:
    """Long-poll the job until it is in one of `states`."""
    deadline = time.monotonic() + timeout
    with server.client() as client:
        job: JobView = client.job(job_id)
        while job.state not in states:
            assert time.monotonic() < deadline, f"task {job_id} stuck in {job.state}: {job.reason}"
            if job.state in TERMINAL_STATES:
                pytest.fail(f"task {job_id} ended {job.state} ({job.reason}) while waiting for {states}")
            job = client.wait(job_id, since_state=job.state, timeout=5)
    return job


def wait_planned(server: LiveServer, job_id: int, timeout: float = 30) -> JobView:
    """The job once the controller has planned it: its reason is the plan's, not the submit's."""
    deadline = time.monotonic() + timeout
    with server.client() as client:
        job: JobView = client.job(job_id)
        while job.reason == QUEUED:
            assert time.monotonic() < deadline, f"task {job_id} never planned"
            time.sleep(0.1)
            job = client.job(job_id)
    return job


def python(script: str) -> str:
    return f"{sys.executable} {script}"


def test_document_workflow_res_create_task_instance_log_promote_cancel(
    hai: Hai, live_server: LiveServer, code_dir: Path
) -> None:
    alice = as_user(live_server, "alice")

    # hai res: pick a package
    res = hai("res", env=alice)
    assert res.exit_code == 0, res.output
    assert "8xV100" in res.stdout and "STARTABLE NOW" in res.stdout
    packages = {p["id"]: p for p in json_out(hai("res", "--json", env=alice))}
    assert packages[454]["gpus"] == 1 and packages[454]["gpu_type"] == "V100"
    assert packages[457]["startable_now"] >= 1

    # hai create: a high-priority job with a Chinese name, the document's flags
    created = hai(
        "create", "--task-name=中文训练-resnet", "--model-id=31", "--project-id=10209",
        f"--code-path={code_dir}", "--max-schedule=4", "--image=local", "--resource-pkg=454",
        "--shm=1024", f"--cmd={python('train.py')}", env=alice,
    )  # fmt: skip
    assert created.exit_code == 0, created.output
    job_id = created_id(created.stdout)
    done = wait_for(live_server, job_id, {"SUCCEEDED"})
    assert done.task_name == "中文训练-resnet"

    # hai task: listed with its name, priority and state; --json keys are API fields
    listing = hai("task", env=alice)
    assert listing.exit_code == 0
    row = next(line for line in listing.stdout.splitlines() if line.strip().startswith(str(job_id)))
    assert "中文训练-resnet" in row and "high (4h)" in row and "SUCCEEDED" in row
    jobs = json_out(hai("task", "--json", env=alice))
    mine = next(j for j in jobs if j["id"] == job_id)
    assert mine["task_name"] == "中文训练-resnet"
    assert mine["priority"] == "high" and mine["gpus"] == 1 and mine["model_id"] == 31

    detail = json_out(hai("task", "--task-id", str(job_id), "--json", env=alice))
    kinds = [e["kind"] for e in detail["events"]]
    assert kinds[0] == "submitted" and detail["state"] == "SUCCEEDED"
    assert detail["spec"]["code_path"] == str(code_dir), "a Chinese code path round-trips"
    human = hai("task", "--task-id", str(job_id), env=alice).stdout
    assert "Events" in human and "中文训练-resnet" in human

    # hai instance: one completed run with exit code 0 on node1
    instances = json_out(hai("instance", "--task-id", str(job_id), "--json", env=alice))
    assert len(instances) == 1
    instance = instances[0]
    assert instance["exit_code"] == 0 and instance["end_reason"] == "completed"
    assert instance["placement"][0]["node"] == "node1"
    table = hai("instance", "--task_id", str(job_id), env=alice).stdout
    assert "completed" in table and "node1:gpu" in table

    # hai log: the whole log, the tail, the document's spelling, and --follow on an ended run
    whole = hai("log", "--instance-id", str(instance["id"]), "--tail", "0", env=alice)
    assert whole.exit_code == 0
    assert "epoch 1 loss 0.90" in whole.stdout and "训练完成 epoch 2" in whole.stdout
    tail = hai("log", f"--instance_id={instance['id']}", "--tail=1", env=alice).stdout
    assert tail.strip().splitlines() == [f"gpus {instance['placement'][0]['gpus'][0]}"]
    followed = hai("log", "--task-id", str(job_id), "--follow", env=alice)
    assert followed.exit_code == 0 and "训练完成 epoch 2" in followed.stdout

    # hai promote: a low-priority running job becomes high priority within quota
    low = hai(
        "create", "--task-name=long-low", f"--code-path={code_dir}", "--resource-pkg=454",
        f"--cmd={python('long.py')}", env=alice,
    )  # fmt: skip
    low_id = created_id(low.stdout)
    wait_for(live_server, low_id, {"RUNNING"})
    promoted = hai("promote", "--task-id", str(low_id), "--max-schedule", "8", env=alice)
    assert promoted.exit_code == 0, promoted.output
    assert promoted.stdout.strip() == f"promoted task {low_id} to high priority (max-schedule 8h)"
    assert json_out(hai("task", "--task-id", str(low_id), "--json", env=alice))["priority"] == "high"

    # hai cancel: a script (no terminal) cancels at once, as scancel does, and the instance stops
    assert wait_for(live_server, low_id, {"RUNNING"}).state == "RUNNING"
    cancelled = hai("cancel", "--task-id", str(low_id), env=alice)
    assert cancelled.exit_code == 0, cancelled.output
    assert f"task {low_id}" in cancelled.stdout and cancelled.stdout.startswith("cancel")
    wait_for(live_server, low_id, {"CANCELLED"})
    runs = json_out(hai("instance", "--task-id", str(low_id), "--json", env=alice))
    assert runs[-1]["end_reason"] == "cancelled"
    again = hai("cancel", "--task-id", str(low_id), "--yes", env=alice)
    assert again.exit_code == 1 and "already ended" in again.stderr


# ---- refusals and the remaining commands, on one server for the module ---------------------


def test_unknown_task_is_not_found(hai: Hai, clean: LiveServer) -> None:
    alice = as_user(clean, "alice")
    for args in (
        ("task", "--task-id=9999"),
        ("instance", "--task-id=9999"),
        ("promote", "--task-id=9999", "--max-schedule=4"),
        ("log", "--instance-id=9999"),
        ("queue", "--explain=9999"),
    ):
        result = hai(*args, env=alice)
        assert result.exit_code == 1, (args, result.output)
        assert result.stderr.startswith("Error: ") and "9999" in result.stderr
        assert "does not exist" in result.stderr or "not found" in result.stderr


def test_other_users_task_is_hidden(hai: Hai, clean: LiveServer, code_dir: Path) -> None:
    alice, dave = as_user(clean, "alice"), as_user(clean, "dave")
    job_id = created_id(
        hai(
            "submit", "cpu", "--name=alice-only", f"--code-dir={code_dir}", python("long.py"), env=alice
        ).stdout
    )
    for args in (("task", f"--task-id={job_id}"), ("cancel", f"--task-id={job_id}", "--yes")):
        result = hai(*args, env=dave)
        assert result.exit_code == 1, result.output
        assert str(job_id) in result.stderr
    assert all(j["id"] != job_id for j in json_out(hai("task", "--json", env=dave)))
    assert wait_for(clean, job_id, {"RUNNING", "STARTING", "PENDING"}).user == "alice"


def test_over_quota_high_priority_is_refused_with_the_fix(
    hai: Hai, clean: LiveServer, code_dir: Path
) -> None:
    alice, carol = as_user(clean, "alice"), as_user(clean, "carol")
    lowered = hai("quota", "set", "--user=alice", "--gpus=1", env=carol)
    assert lowered.exit_code == 0, lowered.output
    assert lowered.stdout.strip() == "set the high-priority quota of user alice to 1 GPUs"
    try:
        over = hai(
            "create", "--task-name=too-big", f"--code-path={code_dir}", "--resource-pkg=455",
            "--max-schedule=24", "--cmd=true", env=alice,
        )  # fmt: skip
        assert over.exit_code == 1, over.output
        line = over.stderr.strip()
        assert line.startswith("Error: ") and "\n" not in line
        assert "over your high-priority quota (2/1 GPUs in group vision)" in line
        assert "Submit with --max-schedule 0 for low priority, or ask your group admin" in line
        assert over.stdout == ""
        low = hai(
            "create", "--task-name=fits-low", f"--code-path={code_dir}", "--resource-pkg=455",
            "--max-schedule=0", "--cmd=true", env=alice,
        )  # fmt: skip
        assert low.exit_code == 0, low.output
    finally:
        hai("quota", "set", "--user=alice", "--gpus=8", env=carol)


def test_server_refusals_of_bad_input_exit_2(hai: Hai, clean: LiveServer, code_dir: Path) -> None:
    alice = as_user(clean, "alice")
    missing_pkg = hai(
        "create", "--task-name=x", f"--code-path={code_dir}", "--resource-pkg=999", "--cmd=x", env=alice
    )
    assert missing_pkg.exit_code == 2
    assert "resource package 999 does not exist" in missing_pkg.stderr and "hai res" in missing_pkg.stderr
    no_dir = hai(
        "create", "--task-name=x", "--code-path=/no/such/dir", "--resource-pkg=454", "--cmd=x", env=alice
    )
    assert no_dir.exit_code == 2 and "/no/such/dir" in no_dir.stderr


def test_bad_token_is_refused(hai: Hai, clean: LiveServer) -> None:
    result = hai("task", env={"HAI_SERVER": clean.url, "HAI_TOKEN": "wrong"})
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: ") and "Traceback" not in result.output


def test_submit_short_form_picks_the_smallest_fitting_package(
    hai: Hai, clean: LiveServer, code_dir: Path
) -> None:
    alice = as_user(clean, "alice")
    two = hai(
        "submit", "standalone", "--name=gpu-job", "--gpus=2", "--worker-image=local", "--gpu-type=v100",
        f"--code-dir={code_dir}", "--json", python("train.py"), env=alice,
    )  # fmt: skip
    assert two.exit_code == 0, two.output
    job = json_out(two)
    assert job["spec"]["resource_pkg"] == 455 and job["gpus"] == 2 and job["gpu_type"] == "V100"
    three = json_out(
        hai(
            "submit",
            "standalone",
            "--name=g3",
            "--gpus=3",
            f"--code-dir={code_dir}",
            "--json",
            "true",
            env=alice,
        )
    )
    assert three["spec"]["resource_pkg"] == 456
    words = hai(
        "submit", "standalone", "--name=w", f"--code-dir={code_dir}", "--json", "--", "echo", "a b", env=alice
    )
    assert json_out(words)["spec"]["cmd"] == "echo 'a b'"

    t4 = hai(
        "submit", "standalone", "--name=t4", "--gpu-type=T4", f"--code-dir={code_dir}", "true", env=alice
    )
    assert t4.exit_code == 2
    assert "no resource package has 1 T4 GPUs" in t4.stderr and "8xV100" in t4.stderr

    dist = json_out(
        hai(
            "submit",
            "distributed",
            "--name=hvd",
            "--workers=1",
            f"--code-dir={code_dir}",
            "--json",
            "true",
            env=alice,
        )
    )
    assert dist["mode"] == "distributed" and dist["spec"]["worker_resource_pkg"] == 457 and dist["gpus"] == 8

    cpu = hai(
        "submit", "cpu", "--name=预处理", "--cpus=2", "--memory=4", f"--code-dir={code_dir}",
        python("train.py"), env=alice,
    )  # fmt: skip
    assert cpu.exit_code == 0, cpu.output
    cpu_job = wait_for(clean, created_id(cpu.stdout), {"SUCCEEDED"})
    assert cpu_job.mode == "cpu" and cpu_job.gpus == 0 and cpu_job.task_name == "预处理"


def test_queue_explains_why_a_task_waits(hai: Hai, clean: LiveServer, code_dir: Path) -> None:
    alice, bob = as_user(clean, "alice"), as_user(clean, "bob")
    whole = created_id(
        hai(
            "submit",
            "standalone",
            "--name=whole",
            "--gpus=8",
            f"--code-dir={code_dir}",
            python("long.py"),
            env=alice,
        ).stdout
    )
    wait_for(clean, whole, {"RUNNING"})
    waiting = created_id(
        hai(
            "submit", "standalone", "--name=waits", "--gpus=1", f"--code-dir={code_dir}", "true", env=bob
        ).stdout
    )
    planned = wait_planned(clean, waiting)
    entries = json_out(hai("queue", "--json", env=bob))
    entry = next(e for e in entries if e["job"]["id"] == waiting)
    assert entry["position"] >= 1 and entry["reason"][:20] == planned.reason[:20]
    assert {"position", "job", "weight", "terms", "reason", "waiting_behind"} <= set(entry)

    table = hai("queue", env=bob)
    assert table.exit_code == 0 and "WAITS BECAUSE" in table.stdout and "waits" in table.stdout
    explained = hai("queue", "--explain", str(waiting), env=bob)
    assert explained.exit_code == 0, explained.output
    assert "waits because" in explained.stdout and entry["reason"][:20] in explained.stdout
    assert json_out(hai("queue", "--explain", str(waiting), "--json", env=bob))["job"]["id"] == waiting

    running = hai("queue", "--explain", str(whole), env=alice)
    assert running.exit_code == 1 and "not waiting in the queue" in running.stderr


def test_suspend_and_resume_are_for_admins(hai: Hai, clean: LiveServer, code_dir: Path) -> None:
    alice, carol = as_user(clean, "alice"), as_user(clean, "carol")
    job_id = created_id(
        hai(
            "submit", "standalone", "--name=held", f"--code-dir={code_dir}", python("long.py"), env=alice
        ).stdout
    )
    wait_for(clean, job_id, {"RUNNING"})
    refused = hai("suspend", "--task-id", str(job_id), env=alice)
    assert refused.exit_code == 1 and "only an admin of group vision" in refused.stderr
    suspended = hai("suspend", "--task-id", str(job_id), env=carol)
    assert suspended.exit_code == 0, suspended.output
    assert suspended.stdout.startswith("suspend") and str(job_id) in suspended.stdout
    wait_for(clean, job_id, {"SUSPENDED"})
    resumed = hai("resume", "--task-id", str(job_id), env=carol)
    assert resumed.exit_code == 0 and resumed.stdout.startswith(f"resumed task {job_id}")
    wait_for(clean, job_id, {"RUNNING"})
    runs = json_out(hai("instance", "--task-id", str(job_id), "--json", env=alice))
    assert len(runs) == 2 and runs[0]["end_reason"] in {"suspended", "preempted"} and runs[1]["resume"]


def test_quota_shows_use_and_who_may_set_it(hai: Hai, clean: LiveServer) -> None:
    alice, carol, admin = as_user(clean, "alice"), as_user(clean, "carol"), as_user(clean, "admin")
    mine = json_out(hai("quota", "--json", env=alice))
    assert mine["group"] == "vision" and mine["user"] == "alice"
    assert mine["group_quota_gpus"] == 8 and mine["user_quota_gpus"] == 8
    assert {"user": "alice", "used_gpus": 0, "quota_gpus": 8} in mine["users"]
    human = hai("quota", env=alice).stdout
    assert "vision" in human and "/8 GPUs" in human and "PERSONAL QUOTA" in human
    groups = json_out(hai("quota", "--all", "--json", env=admin))
    assert {"default", "vision", "nlp"} <= {g["group"] for g in groups}

    not_admin = hai("quota", "set", "--group=vision", "--gpus=4", env=carol)
    assert not_admin.exit_code == 1 and not_admin.stderr.startswith("Error: ")
    raised = hai("quota", "set", "--group=vision", "--gpus=16", "--json", env=admin)
    assert raised.exit_code == 0 and json_out(raised)["group_quota_gpus"] == 16
    cleared = hai("quota", "set", "--group=vision", "--clear", env=admin)
    assert cleared.stdout.strip() == "removed the quota of group vision; it is unlimited"
    assert json_out(hai("quota", "--json", env=alice))["group_quota_gpus"] is None
    hai("quota", "set", "--group=vision", "--gpus=8", env=admin)


def test_listing_filters_and_empty_listing(hai: Hai, clean: LiveServer, code_dir: Path) -> None:
    dave = as_user(clean, "dave")
    empty = hai("task", env=dave)
    assert empty.exit_code == 0 and empty.stdout == "" and "no tasks" in empty.stderr
    job_id = created_id(
        hai("submit", "cpu", "--name=d1", f"--code-dir={code_dir}", python("train.py"), env=dave).stdout
    )
    wait_for(clean, job_id, {"SUCCEEDED"})
    assert [j["id"] for j in json_out(hai("task", "--state=succeeded", "--json", env=dave))] == [job_id]
    assert json_out(hai("task", "--state=RUNNING", "--json", env=dave)) == []


def test_log_follow_streams_until_the_instance_ends(hai: Hai, clean: LiveServer, code_dir: Path) -> None:
    alice = as_user(clean, "alice")
    (code_dir / "slow.py").write_text(
        "import time\nfor i in range(6):\n    print('tick', i, flush=True)\n    time.sleep(0.3)\n",
        encoding="utf-8",
    )
    job_id = created_id(
        hai("submit", "cpu", "--name=ticks", f"--code-dir={code_dir}", python("slow.py"), env=alice).stdout
    )
    wait_for(clean, job_id, {"RUNNING", "SUCCEEDED"})
    followed = hai("log", "--task-id", str(job_id), "--follow", env=alice)
    assert followed.exit_code == 0, followed.output
    assert [line for line in followed.stdout.splitlines() if line.startswith("tick")] == [
        f"tick {i}" for i in range(6)
    ]
    assert clean.client().job(job_id).state == "SUCCEEDED"


def test_hai_serve_starts_a_server_the_cli_can_use(hai: Hai, tmp_path: Path) -> None:
    home = tmp_path / "served"
    home.mkdir()
    (home / "config.toml").write_text(TEST_CONFIG, encoding="utf-8")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "HAI_HOME": str(home)}
    env.pop("HAI_SERVER", None)
    run_hai = "from hai_airflow.cli.main import app; app()"
    serve = [
        sys.executable,
        "-c",
        run_hai,
        "serve",
        "--config",
        str(home / "config.toml"),
        "--port",
        str(port),
    ]
    proc = subprocess.Popen(serve, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            result = hai("res", "--json", env={"HAI_SERVER": url, "HAI_TOKEN": "alice-token"})
            if result.exit_code == 0:
                break
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, result.stderr
            time.sleep(0.2)
        assert 457 in {p["id"] for p in json_out(result)}
        assert (home / "token").exists(), "hai serve writes the admin token for local use"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        reap_strays(home)


def test_hai_serve_refuses_a_missing_config(hai: Hai, tmp_path: Path) -> None:
    result = hai("serve", "--config", str(tmp_path / "nope.toml"))
    assert result.exit_code == 2
    assert "nope.toml" in result.stderr and "does not exist" in result.stderr
