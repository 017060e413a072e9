"""The job credential: every instance's token for `hai` inside the job, acting for the job's owner.

In-process (both stores): what the credential may and may not ask, and when it stops working. Against
a real `hai serve` with the real CLI inside real local jobs: the platform document's CPU→GPU pattern,
the quota, the 401 after the run, and the token's text nowhere a user or an admin looks. On docker
(the docker tier): a container reaches the server at `[server] job_url` with its credential.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from hai_airflow.client import HaiClient, HaiError, resolve_connection
from hai_airflow.server.jobs.auth import JOB_ROUTES
from hai_airflow.server.store.tables import EventRow, InstanceRow, JobRow
from hai_airflow.server.store.tokens import token_hash
from hai_airflow.spec import CpuJobSpec, StandaloneJobSpec
from tests.security.test_races import wait_ended
from tests.server.conftest import Api
from tests.support.live_server import TEST_CONFIG, TOKENS, LiveServer, free_port, start_server

HAI = [sys.executable, "-c", "from hai_airflow.cli.main import app; app(prog_name='hai')"]


# ---- in-process: what it may ask ------------------------------------------------------------------


def credential_file(api: Api, job_id: int) -> Path:
    """The credential file of the job's current instance (read here as root, or as the server's user)."""
    job = api.job(job_id)
    (inst,) = [i for i in api.get(f"/jobs/{job_id}/instances").json() if i["ended_at"] is None]
    return api.ctx.home / "jobs" / str(job["id"]) / "instances" / str(inst["id"]) / "hai-token"


def running_job(api: Api, user: str, cmd: str = "sleep 60") -> tuple[int, str]:
    """A CPU job of `user` running `cmd`, and its credential as the job reads it."""
    job = api.submit(user, mode="cpu", cmd=cmd)
    api.until_state(job["id"], "RUNNING")
    path = credential_file(api, job["id"])
    api.until(path.exists, what="the credential file")
    return job["id"], path.read_text().strip()


def as_job(api: Api, token: str, method: str, path: str, **kw: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}", **kw.pop("headers", {})}
    url = path if path.startswith("/metrics") else f"/api/v1{path}"
    return api.http.request(method, url, headers=headers, **kw)


def test_every_route_a_credential_may_use_is_a_route_of_the_api(api: Api) -> None:
    routes = {(m, r.path) for r in api.http.app.routes for m in getattr(r, "methods", ())}
    assert routes >= JOB_ROUTES, sorted(JOB_ROUTES - routes)


def test_each_run_gets_a_credential_the_store_keeps_only_hashed_in_a_file_of_its_own(api: Api) -> None:
    api.with_controller()
    job_id, token = running_job(api, "alice", 'test -r "$HAI_TOKEN_FILE" && echo "$HAI_TOKEN_FILE"; sleep 60')
    path = credential_file(api, job_id)
    info = path.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid()
    assert len(token) >= 32
    with api.ctx.store.read() as s:
        (inst,) = s.scalars(select(InstanceRow).where(InstanceRow.job_id == job_id))
        assert inst.credential_hash == token_hash(api.ctx.store.token_key, token)
        stored = [j.spec for j in s.scalars(select(JobRow))] + [e.reason for e in s.scalars(select(EventRow))]
    assert not any(token in text for text in stored)
    api.until(lambda: str(path) in api.get(f"/instances/{inst.id}/log").text, what="the job's log")
    assert token not in api.get(f"/instances/{inst.id}/log").text


def test_it_acts_as_its_owner_with_a_users_rights(api: Api) -> None:
    api.with_controller()
    bobs = api.submit("bob", cmd="sleep 60", max_schedule=0)["id"]
    job_id, token = running_job(api, "alice")
    assert as_job(api, token, "GET", "/whoami").json() == {
        "user": "alice", "group": "vision", "role": "user", "admin_of": [], "via": f"job {job_id}"
    }  # fmt: skip
    made = as_job(api, token, "POST", "/jobs", json={"spec": api.spec(cmd="sleep 60", task_name="next")})
    assert made.status_code == 201, made.text
    assert (made.json()["user"], made.json()["submitted_via"]) == ("alice", f"job {job_id}")
    events = api.job(made.json()["id"], "alice")["events"]
    assert events[0]["reason"].endswith(f"submitted by alice via job {job_id}")
    # Only the owner's tasks: another user's is not there at all.
    listed = as_job(api, token, "GET", "/jobs", params={"all": "true"}).json()
    assert {j["user"] for j in listed} == {"alice"}
    assert as_job(api, token, "GET", f"/jobs/{bobs}").status_code == 404
    assert as_job(api, token, "GET", f"/jobs/{bobs}/wait", params={"timeout": 0}).status_code == 404
    assert as_job(api, token, "POST", f"/jobs/{bobs}/cancel").status_code == 404
    assert as_job(api, token, "GET", "/jobs", params={"user": "bob"}).status_code == 403
    # Its owner's other task: waited for, cancelled, with the job named in the event.
    mine = made.json()["id"]
    assert as_job(api, token, "GET", f"/jobs/{mine}/wait", params={"timeout": 0}).status_code == 200
    cancelled = as_job(api, token, "POST", f"/jobs/{mine}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    last = api.job(mine, "alice")["events"][-1]
    assert (last["kind"], last["reason"]) == ("cancel_requested", f"cancel asked by alice (via job {job_id})")


ADMIN_ACTIONS = [
    ("PUT", "/quotas/users/alice", {"json": {"gpus": 100}}),
    ("PUT", "/quotas/groups/vision", {"json": {"gpus": 100}}),
    ("POST", "/nodes/node1/drain", {"json": {"reason": "mine now"}}),
    ("GET", "/admin/check", {}),
    ("POST", "/jobs/{other}/suspend", {}),
    ("POST", "/jobs/{other}/hold", {}),
    ("POST", "/jobs/{other}/promote", {"json": {"max_schedule": 24}}),
    ("POST", "/jobs/{own}/hold", {}),
    ("GET", "/jobs/{own}/files", {}),
    ("GET", "/usage", {}),
    ("GET", "/metrics", {}),
]


@pytest.mark.parametrize("owner", ["admin", "carol", "alice"])
def test_it_does_nothing_an_admin_does_even_for_an_admin(api: Api, owner: str) -> None:
    """403 naming the credential for every admin action, whoever owns the job (a platform admin,
    a group admin, a user); a header acting for someone else too; others' tasks stay invisible."""
    api.with_controller()
    other = api.submit("bob", cmd="sleep 60")["id"]
    job_id, token = running_job(api, owner)
    for method, path, kw in ADMIN_ACTIONS:
        r = as_job(api, token, method, path.format(other=other, own=job_id), **kw)
        assert r.status_code == 403, (method, path, r.text)
        assert f"the credential of task {job_id} may not" in r.json()["error"], r.text
        if owner != "alice":
            assert f"though its owner {owner} is a" in r.json()["error"]
    r = as_job(api, token, "GET", "/jobs", headers={"X-Hai-On-Behalf-Of": "bob"})
    assert r.status_code == 403 and "acts only for its owner" in r.json()["error"]
    assert as_job(api, token, "GET", f"/jobs/{other}").status_code == 404
    assert {j["user"] for j in as_job(api, token, "GET", "/jobs", params={"all": "true"}).json()} == {owner}
    # Nothing changed: the owner's own token still does what it always did.
    assert api.get("/quotas", "admin").status_code == 200
    assert {n["state"] for n in api.get("/nodes", "admin").json()} == {"ready"}


