"""Logs and notices against a live server: no planted link is followed, and big logs cost bounded memory."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hai_airflow.backends.common.log_files import TAIL_LIMIT
from hai_airflow.backends.common.procs import read_exit_file
from hai_airflow.client import HaiClient
from hai_airflow.spec import InstanceView, StandaloneJobSpec
from tests.support.docker_engine import Engine
from tests.support.docker_engine import docker_server as docker_server_on
from tests.support.live_server import TEST_CONFIG, TOKENS, LiveServer, start_server

BOB = TOKENS["bob"]
WORK = '"$(dirname "$HAI_PREEMPT_NOTICE")"'
"""The instance's work dir, as a job's shell finds it (the notice file lives there)."""
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


@pytest.fixture
def server(tmp_path: Path, store_env: dict[str, str]) -> Iterator[LiveServer]:
    with start_server(tmp_path / "home", TEST_CONFIG, store_env) as s:
        yield s


@pytest.fixture(scope="module")
def sqlite_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One server for the tests below that need no particular store: each runs jobs of its own."""
    with start_server(tmp_path_factory.mktemp("logs") / "home", TEST_CONFIG) as s:
        yield s


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file the server's user can read and no job may see through the API."""
    path = tmp_path / "secret.txt"
    path.write_text(f"TOP-SECRET-{uuid.uuid4().hex}\n")
    return path


def run(live: LiveServer, cmd: str, token: str = BOB, **spec: Any) -> InstanceView:
    """Submit `cmd` (code dir: the test's tmp dir), wait until it has ended; its only instance."""
    code = live.home.parent / "code"
    code.mkdir(exist_ok=True)
    job = StandaloneJobSpec(task_name="t", code_path=str(code), cmd=cmd, resource_pkg=454, **spec)
    with live.client(token) as c:
        job_id = c.submit(job).id
        wait_until(c, job_id, TERMINAL, timeout=60)
        (inst,) = c.instances(job_id)
        return inst


def work_dir(live: LiveServer, inst: InstanceView) -> Path:
    """Where the server keeps the instance's files (its log, its notice): the job may write there."""
    return live.home / "jobs" / str(inst.job_id) / "instances" / str(inst.id)


