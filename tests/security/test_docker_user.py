"""Docker containers and git clones run as the job's account (a real engine): never root with the
default capabilities on the NAS, never the image's USER, and a clone that hangs holds no other job."""

from __future__ import annotations

import dataclasses
import io
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hai_airflow.backends.common.base import Exit, Handle, Launch, StartError
from hai_airflow.backends.common.gitcode import CLONE_FAILED_EXIT
from tests.support.accounts import Account, made_account
from tests.support.docker_engine import DockerJobs, Engine
from tests.support.exits import ended_within
from tests.support.gitrepo import bare_origin

pytestmark = [pytest.mark.docker, pytest.mark.slow]

RUN_AS = "{user}"


@pytest.fixture(scope="module")
def account() -> Iterator[Account]:
    with made_account("haidk") as made:
        yield made


@pytest.fixture
def jobs(docker_engine: Engine, busybox_image: str, open_dir: Path) -> Iterator[DockerJobs]:
    j = DockerJobs(docker_engine, open_dir, busybox_image)
    try:
        yield j
    finally:
        j.cleanup()


@pytest.fixture
def nas(open_dir: Path, account: Account) -> Path:
    """The account's own directory on the "NAS": its code lives here."""
    path = open_dir / "nas" / account.name
    path.mkdir(parents=True)
    os.chown(path, account.uid, account.gid)
    return path


def as_job_of(launch: Launch, account: Account, **job: Any) -> Launch:
    """The launch of a job owned by `account` (the owner names the OS account with run_as "{user}")."""
    return dataclasses.replace(launch, job=dataclasses.replace(launch.job, user=account.name, **job))


def lines_of(log: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in log.splitlines() if "=" in line)


def git_processes(port: str) -> str:
    return subprocess.run(["pgrep", "-f", f"127.0.0.1:{port}"], capture_output=True, text=True).stdout.strip()


def user_image(engine: Engine, base: str, user: str) -> str:
    """`base` with `USER user` in its Dockerfile, built by the engine from the local image (no registry)."""
    tag = f"{base.split(':')[0]}-user-{user}:{base.split(':')[1]}"
    dockerfile = f"FROM {base}\nUSER {user}\n".encode()
    engine.client.images.build(fileobj=io.BytesIO(dockerfile), tag=tag, rm=True)  # type: ignore[attr-defined]
    return tag


# ---- the container's account and privileges -------------------------------------------------------

PROBE = (
    'echo "uid=$(id -u)"; echo "gid=$(id -g)"; echo "groups=$(id -G)"; '
    "grep -E '^(CapEff|NoNewPrivs):' /proc/self/status | tr -d ' \\t' | tr ':' '='; "
    'echo "home=$HOME"; echo x > "$HOME/scratch" && echo "home_writable=yes"; '
    'echo x > /tmp/t && echo "tmp_writable=yes"; '
    "echo '#!/bin/sh' > planted && chmod 4755 planted && echo \"setuid=yes\"; "
    'chown 0:0 planted 2>/dev/null && echo "chown_root=yes" || echo "chown_root=no"'
)


