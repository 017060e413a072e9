"""Workers' logs into one instance log: merged by time, followed while they run, kept after."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hai_airflow.backends.common.live_logs import FanIn, WorkerLog, prefixed_lines, read_workers
from hai_airflow.backends.common.merged_logs import MAX_PIECE, last_lines, merge, stamped_only
from hai_airflow.spec import StandaloneJobSpec
from tests.support.docker_engine import DockerJobs, Engine, docker_server


def test_workers_interleave_by_time_even_when_the_engine_trims_trailing_zeros() -> None:
    # "…00.5Z" is later than "…00.123456789Z" although it sorts first as text.
    w0 = b"2026-01-01T00:00:00.5Z second\n2026-01-01T00:00:01Z fourth\n"
    w1 = b"2026-01-01T00:00:00.123456789Z first\n2026-01-01T00:00:00.9Z third\n"
    assert merge([w0, w1]) == "[worker 1] first\n[worker 0] second\n[worker 1] third\n[worker 0] fourth\n"


def test_a_kubelet_error_written_into_the_answer_is_not_a_log_line() -> None:
    """Seen in CI: a follow ending after the pod was removed answered only the kubelet's error text."""
    kept = b"2026-12-07T04:00:00.1Z HAI_RESUME=0\n2026-12-07T04:00:01.2Z step 1\n"
    error = b'failed to try resolving symlinks in path "/var/log/pods/x/job/0.log": no such file\n'
    assert stamped_only(kept + error) == kept
    assert stamped_only(error) == b""
    assert merge([stamped_only(kept + error)]) == "HAI_RESUME=0\nstep 1\n"


def test_one_worker_keeps_its_own_order_and_no_prefix() -> None:
    # stdout and stderr are stamped by separate readers: a worker's order is kept as the engine gave it.
    raw = b"2026-01-01T00:00:02Z out\n2026-01-01T00:00:01Z err\n2026-01-01T00:00:03Z no newline"
    assert merge([raw]) == "out\nerr\nno newline\n"
    assert last_lines(merge([raw]), 2) == "err\nno newline\n"


# ---- the shared live-log helpers (backends/common/live_logs.py) -------------------------------------------


def test_a_stream_becomes_prefixed_whole_lines_and_an_endless_line_comes_in_pieces() -> None:
    chunks = [b"one\ntw", b"o\n\xc3", b"\xa9t\xc3", b"\xa9"]  # é split across chunks
    assert (
        "".join(prefixed_lines(chunks, "[worker 1] ")) == "[worker 1] one\n[worker 1] two\n[worker 1] été\n"
    )
    pieces = list(prefixed_lines([b"x" * (MAX_PIECE + 10), b"y\nz\n"], "[w] "))
    assert pieces[0] == "[w] " + "x" * (MAX_PIECE + 10)  # a piece, held no longer
    assert "".join(pieces[1:]) == "y\n[w] z\n"  # the rest of that line carries no second prefix


def streamed(lines: list[str], gate: threading.Event | None = None) -> Iterator[bytes]:
    for i, line in enumerate(lines):
        if gate is not None and i == 1:
            assert gate.wait(5), "the other worker's line never came"
        yield line.encode()


def test_fan_in_interleaves_workers_as_they_write_with_their_prefixes() -> None:
    # Worker 1 writes its second line only after worker 0's first line was read: arrival order, not rank.
    gate = threading.Event()
    w0 = WorkerLog("container a", lambda follow, tail: streamed(["a1\n"]))
    w1 = WorkerLog("container b", lambda follow, tail: streamed(["b1\n", "b2\n"], gate))
    seen = []
    fan_in = FanIn([w0, w1])
    for chunk in fan_in:
        seen.append(chunk)
        if chunk == "[worker 0] a1\n":
            gate.set()
    assert sorted(seen) == ["[worker 0] a1\n", "[worker 1] b1\n", "[worker 1] b2\n"]
    assert seen.index("[worker 1] b2\n") > seen.index("[worker 0] a1\n")
    assert not fan_in.unreadable