def wait_until(c: HaiClient, job_id: int, states: set[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (job := c.job(job_id)).state not in states:
        assert time.monotonic() < deadline, f"job {job_id} is {job.state} ({job.reason}), not {states}"
        time.sleep(0.1)


def get_log(live: LiveServer, instance_id: int, token: str = BOB, **params: Any) -> httpx.Response:
    url = f"{live.url}/api/v1/instances/{instance_id}/log"
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.get(url, params=params, headers=headers, timeout=20)


def assert_refused(resp: httpx.Response, *secrets: str) -> None:
    """The API's JSON refusal naming the instance; none of `secrets` in the answer."""
    assert resp.status_code == 409, resp.text[:500]
    body = resp.json()
    assert body["field"] == "instance_id" and "not shown" in body["error"] and body["fix"]
    for s in secrets:
        assert s not in resp.text


def assert_every_read_refused(live: LiveServer, instance_id: int, *secrets: str) -> None:
    for params in ({"tail": 0}, {"tail": 3}, {"tail": 0, "follow": "true"}, {"tail": 2, "follow": "true"}):
        assert_refused(get_log(live, instance_id, **params), *secrets)


# ---- reading: the log endpoint never follows a link a job planted --------------------------------


def test_a_log_replaced_by_a_link_to_a_secret_or_the_database_is_not_served(
    server: LiveServer, secret: Path, store_env: dict[str, str]
) -> None:
    marker = secret.read_text().strip()
    inst = run(server, f"echo before; ln -sf {shlex.quote(str(secret))} {WORK}/output.log")
    assert_every_read_refused(server, inst.id, marker)
    assert (work_dir(server, inst) / "output.log").is_symlink()  # the attack really happened
    if not store_env:
        database = server.home / "hai.db"
        inst = run(server, f"ln -sf {shlex.quote(str(database))} {WORK}/output.log")
        assert_every_read_refused(server, inst.id, "SQLite format 3")


def test_a_work_dir_replaced_by_a_link_to_another_directory_is_not_served(
    sqlite_server: LiveServer, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # A regular file with the log's name: only the link in the directory part can lead to it
    # (e.g. to another user's instance dir).
    (elsewhere / "output.log").write_text("SOMEONE-ELSES-LOG\n")
    cmd = f'w={WORK}; mv "$w" "$w.moved" && ln -s {shlex.quote(str(elsewhere))} "$w"'
    inst = run(sqlite_server, cmd)
    assert work_dir(sqlite_server, inst).is_symlink()
    assert_every_read_refused(sqlite_server, inst.id, "SOMEONE-ELSES-LOG")


def test_a_hard_link_or_a_fifo_in_place_of_the_log_is_not_served(
    sqlite_server: LiveServer, secret: Path
) -> None:
    marker = secret.read_text().strip()
    linked = run(sqlite_server, f"rm {WORK}/output.log; ln {shlex.quote(str(secret))} {WORK}/output.log")
    assert_every_read_refused(sqlite_server, linked.id, marker)
    # Opening a FIFO for reading would wait for a writer forever: the request must not hang.
    fifo = run(sqlite_server, f"rm {WORK}/output.log; mkfifo {WORK}/output.log")
    assert_every_read_refused(sqlite_server, fifo.id)


def test_a_followed_log_keeps_reading_the_file_it_opened_when_the_job_swaps_in_a_link(
    sqlite_server: LiveServer, secret: Path, tmp_path: Path
) -> None:
    marker = secret.read_text().strip()
    go = tmp_path / "go"
    cmd = (
        f"echo before; while [ ! -e {go} ]; do sleep 0.05; done; "
        f"mv {WORK}/output.log {WORK}/real.log; ln -s {shlex.quote(str(secret))} {WORK}/output.log; "
        "echo after"
    )
    code = tmp_path / "code"
    code.mkdir()
    with sqlite_server.client(BOB) as c:
        job = c.submit(StandaloneJobSpec(task_name="t", code_path=str(code), cmd=cmd, resource_pkg=454))
        wait_until(c, job.id, {"RUNNING"} | TERMINAL)
        (inst,) = c.instances(job.id)
        seen = ""
        for chunk in c.follow_log(inst.id):
            seen += chunk
            if "before" in seen:
                go.touch()
        assert seen == "before\nafter\n"
        assert marker not in seen
        assert (work_dir(sqlite_server, inst) / "output.log").is_symlink()


def test_the_exit_file_reader_never_blocks_on_a_fifo_nor_follows_a_link(tmp_path: Path) -> None:
    """The local backend's watcher reads each worker's exit file from the job-writable work dir."""
    work = tmp_path / "instances" / "7"
    work.mkdir(parents=True)
    exit_file = work / "worker0.exit"
    os.mkfifo(exit_file)
    assert read_exit_file(exit_file) is None  # and it returned: opening the FIFO did not wait
    exit_file.unlink()
    (tmp_path / "elsewhere").write_text("0\n")
    exit_file.symlink_to(tmp_path / "elsewhere")
    assert read_exit_file(exit_file) is None
    exit_file.unlink()
    exit_file.write_text("7" * 50_000_000)
    assert read_exit_file(exit_file) is None
    exit_file.write_text("75\n")
    assert read_exit_file(exit_file) == 75


# ---- writing: the notice never goes through a planted link ---------------------------------------


def plant_then_wait_for_notice(victims: tuple[Path, Path]) -> str:
    """A job's shell: links at the notice's path and at a temp name beside it, then wait for the notice."""
    notice_link, temp_link = (shlex.quote(str(v)) for v in victims)
    return (
        # SIGTERM comes with the notice; this shell waits for the notice itself.
        f'trap "" TERM; n="$HAI_PREEMPT_NOTICE"; ln -s {notice_link} "$n"; '
        f'ln -s {temp_link} "$(dirname "$n")/.$(basename "$n").tmp"; echo planted; '
        'while [ ! -f "$n" ] || [ -L "$n" ]; do sleep 0.05; done; cat "$n"; exit 75'
    )


def suspend_after_planting(live: LiveServer, cmd: str) -> InstanceView:
    """Run an elastic `cmd`; once it printed "planted", an admin suspends it; its instance once ended."""
    code = live.home.parent / "code"
    code.mkdir(exist_ok=True)
    spec = StandaloneJobSpec(
        task_name="t", code_path=str(code), cmd=cmd, resource_pkg=454, elastic=True, grace_seconds=20
    )
    with live.client(BOB) as c, live.client(TOKENS["admin"]) as admin:
        job = c.submit(spec)
        wait_until(c, job.id, {"RUNNING"}, timeout=60)
        (inst,) = c.instances(job.id)
        deadline = time.monotonic() + 30
        while "planted" not in c.log(inst.id):
            assert time.monotonic() < deadline, "the job never planted its links"
            time.sleep(0.1)
        admin.suspend(job.id)
        wait_until(c, job.id, {"SUSPENDED"} | TERMINAL, timeout=60)
        return c.instance(inst.id)


def assert_notice_delivered_and_victims_untouched(
    live: LiveServer, inst: InstanceView, victims: tuple[Path, Path]
) -> None:
    for v in victims:
        assert v.read_text() == "untouched\n", f"the server wrote through a link into {v}"
    notice = work_dir(live, inst) / "preempt-notice"
    assert notice.is_file() and not notice.is_symlink()
    assert json.loads(notice.read_text())["instance_id"] == inst.id
    assert inst.exit_code == 75  # the job saw the real notice and left as asked


def victims_in(tmp_path: Path) -> tuple[Path, Path]:
    victims = (tmp_path / "victim-notice", tmp_path / "victim-temp")
    for v in victims:
        v.write_text("untouched\n")
    return victims


def test_the_notice_is_written_without_following_links_the_job_planted(
    sqlite_server: LiveServer, tmp_path: Path
) -> None:
    victims = victims_in(tmp_path)
    inst = suspend_after_planting(sqlite_server, plant_then_wait_for_notice(victims))
    assert_notice_delivered_and_victims_untouched(sqlite_server, inst, victims)


# ---- size: linear tails and bounded memory -------------------------------------------------------


def proc_field(pid: int, name: str, field: str) -> int:
    """A number from /proc/PID/NAME ("io": bytes, "status": kB values)."""
    for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == field:
            return int(value.split()[0])
    raise KeyError(field)


def test_the_tail_of_a_40_mb_single_line_log_reads_only_its_end(sqlite_server: LiveServer) -> None:
    size = 40_000_000
    inst = run(sqlite_server, f"head -c {size} /dev/zero | tr '\\0' x")
    assert (work_dir(sqlite_server, inst) / "output.log").stat().st_size == size
    pid = sqlite_server.pid
    assert pid is not None
    read_before = proc_field(pid, "io", "rchar")
    started = time.monotonic()
    resp = get_log(sqlite_server, inst.id, tail=1)
    took = time.monotonic() - started
    read = proc_field(pid, "io", "rchar") - read_before
    assert resp.status_code == 200
    note, _, line = resp.text.partition("\n")
    assert note.startswith("[hai] these lines are longer than") and "tail=0 streams the whole log" in note
    assert line == "x" * TAIL_LIMIT
    # What the server read for it (the store's reads included): the tail's limit, not the file.
    assert read < 3 * TAIL_LIMIT, f"the server read {read} bytes for tail=1"
    assert took < 5, f"tail=1 took {took:.1f} s"
    tail3 = get_log(sqlite_server, inst.id, tail=3)
    assert tail3.text.partition("\n")[2] == "x" * TAIL_LIMIT


def test_tail_0_streams_a_200_mb_log_whole_in_bounded_memory(sqlite_server: LiveServer) -> None:
    size = 200_000_000
    inst = run(sqlite_server, f"yes 'line of the log, with ünïcode' | head -c {size}")
    log = work_dir(sqlite_server, inst) / "output.log"
    assert log.stat().st_size == size
    expected = hashlib.sha256()
    with open(log, "rb") as f:
        while block := f.read(1 << 20):
            expected.update(block)
    pid = sqlite_server.pid
    assert pid is not None
    peak_before_kb = proc_field(pid, "status", "VmHWM")
    got, received = hashlib.sha256(), 0
    url = f"{sqlite_server.url}/api/v1/instances/{inst.id}/log"
    with httpx.stream("GET", url, params={"tail": 0}, headers={"Authorization": f"Bearer {BOB}"}) as resp:
        assert resp.status_code == 200
        for block in resp.iter_bytes():
            got.update(block)
            received += len(block)
    grown_mb = (proc_field(pid, "status", "VmHWM") - peak_before_kb) / 1024
    assert received == size and got.hexdigest() == expected.hexdigest()
    assert grown_mb < 64, f"the server's peak memory grew by {grown_mb:.0f} MB while streaming 200 MB"
    log.unlink()


# ---- the docker backend: the kept log and the notice ---------------------------------------------


@pytest.fixture(scope="module")
def docker_server(docker_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with docker_server_on(docker_engine, tmp_path_factory.mktemp("docker") / "home") as (live, _):
        yield live


@pytest.mark.docker
@pytest.mark.slow
def test_docker_keeps_the_final_log_without_following_a_planted_link(
    docker_server: LiveServer, busybox_image: str, tmp_path: Path
) -> None:
    victim = tmp_path / "victim-log"
    victim.write_text("untouched\n")
    cmd = f"echo from the container; ln -s {shlex.quote(str(victim))} {WORK}/output.log"
    inst = run(docker_server, cmd, image=busybox_image)
    assert inst.exit_code == 0
    assert victim.read_text() == "untouched\n", "the server wrote the container's log through the link"
    log = work_dir(docker_server, inst) / "output.log"
    assert log.is_file() and not log.is_symlink()
    assert get_log(docker_server, inst.id).text == "from the container\n"


@pytest.mark.docker
@pytest.mark.slow
def test_docker_writes_the_notice_without_following_links_the_job_planted(
    docker_server: LiveServer, busybox_image: str, tmp_path: Path
) -> None:
    victims = victims_in(tmp_path)
    code = docker_server.home.parent / "code"
    code.mkdir(exist_ok=True)
    spec = StandaloneJobSpec(
        task_name="t",
        code_path=str(code),
        cmd=plant_then_wait_for_notice(victims),
        resource_pkg=454,
        elastic=True,
        grace_seconds=20,
        image=busybox_image,
    )
    with docker_server.client(BOB) as c, docker_server.client(TOKENS["admin"]) as admin:
        job = c.submit(spec)
        wait_until(c, job.id, {"RUNNING"}, timeout=60)
        (inst,) = c.instances(job.id)
        planted = work_dir(docker_server, inst) / ".preempt-notice.tmp"
        deadline = time.monotonic() + 30
        while not planted.is_symlink():
            assert time.monotonic() < deadline, "the job never planted its links"
            time.sleep(0.1)
        admin.suspend(job.id)
        wait_until(c, job.id, {"SUSPENDED"} | TERMINAL, timeout=60)
        inst = c.instance(inst.id)
    assert_notice_delivered_and_victims_untouched(docker_server, inst, victims)
    assert "grace_seconds" in get_log(docker_server, inst.id).text


@pytest.mark.docker
@pytest.mark.slow
def test_docker_keeps_a_large_final_log_in_bounded_memory(
    docker_server: LiveServer, busybox_image: str
) -> None:
    size = 50_000_000
    pid = docker_server.pid
    assert pid is not None
    peak_before_kb = proc_field(pid, "status", "VmHWM")
    cmd = f"yes \"$(head -c 4000 /dev/zero | tr '\\0' y)\" | head -c {size}"
    inst = run(docker_server, cmd, image=busybox_image)
    grown_mb = (proc_field(pid, "status", "VmHWM") - peak_before_kb) / 1024
    log = work_dir(docker_server, inst) / "output.log"
    # The last line was cut by `head`: the kept log ends it with a newline.
    assert log.stat().st_size == size + 1
    assert grown_mb < 40, f"the server's peak memory grew by {grown_mb:.0f} MB keeping a 50 MB log"
    log.unlink()