def test_a_container_runs_as_the_jobs_account_without_capabilities(
    jobs: DockerJobs, account: Account, nas: Path
) -> None:
    """Finding 1: no capabilities, no privilege gain, the account's own groups; a setuid file it plants
    on the bind-mounted NAS is its own, never root's."""
    backend = jobs.new_backend(run_as=RUN_AS, pids_limit=256)
    launch = as_job_of(jobs.launch(PROBE, code_path=str(nas)), account)
    backend.start(launch)
    (container,) = jobs.containers(launch.instance_id)
    host = container.attrs["HostConfig"]
    assert container.attrs["Config"]["User"] == f"{account.uid}:{account.gid}"
    assert host["GroupAdd"] == [str(account.extra_gid)]
    assert host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["PidsLimit"] == 256
    assert "/tmp" in host["Tmpfs"]
    ended = ended_within(backend, launch.instance_id, 30)
    log = launch.log_path.read_text()
    assert ended.exit_code == 0, log
    seen = lines_of(log)
    assert (seen["uid"], seen["gid"]) == (str(account.uid), str(account.gid)), log
    assert str(account.extra_gid) in seen["groups"].split()
    assert seen["CapEff"] == "0000000000000000" and seen["NoNewPrivs"] == "1", log
    assert seen["home"] == str(launch.work_dir) and seen["home_writable"] == "yes"
    assert seen["tmp_writable"] == "yes"
    assert seen["setuid"] == "yes" and seen["chown_root"] == "no", log
    planted = (nas / "planted").stat()
    assert planted.st_uid == account.uid and planted.st_uid != 0
    assert planted.st_mode & stat.S_ISUID  # setuid to the account itself: it gains nobody else's rights
    work = launch.work_dir.stat()
    assert (work.st_uid, stat.S_IMODE(work.st_mode)) == (account.uid, 0o700)
    assert (launch.work_dir / "scratch").stat().st_uid == account.uid


@pytest.mark.parametrize("image_user", [None, "root", "nobody"], ids=["no USER", "USER root", "USER nobody"])
def test_the_images_user_never_decides_whom_the_job_runs_as(
    jobs: DockerJobs, account: Account, nas: Path, image_user: str | None
) -> None:
    image = jobs.image if image_user is None else user_image(jobs.engine, jobs.image, image_user)
    backend = jobs.new_backend(run_as=RUN_AS)
    launch = as_job_of(
        jobs.launch('echo "uid=$(id -u) gid=$(id -g)"', code_path=str(nas), image=image), account
    )
    backend.start(launch)
    ended = ended_within(backend, launch.instance_id, 30)
    log = launch.log_path.read_text()
    assert ended.exit_code == 0, log
    assert log == f"uid={account.uid} gid={account.gid}\n"


def test_without_run_as_the_container_is_the_servers_account_not_the_images(jobs: DockerJobs) -> None:
    """Unset run_as: the server's own uid:gid (root here, without capabilities), never the image's USER."""
    image = user_image(jobs.engine, jobs.image, "nobody")
    launch = jobs.launch("echo \"uid=$(id -u) gid=$(id -g)\"; grep '^CapEff:' /proc/self/status", image=image)
    jobs.backend.start(launch)
    ended = ended_within(jobs.backend, launch.instance_id, 30)
    log = launch.log_path.read_text()
    assert ended.exit_code == 0, log
    assert f"uid={os.getuid()} gid={os.getgid()}\n" in log
    assert "CapEff:\t0000000000000000" in log


# ---- the model dir ---------------------------------------------------------------------------------


def test_a_missing_model_dir_is_made_by_the_jobs_account(
    jobs: DockerJobs, account: Account, nas: Path
) -> None:
    """Finding 3: the backend makes a model dir that does not exist yet as the job's account, and the
    job writes its checkpoints there."""
    model = nas / "models" / "run-1"
    backend = jobs.new_backend(run_as=RUN_AS)
    launch = as_job_of(
        jobs.launch('echo x > "$HAI_MODEL_DIR/model.ckpt"', code_path=str(nas)), account, model_dir=model
    )
    backend.start(launch)
    ended = ended_within(backend, launch.instance_id, 30)
    assert ended.exit_code == 0, launch.log_path.read_text()
    for made in (nas / "models", model, model / "model.ckpt"):
        assert made.stat().st_uid == account.uid, made


def test_a_model_dir_the_account_may_not_make_fails_the_start(
    jobs: DockerJobs, account: Account, nas: Path, open_dir: Path
) -> None:
    """Root could make it (and the engine would, as root): the account cannot, so the start fails."""
    guarded = open_dir / "root-only"
    guarded.mkdir(mode=0o755)
    model = guarded / "models"
    backend = jobs.new_backend(run_as=RUN_AS)
    launch = as_job_of(jobs.launch("true", code_path=str(nas)), account, model_dir=model)
    with pytest.raises(StartError) as refused:
        backend.start(launch)
    assert f"spec.model_dir {model} cannot be created" in str(refused.value)
    assert "Permission denied" in str(refused.value)
    assert not model.exists()
    assert jobs.containers(launch.instance_id) == []