def test_it_stops_when_the_run_ends_and_when_the_job_is_cancelled(api: Api) -> None:
    api.with_controller()
    done, done_token = running_job(api, "alice", "sleep 0.5")
    cancelled, cancelled_token = running_job(api, "alice", "trap '' TERM; sleep 60")
    assert as_job(api, cancelled_token, "GET", "/jobs").status_code == 200
    # At once: the instance is still stopping in its grace, the credential is refused already.
    assert api.post(f"/jobs/{cancelled}/cancel", "alice").status_code == 200
    r = as_job(api, cancelled_token, "GET", "/jobs")
    assert r.status_code == 401 and f"task {cancelled} was cancelled" in r.json()["error"], r.text
    api.until_state(done, "SUCCEEDED")
    r = as_job(api, done_token, "POST", "/jobs", json={"spec": api.spec()})
    assert r.status_code == 401 and "ended" in r.json()["error"], r.text
    assert as_job(api, "not-a-token-at-all", "GET", "/jobs").json()["error"] == "unknown API token"


# ---- the client: HAI_TOKEN_FILE ---------------------------------------------------------------


def test_the_client_reads_hai_token_file_when_hai_token_is_unset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HAI_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "token").write_text("home-token\n")
    (tmp_path / "job-token").write_text("job-token\n")
    monkeypatch.delenv("HAI_TOKEN", raising=False)
    monkeypatch.setenv("HAI_TOKEN_FILE", str(tmp_path / "job-token"))
    assert resolve_connection().token == "job-token"
    assert resolve_connection(token="flag").token == "flag"
    monkeypatch.setenv("HAI_TOKEN", "env-token")
    assert resolve_connection().token == "env-token"
    monkeypatch.delenv("HAI_TOKEN")
    monkeypatch.setenv("HAI_TOKEN_FILE", str(tmp_path / "gone"))
    with pytest.raises(HaiError, match="cannot read the token file") as refused:
        resolve_connection()
    assert refused.value.field == "HAI_TOKEN_FILE"
    monkeypatch.delenv("HAI_TOKEN_FILE")
    assert resolve_connection().token == "home-token"


