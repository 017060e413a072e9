"""`hai serve` as a real subprocess with real jobs: preemption, restarts, two servers, concurrency."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from hai_airflow.client import HaiClient, HaiError
from hai_airflow.spec import CpuJobSpec, DistributedJobSpec, JobView, StandaloneJobSpec
from tests.server.scripts import TRAIN
from tests.support import postgres
from tests.support.live_server import TEST_CONFIG, TOKENS, LiveServer, free_port, start_server

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


@pytest.fixture(params=["sqlite", "postgresql"])
def store_env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """Server environment selecting the store: SQLite under HAI_HOME, or the session's PostgreSQL db."""
    if request.param == "sqlite":
        return {"HAI_DATABASE_URL": f"sqlite:///{tmp_path / 'shared.db'}"}
    url: str = request.getfixturevalue("pg_database")
    postgres.reset_database(url)
    return {"HAI_DATABASE_URL": url}


@pytest.fixture
def code(tmp_path: Path) -> Path:
    path = tmp_path / "code"
    path.mkdir()
    (path / "train.py").write_text(TRAIN)
    (path / "ranks.py").write_text(
        "import json, os, pathlib\n"
        "keys = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'HOROVOD_RANK', 'MASTER_ADDR', 'CUDA_VISIBLE_DEVICES')\n"
        "out = pathlib.Path(os.environ['HAI_MODEL_DIR']) / f\"rank-{os.environ['RANK']}.json\"\n"
        "out.write_text(json.dumps({k: os.environ.get(k) for k in keys}))\n"
    )
    return path


@pytest.fixture
def server(tmp_path: Path, store_env: dict[str, str]) -> Iterator[LiveServer]:
    with start_server(tmp_path / "home", TEST_CONFIG, store_env) as s:
        yield s


def std(code: Path, cmd: str, pkg: int = 454, **kw: Any) -> StandaloneJobSpec:
    return StandaloneJobSpec(task_name="t", code_path=str(code), cmd=cmd, resource_pkg=pkg, **kw)


def wait_state(client: HaiClient, job_id: int, *states: str, timeout: float = 20) -> JobView:
    deadline = time.monotonic() + timeout
    job: JobView = client.job(job_id)
    while job.state not in states:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"job {job_id} is {job.state} ({job.reason}), not {states}")
        job = client.wait(job_id, since_state=job.state, timeout=min(left, 5))
    return job


def read_json(path: Path, timeout: float = 10) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def ts(d: datetime | None) -> float:
    assert d is not None
    return d.timestamp()


# ---- start-up and configuration ---------------------------------------------------------------