# ---- the git clone ---------------------------------------------------------------------------------


def test_a_clone_that_hangs_returns_at_once_delays_no_other_job_and_times_out(
    jobs: DockerJobs, account: Account, nas: Path, silent_host: str
) -> None:
    """Finding 2: start() only starts the clone; another job starts and ends meanwhile; the hung clone
    is killed after git_timeout_seconds and its instance ends saying so."""
    limit = 6
    backend = jobs.new_backend(run_as=RUN_AS, git_timeout_seconds=limit)
    hung = as_job_of(jobs.launch("true", code_src="git", code_path=silent_host), account)
    hung = dataclasses.replace(hung, git_schemes=("https", "http"))
    began = time.monotonic()
    handle = backend.start(hung)
    assert time.monotonic() - began < 2
    assert jobs.containers(hung.instance_id) == []  # created only once the clone has succeeded
    assert handle.data["clone"]["pid"] > 0

    other = as_job_of(jobs.launch("echo other-ran", code_path=str(nas)), account)
    asked = time.monotonic()
    backend.start(other)
    assert time.monotonic() - asked < 2
    exits: dict[int, Exit] = {}
    while other.instance_id not in exits:
        assert time.monotonic() - asked < limit - 1, (
            f"the other job did not end before the clone's limit: {exits}"
        )
        exits |= {e.instance_id: e for e in backend.poll()}
        time.sleep(0.05)
    assert exits[other.instance_id].exit_code == 0
    assert other.log_path.read_text() == "other-ran\n"
    assert hung.instance_id not in exits  # still cloning

    while hung.instance_id not in exits:
        assert time.monotonic() - began < limit + 15, "the hung clone was never ended"
        exits |= {e.instance_id: e for e in backend.poll()}
        time.sleep(0.05)
    took = time.monotonic() - began
    ended = exits[hung.instance_id]
    assert limit <= took < limit + 10
    assert ended.exit_code == CLONE_FAILED_EXIT
    assert ended.reason == (
        f"git clone of {silent_host} failed: "
        f"it did not finish within {limit} s ([backend] git_timeout_seconds)"
    )
    assert ended.reason in backend.read_log(hung.instance_id)
    assert git_processes(silent_host.split(":")[2].split("/")[0]) == ""
    assert jobs.containers(hung.instance_id) == []


def test_a_stop_during_the_clone_ends_it_at_once(
    jobs: DockerJobs, account: Account, silent_host: str
) -> None:
    backend = jobs.new_backend(run_as=RUN_AS)
    hung = as_job_of(jobs.launch("true", code_src="git", code_path=silent_host), account)
    backend.start(dataclasses.replace(hung, git_schemes=("http",)))
    time.sleep(0.5)
    assert backend.poll() == []
    asked = time.monotonic()
    backend.stop(hung.instance_id, grace_seconds=30, notice=True)
    ended = ended_within(backend, hung.instance_id, 5)
    assert time.monotonic() - asked < 3
    assert (ended.exit_code, ended.reason) == (137, "stopped by the platform during its git clone")
    assert git_processes(silent_host.split(":")[2].split("/")[0]) == ""
    assert jobs.containers(hung.instance_id) == []