# ---- a real server, the real CLI inside real jobs -------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with start_server(tmp_path_factory.mktemp("credential") / "home", TEST_CONFIG) as server:
        yield server


@pytest.fixture
def code(tmp_path: Path) -> Path:
    path = tmp_path / "code"
    path.mkdir()
    (path / "prep.py").write_text("open('data.txt', 'w').write('prepared\\n')\nprint('prepared')\n")
    (path / "train.py").write_text("print('trained on', open('data.txt').read().strip())\n")
    return path


def hai(server: LiveServer, user: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI outside any job, as `user`."""
    env = {**os.environ, "HAI_SERVER": server.url, "HAI_TOKEN": TOKENS[user], "HAI_HOME": str(server.home)}
    env.pop("HAI_TOKEN_FILE", None)
    return subprocess.run([*HAI, *args], env=env, capture_output=True, text=True, timeout=60)


def token_of_first_run(server: LiveServer, job_id: int) -> str:
    (inst,) = server.client().instances(job_id)
    return (server.home / "jobs" / str(job_id) / "instances" / str(inst.id) / "hai-token").read_text().strip()


DOCUMENT = (
    "env; python3 prep.py; "
    'hai submit standalone --name=gpu-job --gpus=1 --gpu-type=v100 --code-dir="$PWD" "python3 train.py"'
)
"""The platform document's CPU job command (扩展2), with `hai` from the job's PATH."""


def test_a_cpu_job_submits_the_gpu_job_as_its_owner_and_its_credential_then_ends(
    live: LiveServer, code: Path
) -> None:
    with live.client("alice-token") as alice:
        cpu = alice.submit(CpuJobSpec(task_name="cpu-job", code_path=str(code), cmd=DOCUMENT))
        assert wait_ended(alice, cpu.id, timeout=90).state == "SUCCEEDED", alice.log(
            alice.instances(cpu.id)[0].id
        )
        log = alice.log(alice.instances(cpu.id)[0].id)
        assert "prepared" in log and "created task" in log
        (gpu,) = [j for j in alice.jobs() if j.task_name == "gpu-job" and j.submitted_via == f"job {cpu.id}"]
        assert wait_ended(alice, gpu.id, timeout=90).state == "SUCCEEDED"
        assert alice.log(alice.instances(gpu.id)[0].id) == "trained on prepared\n"
    assert (gpu.user, gpu.group, gpu.spec["mode"]) == ("alice", "vision", "standalone")
    shown = hai(live, "alice", "task", str(gpu.id))
    assert shown.returncode == 0, shown.stderr
    assert any(line.split() == ["submitted", "via", "job", str(cpu.id)] for line in shown.stdout.splitlines())
    # The run is over: its credential is refused, by the client as by the CLI.
    token = token_of_first_run(live, cpu.id)
    with HaiClient(server=live.url, token=token) as job, pytest.raises(HaiError) as refused:
        job.jobs()
    assert refused.value.status == 401 and f"task {cpu.id} ended" in refused.value.error
    (inst,) = live.client().instances(cpu.id)
    env = {**os.environ, "HAI_SERVER": live.url, "HAI_HOME": str(live.home)}
    env["HAI_TOKEN_FILE"] = str(live.home / "jobs" / str(cpu.id) / "instances" / str(inst.id) / "hai-token")
    env.pop("HAI_TOKEN", None)
    late = subprocess.run([*HAI, "task"], env=env, capture_output=True, text=True, timeout=60)
    assert late.returncode == 1 and "this job credential no longer acts" in late.stderr, late.stderr


def test_beyond_the_quota_a_high_priority_submit_from_inside_the_job_is_refused(
    live: LiveServer, code: Path
) -> None:
    with live.client("alice-token") as alice:
        # alice's whole quota (8 GPUs of high priority), held while the CPU job asks for one more.
        big = alice.submit(StandaloneJobSpec(task_name="big", code_path=str(code), cmd="sleep 120",
                                             resource_pkg=457, max_schedule=24))  # fmt: skip
        try:
            cmd = (
                "hai submit standalone --name=urgent --gpus=1 --gpu-type=v100 --max-schedule=24 "
                '--code-dir="$PWD" "true"; echo "hai exited $?"'
            )
            cpu = alice.submit(CpuJobSpec(task_name="asks-high", code_path=str(code), cmd=cmd))
            assert wait_ended(alice, cpu.id, timeout=90).state == "SUCCEEDED"
            log = alice.log(alice.instances(cpu.id)[0].id)
            assert "high priority refused: over your high-priority quota" in log, log
            assert "hai exited 1" in log
            assert not [j for j in alice.jobs(all=True) if j.task_name == "urgent"]
        finally:
            alice.cancel(big.id)


def test_the_token_is_nowhere_a_user_or_an_admin_looks(live: LiveServer, code: Path) -> None:
    with live.client("alice-token") as alice:
        cmd = f'env; cat "$HAI_TOKEN_FILE" > /dev/null; {DOCUMENT.removeprefix("env; ")}'
        cpu = alice.submit(CpuJobSpec(task_name="cpu-job", code_path=str(code), cmd=cmd))
        assert wait_ended(alice, cpu.id, timeout=90).state == "SUCCEEDED"
        (gpu,) = [j for j in alice.jobs() if j.submitted_via == f"job {cpu.id}"]
        wait_ended(alice, gpu.id, timeout=90)
    token = token_of_first_run(live, cpu.id)
    assert len(token) >= 32
    seen: dict[str, str] = {}
    for job_id in (cpu.id, gpu.id):
        for user in ("alice", "admin"):
            shown = hai(live, user, "task", str(job_id), "-o", "yaml")
            assert shown.returncode == 0, shown.stderr
            seen[f"hai task {job_id} -o yaml as {user}"] = shown.stdout
        seen[f"hai log {job_id}"] = hai(live, "alice", "log", str(job_id)).stdout
        admin = {"Authorization": f"Bearer {TOKENS['admin']}"}
        seen[f"/ui/jobs/{job_id}"] = httpx.get(f"{live.url}/ui/jobs/{job_id}", headers=admin).text
        detail = httpx.get(f"{live.url}/api/v1/jobs/{job_id}", headers=admin)
        seen[f"GET /jobs/{job_id} (its events)"] = detail.text
    seen["/metrics"] = httpx.get(f"{live.url}/metrics", headers=admin).text
    seen["/ui"] = httpx.get(f"{live.url}/ui/", headers=admin).text
    seen["the server's log"] = live.log_text()
    seen["the store"] = (live.home / "hai.db").read_bytes().decode("latin-1")
    assert "HAI_TOKEN_FILE=" in seen[f"hai log {cpu.id}"]  # the job printed its environment
    assert f"job {cpu.id}" in seen[f"/ui/jobs/{gpu.id}"]
    leaks = [where for where, text in seen.items() if token in text]
    assert leaks == []


# ---- docker: the container reaches [server] job_url -----------------------------------------------


@pytest.mark.docker
@pytest.mark.slow
def test_a_container_reaches_job_url_and_submits_as_its_owner(
    docker_engine: Any, busybox_image: str, tmp_path: Path
) -> None:
    """busybox's wget as the job's `hai`: HAI_SERVER is job_url (the host's network), the token file is
    the work dir's, bind-mounted; the container's environment holds its path, never the token."""
    port, owner = free_port(), f"hai-test-{uuid.uuid4().hex[:8]}"
    options = (
        f'[backend]\ndocker_host = "{docker_engine.url}"\nowner = "{owner}"\nvirtual_gpus = true\n'
        'network = "host"\n'
    )
    config = TEST_CONFIG.replace(
        'backend = "local"', f'backend = "docker"\njob_url = "http://127.0.0.1:{port}"'
    ).replace("\n[[nodes]]", f"\n{options}\n[[nodes]]", 1)
    code = tmp_path / "code"
    code.mkdir()
    next_spec = {
        "mode": "cpu",
        "task_name": "next",
        "code_path": str(code),
        "image": busybox_image,
        "cmd": "true",
    }
    body = json.dumps({"spec": next_spec})
    (code / "next.json").write_text(body)
    cmd = (
        'auth="Authorization: Bearer $(cat "$HAI_TOKEN_FILE")"; '
        'wget -q -O - --header "$auth" "$HAI_SERVER/api/v1/whoami"; echo; '
        'wget -q -O - --header "$auth" --header "Content-Type: application/json" '
        '--post-file next.json "$HAI_SERVER/api/v1/jobs" > /dev/null && echo submitted; '
        'wget -q -O - --header "$auth" "$HAI_SERVER/api/v1/quotas" || echo "quotas refused"'
    )
    live = LiveServer(tmp_path / "home", config, port=port).start()
    try:
        with live.client("dave-token") as dave:
            job = dave.submit(
                CpuJobSpec(task_name="in-docker", code_path=str(code), cmd=cmd, image=busybox_image)
            )
            assert wait_ended(dave, job.id, timeout=90).state == "SUCCEEDED", live.log_text()[-2000:]
            log = dave.log(dave.instances(job.id)[0].id)
            assert '"user":"dave"' in log and f'"via":"job {job.id}"' in log, log
            assert "submitted" in log and "quotas refused" in log, log
            (made,) = [j for j in dave.jobs() if j.task_name == "next"]
            assert (made.user, made.submitted_via) == ("dave", f"job {job.id}")
            wait_ended(dave, made.id, timeout=90)
        token = token_of_first_run(live, job.id)
        assert token not in log
    finally:
        live.close()
        for c in docker_engine.client.containers.list(all=True, filters={"label": f"hai.owner={owner}"}):
            c.remove(force=True)