def test_first_start_writes_a_default_config_and_a_private_token(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with start_server(home) as s:
        assert (home / "config.toml").exists() and (home / "hai.db").exists()
        assert (home / "token").stat().st_mode & 0o777 == 0o600
        with s.client() as c:
            me = c.whoami()
            assert me["role"] == "platform_admin" and me["group"] == "default"
            packages = {p.id: p for p in c.resource_packages()}
            p457 = packages[457]
            assert (p457.gpus, p457.gpu_type, p457.cpus, p457.memory_gb) == (8, "V100", 32, 256)
            assert {454, 455, 456, 100} <= set(packages)
            nodes = c.nodes()
            if shutil.which("nvidia-smi") is None:
                assert [(n.gpu_type, n.gpus, n.virtual) for n in nodes] == [("V100", 8, True)]
        # the client on this machine finds the server's token by itself
        env = {**os.environ, "HAI_HOME": str(home), "HAI_SERVER": s.url}
        env.pop("HAI_TOKEN", None)
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                "from hai_airflow.client import HaiClient; print(HaiClient().whoami()['user'])",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == me["user"]


@pytest.mark.parametrize(
    ("config", "field"),
    [
        pytest.param("[server]\nport = 0\n", "server.port", id="port out of range"),
        pytest.param("[server]\npolicy = 'lottery'\n", "server.policy", id="unknown policy"),
        pytest.param("[server]\nbackend = 'mainframe'\n", "server.backend", id="unknown backend"),
        pytest.param(
            "[backend]\nwatch_interval_seconds = 0\n",
            "backend.watch_interval_seconds",
            id="bad backend option",
        ),
        pytest.param("[[users]]\nname = 'x'\nrole = 'king'\n", "users[0].role", id="bad role"),
        pytest.param("[[users]]\nname = 'x'\ngroup = 'ghosts'\n", "users[0].group", id="undefined group"),
        pytest.param("[[nodes]]\nname = 'n'\ngpus = -1\n", "nodes[0].gpus", id="negative gpus"),
        pytest.param("[serve]\nport = 1\n", "serve", id="unknown section"),
        pytest.param("[server\n", None, id="not TOML"),
    ],
)
def test_bad_config_exits_2_naming_the_field(tmp_path: Path, config: str, field: str | None) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(config)
    env = {**os.environ, "HAI_HOME": str(tmp_path / "home")}
    out = subprocess.run(
        [sys.executable, "-m", "hai_airflow.server", "--config", str(path), "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("Error: bad config")
    assert "Traceback" not in out.stderr
    assert str(path) in out.stderr
    if field:
        assert f" at {field}:" in out.stderr
    else:
        assert "not valid TOML" in out.stderr


def serve(home: Path, port: int, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    (home / "config.toml").parent.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(TEST_CONFIG)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "hai_airflow.server",
            "--config",
            str(home / "config.toml"),
            "--port",
            str(port),
        ],
        env={**os.environ, "HAI_HOME": str(home), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_busy_port_exits_1_with_a_sentence(live_server: LiveServer, tmp_path: Path) -> None:
    out = serve(tmp_path / "other", live_server.port)
    assert out.returncode == 1
    assert f"Error: cannot listen on 127.0.0.1:{live_server.port}" in out.stderr
    assert "Traceback" not in out.stderr


def test_an_unreachable_database_exits_1_naming_the_setting(tmp_path: Path) -> None:
    env = {"HAI_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:9/nowhere?connect_timeout=2"}
    out = serve(tmp_path / "home", free_port(), env)
    assert out.returncode == 1
    assert "Error: cannot use the database" in out.stderr and "HAI_DATABASE_URL" in out.stderr
    assert "Traceback" not in out.stderr


# ---- scheduling with real processes -----------------------------------------------------------


def test_high_job_preempts_the_low_one_within_2s_and_the_low_one_resumes(
    server: LiveServer, code: Path
) -> None:
    alice, dave = server.client(TOKENS["alice"]), server.client(TOKENS["dave"])
    low = alice.submit(std(code, "python3 train.py 120", 457))
    low = wait_state(alice, low.id, "RUNNING")
    (first,) = alice.instances(low.id)
    model = server.home / "jobs" / str(low.id) / "model"
    read_json(model / f"env-{first.id}.json")
    deadline = time.monotonic() + 10
    while alice.job(low.id).latest_checkpoint is None:
        assert time.monotonic() < deadline, "checkpoint never seen"
        time.sleep(0.1)

    high = dave.submit(std(code, "python3 train.py 1", 457, max_schedule=4))
    wait_state(alice, low.id, "SUSPENDED", timeout=10)
    (gone,) = alice.instances(low.id)
    assert gone.end_reason == "preempted" and gone.preempted_by == high.id
    assert ts(gone.ended_at) - ts(high.submitted_at) < 2.0
    running = wait_state(dave, high.id, "RUNNING", timeout=10)
    assert [p.gpus for p in running.placement] == [p.gpus for p in first.placement]
    queue = alice.queue()
    assert queue and queue[0].job.id == low.id and queue[0].preempted_by == high.id

    wait_state(dave, high.id, "SUCCEEDED", timeout=20)
    wait_state(alice, low.id, "RUNNING", timeout=20)
    second = alice.instances(low.id)[-1]
    env = read_json(model / f"env-{second.id}.json")
    assert env["HAI_RESUME"] == "1"
    assert env["HAI_LATEST_CHECKPOINT"].endswith(f"step-{first.id}.pt")
    assert second.resume and second.checkpoint == env["HAI_LATEST_CHECKPOINT"]


def test_quota_refusal_and_promotion_through_the_client(server: LiveServer, code: Path) -> None:
    alice = server.client(TOKENS["alice"])
    first = alice.submit(std(code, "python3 train.py 1", 457, max_schedule=4))
    with pytest.raises(HaiError) as refused:
        alice.submit(std(code, "python3 train.py 60", 454, max_schedule=4))
    assert refused.value.status == 409
    assert "over your high-priority quota (9/8 GPUs in group vision)" in refused.value.message
    assert "--max-schedule 0" in refused.value.message
    low = alice.submit(std(code, "python3 train.py 60", 454))
    with pytest.raises(HaiError) as still:
        alice.promote(low.id, 4)
    assert still.value.status == 409
    wait_state(alice, first.id, "SUCCEEDED", timeout=30)
    promoted = alice.promote(low.id, 4)
    assert promoted.priority == "high" and promoted.max_schedule == 4
    assert alice.check_high_priority(0)["user_used"] == 1


def test_kill9_and_restart_loses_nothing(server: LiveServer, code: Path) -> None:
    c = server.client(TOKENS["alice"])
    keeps = c.submit(std(code, "python3 train.py 60", 456))
    ends = c.submit(std(code, "python3 train.py 2", 455))
    waits = c.submit(std(code, "python3 train.py 60", 457))
    wait_state(c, keeps.id, "RUNNING")
    wait_state(c, ends.id, "RUNNING")
    before = {j.id: c.instances(j.id) for j in (keeps, ends)}
    server.kill9()
    time.sleep(3)  # `ends` finishes while no server is up
    server.start()
    assert wait_state(c, ends.id, "SUCCEEDED", timeout=15).instances == 1
    (inst,) = c.instances(ends.id)
    assert (inst.exit_code, inst.end_reason) == (0, "completed")
    kept = c.job(keeps.id)
    assert kept.state == "RUNNING" and c.instances(keeps.id) == before[keeps.id]
    assert c.job(waits.id).state == "PENDING"
    assert sorted(j.id for j in c.jobs()) == sorted([keeps.id, ends.id, waits.id])
    c.cancel(keeps.id)
    wait_state(c, keeps.id, "CANCELLED")
    wait_state(c, waits.id, "RUNNING")  # the freed GPUs go to the waiting job
    assert server.client(TOKENS["admin"]).check_store().problems == []


def test_two_servers_on_one_database_never_double_admit(
    tmp_path: Path, store_env: dict[str, str], code: Path
) -> None:
    # Servers on one database share the key its tokens are hashed under.
    shared = {**store_env, "HAI_TOKEN_KEY_FILE": str(tmp_path / "token.key")}
    with (
        start_server(tmp_path / "a", TEST_CONFIG, shared) as a,
        start_server(tmp_path / "b", TEST_CONFIG, shared) as b,
    ):
        ha, hb = a.health(), b.health()
        assert ha["lease_holder"] == hb["lease_holder"] == ha["this_server"]
        assert ha["controller_active"] and not hb["controller_active"]
        clients = [a.client(TOKENS["alice"]), b.client(TOKENS["alice"])]
        jobs = [clients[i % 2].submit(std(code, "python3 train.py 0.5", 455)) for i in range(12)]
        # a long-poll on the standby sees what the other process's controller did
        t0 = time.monotonic()
        seen = clients[1].wait(jobs[0].id, since_state="PENDING", timeout=10)
        assert seen.state != "PENDING" and time.monotonic() - t0 < 5
        a.kill9()  # the standby takes over and finishes the work
        for j in jobs:
            assert wait_state(clients[1], j.id, "SUCCEEDED", timeout=60).state == "SUCCEEDED"
            # An instance killed with its server before its handle was saved is lost and the job
            # requeued; the instance that finished is the last one.
            *earlier, last = sorted(clients[1].instances(j.id), key=lambda i: i.id)
            assert [i.end_reason for i in earlier] == ["lost"] * len(earlier), j.id
            assert last.exit_code == 0, (j.id, last.end_reason)
        assert b.health()["controller_active"]
        assert_no_gpu_shared(clients[1], [j.id for j in jobs])
        assert b.client(TOKENS["admin"]).check_store().problems == []


def assert_no_gpu_shared(client: HaiClient, job_ids: list[int]) -> None:
    """No two instances ever held the same GPU at the same time."""
    spans: dict[tuple[str, int], list[tuple[float, float, int]]] = {}
    for job_id in job_ids:
        for inst in client.instances(job_id):
            if inst.started_at is None:
                continue
            end = ts(inst.ended_at) if inst.ended_at else time.time()
            for w in inst.placement:
                for g in w.gpus:
                    spans.setdefault((w.node, g), []).append((ts(inst.started_at), end, inst.id))
    for gpu, intervals in spans.items():
        intervals.sort()
        for (_, end, a), (start, _, b) in itertools.pairwise(intervals):
            assert start >= end, f"instances {a} and {b} overlap on {gpu}"


TWO_NODES = TEST_CONFIG.replace(
    "[[resource_packages]]",
    '[[nodes]]\nname = "node2"\ngpu_type = "V100"\ngpus = 8\ncpus = 64\nmemory_gb = 512\n\n'
    "[[resource_packages]]",
    1,
)


def test_distributed_job_runs_two_workers_on_two_virtual_nodes(tmp_path: Path, code: Path) -> None:
    with start_server(tmp_path / "home", TWO_NODES) as s, s.client(TOKENS["dave"]) as c:
        spec = DistributedJobSpec(
            task_name="hvd", code_path=str(code), cmd="python3 ranks.py", workers=2, worker_resource_pkg=457
        )
        job = c.submit(spec)
        done = wait_state(c, job.id, "SUCCEEDED", "FAILED", timeout=30)
        assert done.state == "SUCCEEDED", done.reason
        (inst,) = c.instances(job.id)
        assert done.gpus == 16
        assert sorted(p.node for p in inst.placement) == ["node1", "node2"]
        model = s.home / "jobs" / str(job.id) / "model"
        # One process per GPU (the default for distributed jobs): 2 workers x 8 GPUs = 16 ranks.
        ranks = [read_json(model / f"rank-{r}.json") for r in range(16)]
        assert [(r["RANK"], r["HOROVOD_RANK"], r["WORLD_SIZE"]) for r in ranks] == [
            (str(r), str(r), "16") for r in range(16)
        ]
        assert [r["LOCAL_RANK"] for r in ranks] == [str(r % 8) for r in range(16)]
        assert {r["CUDA_VISIBLE_DEVICES"] for r in ranks} == {"0,1,2,3,4,5,6,7"}


def test_200_submissions_from_20_threads_lose_and_duplicate_nothing(server: LiveServer, code: Path) -> None:
    errors: list[BaseException] = []
    ids: list[int] = []
    lock = threading.Lock()
    peak = {"gpus": 0}
    stop = threading.Event()

    def submitter(t: int) -> None:
        try:
            with server.client(TOKENS[("alice", "bob", "dave")[t % 3]]) as c:
                for i in range(10):
                    spec: Any = (
                        std(code, "python3 -c 'import time; time.sleep(0.05)'", 454)
                        if i % 2
                        else CpuJobSpec(task_name="cpu", code_path=str(code), cmd="true", cpus=2)
                    )
                    job = c.submit(spec, client_key=f"t{t}-{i}")
                    again = c.submit(spec, client_key=f"t{t}-{i}")  # a client retry
                    assert again.id == job.id
                    with lock:
                        ids.append(job.id)
        except BaseException as e:
            errors.append(e)

    def watch_nodes() -> None:
        with server.client() as c:
            while not stop.is_set():
                used = sum(len(n.holders) for n in c.nodes())
                peak["gpus"] = max(peak["gpus"], used)
                time.sleep(0.05)

    watcher = threading.Thread(target=watch_nodes)
    watcher.start()
    threads = [threading.Thread(target=submitter, args=(t,)) for t in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert len(ids) == 200 and len(set(ids)) == 200
    with server.client() as admin:
        all_jobs = admin.jobs(all=True, limit=1000)
        assert len(all_jobs) == 200
        assert len({j.client_key for j in all_jobs}) == 200
        deadline = time.monotonic() + 120
        while any(j.state not in TERMINAL for j in admin.jobs(all=True, limit=1000)):
            assert time.monotonic() < deadline, "jobs did not finish"
            time.sleep(0.5)
        stop.set()
        watcher.join()
        final = admin.jobs(all=True, limit=1000)
        assert {j.state for j in final} == {"SUCCEEDED"}
        assert all(j.instances == 1 for j in final)
        assert 1 <= peak["gpus"] <= 8
        assert_no_gpu_shared(admin, [j.id for j in final if j.gpus])


def test_log_follow_streams_until_the_instance_ends(live_server: LiveServer, code: Path) -> None:
    with live_server.client(TOKENS["bob"]) as c:
        cmd = "for i in 1 2 3; do echo line $i; sleep 0.3; done"
        job = c.submit(std(code, cmd, 454))
        wait_state(c, job.id, "RUNNING", "SUCCEEDED")
        (inst,) = c.instances(job.id)
        text = "".join(c.follow_log(inst.id))
        assert text.splitlines() == ["line 1", "line 2", "line 3"]
        assert c.log(inst.id, tail=1) == "line 3\n"
        with pytest.raises(HaiError) as other:
            live_server.client(TOKENS["dave"]).log(inst.id)
        assert other.value.status == 404


def test_health_is_open_and_api_needs_a_token(live_server: LiveServer) -> None:
    assert httpx.get(f"{live_server.url}/health").json()["controller_active"] is True
    r = httpx.get(f"{live_server.url}/api/v1/jobs")
    assert r.status_code == 401 and r.json()["field"] == "Authorization"