def test_a_worker_whose_log_cannot_be_read_becomes_one_clear_line() -> None:
    def refused(follow: bool, tail: int | None) -> Iterator[bytes]:
        raise RuntimeError("pod p-1 does not have a host assigned")

    workers = [
        WorkerLog("pod p-0", lambda f, t: [b"2026-01-01T00:00:00Z ok\n"]),
        WorkerLog("pod p-1", refused),
    ]
    fan_in = FanIn(workers)
    assert set(fan_in) == {
        "[worker 0] 2026-01-01T00:00:00Z ok\n",
        "[worker 1] [hai] the log of pod p-1 cannot be read now: pod p-1 does not have a host assigned; "
        "it is shown once the instance ends.\n",
    }
    assert fan_in.unreadable
    assert read_workers(workers, 0) == (
        "[hai] the log of pod p-1 cannot be read now: pod p-1 does not have a host assigned; "
        "it is shown once the instance ends.\n[worker 0] ok\n"
    )


def test_closing_a_fan_in_from_another_thread_ends_it_while_it_waits() -> None:
    never = threading.Event()

    def silent(follow: bool, tail: int | None) -> Iterator[bytes]:
        never.wait(10)
        yield b""

    fan_in = FanIn([WorkerLog("container quiet", silent)])
    threading.Timer(0.2, fan_in.close).start()
    started = time.monotonic()
    assert list(fan_in) == []
    assert time.monotonic() - started < 3


# ---- a running container's log, through the backend and through the API (real dockerd) ----------------

TICKS = "for i in 1 2 3 4 5 6; do echo tick $i; sleep 1; done"


def docker_tier(test: Callable[..., None]) -> Callable[..., None]:
    return pytest.mark.slow(pytest.mark.docker(test))


@pytest.fixture
def ticking(
    docker_engine: Engine, busybox_image: str, tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[DockerJobs, int]:
    """Two containers of one instance printing a line a second for six seconds."""
    jobs = DockerJobs(docker_engine, tmp_path, busybox_image)
    request.addfinalizer(jobs.cleanup)
    handle = jobs.start(TICKS, gpus=((0,), (1,)), mode="distributed", processes="per-worker")
    return jobs, handle.instance_id


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@docker_tier
def test_a_running_containers_log_is_read_and_followed_from_the_engine(
    ticking: tuple[DockerJobs, int],
) -> None:
    jobs, iid = ticking
    wait_for(lambda: "tick 2" in jobs.backend.read_log(iid), "two ticks while it runs")
    running = jobs.backend.read_log(iid)
    assert "[worker 0] tick 1\n" in running and "[worker 1] tick 1\n" in running
    assert "tick 6" not in running  # read while it runs, not after
    assert jobs.backend.read_log(iid, tail=1).count("\n") == 1
    followed = "".join(jobs.backend.follow_log(iid))  # from the start, until both containers exit
    for w in (0, 1):
        assert [line for line in followed.splitlines() if line.startswith(f"[worker {w}]")] == [
            f"[worker {w}] tick {i}" for i in range(1, 7)
        ]
    assert jobs.wait(iid).exit_code == 0
    kept = jobs.backend.read_log(iid)  # the kept file, once the containers are gone
    assert kept.count("tick") == 12 and jobs.containers(iid) == []


@docker_tier
def test_the_log_route_shows_a_running_docker_job_and_all_of_it_after(
    docker_engine: Engine, busybox_image: str, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    spec = StandaloneJobSpec(
        task_name="ticks", code_path=str(code), cmd=TICKS, image=busybox_image, resource_pkg=454
    )
    with docker_server(docker_engine, tmp_path / "home") as (live, _), live.client() as c:
        job = c.submit(spec)
        wait_for(lambda: bool(c.instances(job.id)) and "tick 1" in c.log(c.instances(job.id)[0].id), "tick 1")
        (instance,) = c.instances(job.id)
        assert c.job(job.id).state == "RUNNING"
        assert "tick 6" not in c.log(instance.id)
        chunks = []
        for chunk in c.follow_log(instance.id):
            chunks.append((chunk, c.job(job.id).state))
        followed = "".join(text for text, _ in chunks)
        assert followed == "".join(f"tick {i}\n" for i in range(1, 7))
        assert any(state == "RUNNING" for _, state in chunks)  # lines came while it ran
        wait_for(lambda: c.job(job.id).state == "SUCCEEDED", "the job's end")
        assert c.log(instance.id) == followed  # after: the kept file
        assert c.log(instance.id, tail=2) == "tick 5\ntick 6\n"