def test_a_restart_during_the_clone_reports_the_instance_lost_and_ends_the_clone(
    jobs: DockerJobs, account: Account, silent_host: str
) -> None:
    backend = jobs.new_backend(run_as=RUN_AS)
    hung = as_job_of(jobs.launch("true", code_src="git", code_path=silent_host), account)
    handle = backend.start(dataclasses.replace(hung, git_schemes=("http",)))
    backend.close()  # the server stops; its clone goes on
    port = silent_host.split(":")[2].split("/")[0]
    assert git_processes(port) != ""
    restarted = jobs.new_backend(run_as=RUN_AS)
    (lost,) = restarted.reattach([Handle(handle.instance_id, dict(handle.data))])
    assert (lost.instance_id, lost.exit_code, lost.lost) == (hung.instance_id, None, True)
    assert (
        lost.reason
        == "the server restarted during its git clone, which was stopped; its containers never started"
    )
    deadline = time.monotonic() + 5
    while git_processes(port):
        assert time.monotonic() < deadline, "the clone outlived the restart"
        time.sleep(0.05)


def test_the_clone_runs_as_the_jobs_account_and_its_code_is_mounted(
    jobs: DockerJobs, account: Account, open_dir: Path
) -> None:
    """The account clones its own repository (root would need safe.directory for it): the checkout
    is the account's, and the container runs in it as the account."""
    repos = open_dir / "repos"
    repos.mkdir()
    origin = bare_origin(repos, {"main": {"train.sh": 'echo "uid=$(id -u) cwd=$(pwd)"\n'}})
    subprocess.run(["chown", "-R", f"{account.uid}:{account.gid}", str(origin)], check=True)
    origin.chmod(0o700)  # only its owner, the job's account, can read it
    backend = jobs.new_backend(run_as=RUN_AS)
    launch = as_job_of(
        jobs.launch("sh train.sh", code_src="git", code_path=str(origin), git_branch="main"), account
    )
    backend.start(launch)
    ended = ended_within(backend, launch.instance_id, 30)
    log = launch.log_path.read_text()
    assert ended.exit_code == 0, log
    checkout = launch.work_dir / "code"
    assert log == f"uid={account.uid} cwd={checkout}\n"
    assert checkout.stat().st_uid == account.uid
    assert (checkout / "train.sh").stat().st_uid == account.uid
    assert (checkout / ".git").stat().st_uid == account.uid


def test_a_failed_clone_ends_the_instance_with_gits_words_without_warnings(
    jobs: DockerJobs, account: Account, open_dir: Path
) -> None:
    repos = open_dir / "repos"
    repos.mkdir()
    origin = bare_origin(repos, {"main": {"train.sh": "true\n"}})
    subprocess.run(["chown", "-R", f"{account.uid}:{account.gid}", str(origin)], check=True)
    backend = jobs.new_backend(run_as=RUN_AS)
    launch = as_job_of(
        jobs.launch("sh train.sh", code_src="git", code_path=str(origin), git_branch="nope"), account
    )
    backend.start(launch)
    ended = ended_within(backend, launch.instance_id, 30)
    assert ended.exit_code == CLONE_FAILED_EXIT
    assert ended.reason.startswith(f"git clone of {origin} (branch nope) failed: fatal: "), ended.reason
    assert "nope" in ended.reason.split("failed: ", 1)[1]
    assert "warning" not in ended.reason.lower()
    assert jobs.containers(launch.instance_id) == []
    kept = backend.read_log(launch.instance_id)
    assert "\nwarning: " in "\n" + kept  # git warned; the reason leaves its warnings out
    assert kept.endswith(f"[hai] {ended.reason}\n")


def test_reap_ends_a_clone_whose_handle_was_never_saved(
    jobs: DockerJobs, account: Account, silent_host: str
) -> None:
    """The server died between starting the clone and saving its handle: no clone is left running."""
    backend = jobs.new_backend(run_as=RUN_AS)
    hung = as_job_of(jobs.launch("true", code_src="git", code_path=silent_host), account)
    backend.start(dataclasses.replace(hung, git_schemes=("http",)))
    backend.close()
    port = silent_host.split(":")[2].split("/")[0]
    assert git_processes(port) != ""
    jobs.new_backend(run_as=RUN_AS).reap(hung.instance_id, hung.work_dir)
    deadline = time.monotonic() + 5
    while git_processes(port):
        assert time.monotonic() < deadline, "the clone outlived the reap"
        time.sleep(0.05)
