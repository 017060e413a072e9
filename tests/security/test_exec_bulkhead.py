"""`hai exec` cannot freeze the API or outlive its end (issue 56, findings 1 and 2): a user's execs run
within `[limits] execs_per_user` and on threads of their own, so another user's requests answer while
one user fills their budget, or many more execs than the API has threads; and what an exec starts,
also in a session of its own, dies with the exec's end, its timeout, the caller's hang-up and the job."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx

from hai_airflow.backends.common import procs
from hai_airflow.client import HaiClient
from hai_airflow.spec import CpuJobSpec
from tests.support.latency import NEIGHBOUR_SECONDS, assert_answered_fast
from tests.support.live_server import TEST_CONFIG, TOKENS, LiveServer

OPEN_SECONDS = 15.0
"""How long opening one exec may take (its answer's headers): the bound of a frozen server's wait."""
DEADLINE_SECONDS = 30.0
HANGING = ["sleep", "90"]
WORKER_ENDED = "killed: the task's worker ended"
KILLED_BY_A_SIGNAL = (128 + 9, 128 + 15)
"""An exec ended with its worker is killed by a signal: SIGKILL mostly, SIGTERM in one run of a
loaded machine's suite; the reason is what tells the user why."""


def _ended_with_its_worker(last: dict[str, object]) -> bool:
    return last["reason"] == WORKER_ENDED and last["exit_code"] in KILLED_BY_A_SIGNAL
Answer = httpx.Response | httpx.HTTPError
"""An exec's answer once its headers came, or why none came in time."""


def _api(server: LiveServer, user: str, connections: int = 8) -> httpx.Client:
    return httpx.Client(
        base_url=f"{server.url}/api/v1",
        headers={"Authorization": f"Bearer {TOKENS[user]}"},
        timeout=OPEN_SECONDS,
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
    )


def _running(client: HaiClient, code: Path) -> int:
    """A CPU job of the client's user, once its command runs."""
    code.mkdir(parents=True, exist_ok=True)
    code.chmod(0o777)  # the job's account (run_as) writes its mark here
    job = client.submit(CpuJobSpec(task_name="runs", code_path=str(code), cmd="touch ready; sleep 600"))
    _until(lambda: (code / "ready").exists(), f"job {job.id} never ran: {client.job(job.id)}")
    return job.id


def _until(done: Callable[[], bool], what: str, seconds: float = DEADLINE_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _open_exec(http: httpx.Client, job_id: int, command: list[str], timeout: int | None = None) -> Answer:
    """An exec's answer once its headers came (200: the command runs), or why none came in time."""
    body = {"command": command, "timeout_seconds": timeout}
    request = http.build_request("POST", f"/jobs/{job_id}/exec", json=body)
    try:
        return http.send(request, stream=True)
    except httpx.HTTPError as e:
        return e


@contextmanager
def _held_execs(http: httpx.Client, job_id: int, count: int) -> Iterator[list[Answer]]:
    """`count` execs of `sleep 90` opened at once and held until the block ends: then the caller hangs up."""
    with ThreadPoolExecutor(count) as pool:
        answers = list(pool.map(lambda _: _open_exec(http, job_id, HANGING), range(count)))
    try:
        yield answers
    finally:
        for answer in answers:
            if isinstance(answer, httpx.Response):
                answer.close()


def _latency(http: httpx.Client, path: str) -> float:
    """Seconds `GET path` took to answer 200; infinity when it did not within OPEN_SECONDS."""
    started = time.monotonic()
    try:
        status = http.get(path).status_code
    except httpx.TimeoutException:
        return float("inf")
    assert status == 200, (path, status)
    return time.monotonic() - started


def _statuses(answers: list[Answer]) -> list[int | str]:
    return [a.status_code if isinstance(a, httpx.Response) else type(a).__name__ for a in answers]


def _ran(http: httpx.Client, job_id: int, command: list[str]) -> int:
    """The status an exec of `command` got; its answer is read to its end."""
    answer = _open_exec(http, job_id, command)
    return _read(answer).status_code


def _read(answer: Answer) -> httpx.Response:
    """An exec's answer read to its end and closed."""
    assert isinstance(answer, httpx.Response), answer
    try:
        answer.read()
    finally:
        answer.close()
    return answer


def _last_line(answer: Answer) -> dict[str, object]:
    """How an exec ended: the last line of its answer, read as it comes (each read within the client's
    timeout)."""
    assert isinstance(answer, httpx.Response) and answer.status_code == 200, answer
    try:
        lines = [line for line in answer.iter_lines() if line]
    finally:
        answer.close()
    last: dict[str, object] = json.loads(lines[-1])
    return last


def test_a_users_exec_storm_stays_within_their_budget_and_leaves_others_untouched(tmp_path: Path) -> None:
    """Finding 1: bob opens as many `sleep 90` execs as his budget allows, and one more: that one is
    refused with 429 naming the limit; meanwhile dave's list and /health answer within a second, alice
    runs a command in her own job, a hang-up frees bob's slot, and the admin's cancel is prompt and ends
    bob's execs."""
    limit = 4  # the default of [limits] execs_per_user
    server = LiveServer(tmp_path / "hai", TEST_CONFIG).start()
    with server, server.client(TOKENS["bob"]) as bob, server.client(TOKENS["alice"]) as alice:
        job, hers = _running(bob, tmp_path / "bob"), _running(alice, tmp_path / "alice")
        with (
            _api(server, "bob", limit + 4) as bob_http,
            _api(server, "dave") as dave_http,
            _held_execs(bob_http, job, limit) as held,
        ):
            assert _statuses(held) == [200] * limit
            _refused_past_the_budget(bob_http, job, limit)
            assert_answered_fast([_latency(dave_http, "/jobs") for _ in range(3)], "dave")
            with httpx.Client(base_url=server.url, timeout=OPEN_SECONDS) as anyone:
                assert _latency(anyone, "/health") < NEIGHBOUR_SECONDS
            said = list(alice.exec(hers, ["echo", "alice's own"]))
            assert said[0] == {"output": "alice's own\n"} and said[-1]["exit_code"] == 0, said
            first, *others = held
            assert isinstance(first, httpx.Response)
            first.close()  # bob hangs up one: its slot is free once its command has ended
            _until(lambda: _ran(bob_http, job, ["true"]) == 200, "the hang-up freed no slot")
            started = time.monotonic()
            with server.client(TOKENS["admin"]) as admin:
                admin.cancel(job)
            assert time.monotonic() - started < NEIGHBOUR_SECONDS
            ends = [_last_line(answer) for answer in others]
            assert len(ends) == limit - 1 and all(_ended_with_its_worker(end) for end in ends), ends
        alice.cancel(hers)


def _refused_past_the_budget(http: httpx.Client, job_id: int, limit: int) -> None:
    answer = _open_exec(http, job_id, HANGING)
    assert isinstance(answer, httpx.Response), answer
    if answer.status_code != 429:
        answer.close()
        raise AssertionError(f"an exec past the budget of {limit} got {answer.status_code}, not 429")
    refused = _read(answer).json()
    assert f"[limits] execs_per_user = {limit}" in refused["error"], refused
    assert "raise [limits] execs_per_user" in refused["fix"], refused


def test_more_execs_than_the_api_has_threads_leave_another_users_list_answering(tmp_path: Path) -> None:
    """Finding 1, past the API's thread pool (anyio's default: 40 threads): with a budget of 64, bob
    holds 45 execs at once; every one starts, and dave's list still answers within a second."""
    execs = 45
    config = "[limits]\nexecs_per_user = 64\n\n" + TEST_CONFIG
    server = LiveServer(tmp_path / "hai", config).start()
    with server, server.client(TOKENS["bob"]) as bob:
        job = _running(bob, tmp_path / "bob")
        with (
            _api(server, "bob", execs + 4) as bob_http,
            _api(server, "dave") as dave_http,
            _held_execs(bob_http, job, execs) as held,
        ):
            waits = [_latency(dave_http, "/jobs") for _ in range(3)]
            assert _statuses(held) == [200] * execs
            assert_answered_fast(waits, "dave")
        bob.cancel(job)


def _daemon(mark: Path, seconds: int, then: str) -> list[str]:
    """A command that starts `sleep seconds` in a session of its own (its pid written to `mark`), then
    runs `then`: the daemon of finding 2."""
    return ["sh", "-c", f"setsid sh -c 'echo $$ > {mark}; exec sleep {seconds}' & {then}"]


def _daemon_pid(mark: Path) -> int:
    _until(lambda: mark.exists() and mark.read_text().strip().isdigit(), f"no daemon wrote {mark}")
    return int(mark.read_text())


def _is_daemon(pid: int, seconds: int) -> bool:
    return procs.cmdline(pid) == ["sleep", str(seconds)]


def _gone(pid: int, seconds: int, after: str) -> None:
    _until(lambda: not _is_daemon(pid, seconds), f"the exec's daemon {pid} outlived {after}", 10)


def _of_job(server: LiveServer, job_id: int) -> list[int]:
    """Processes whose environment is job `job_id`'s of this server."""
    wanted = {f"HAI_JOB_ID={job_id}".encode(), f"HAI_SERVER={server.url}".encode()}
    found = []
    for pid in procs.running():
        try:
            env = set((procs.PROC / str(pid) / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if wanted <= env:
            found.append(pid)
    return found


def test_what_an_exec_starts_in_a_session_of_its_own_dies_with_the_exec_and_the_job(open_dir: Path) -> None:
    """Finding 2: bob's exec starts `setsid sh -c "exec sleep N" &`, as the job's account (run_as). The
    daemon dies when the exec ends by itself, at the exec's timeout, when bob hangs up, and when the
    job is cancelled; then nothing with the job's environment is left."""
    marks = open_dir / "marks"
    marks.mkdir(mode=0o777)
    marks.chmod(0o777)
    config = TEST_CONFIG.replace("[[nodes]]", '[backend]\nrun_as = "nobody"\n\n[[nodes]]', 1)
    try:
        with LiveServer(open_dir / "hai", config).start() as server, server.client(TOKENS["bob"]) as bob:
            job = _running(bob, open_dir / "code")
            with _api(server, "bob") as http:
                # Its output ends, although the daemon held the pipe (a read timeout bounds the wait).
                ended = _last_line(_open_exec(http, job, _daemon(marks / "ends", 2991, "sleep 1")))
                assert ended == {"exit_code": 0, "reason": None}, ended
                _gone(_daemon_pid(marks / "ends"), 2991, "the exec's own end")

                ended = _last_line(_open_exec(http, job, _daemon(marks / "timeout", 2992, "sleep 600"), 2))
                assert ended == {"exit_code": 137, "reason": "killed after its timeout of 2 s"}, ended
                _gone(_daemon_pid(marks / "timeout"), 2992, "the exec's timeout")

                answer = _open_exec(http, job, _daemon(marks / "hangup", 2993, "sleep 600"))
                daemon = _daemon_pid(marks / "hangup")
                assert isinstance(answer, httpx.Response) and _is_daemon(daemon, 2993), answer
                answer.close()
                _gone(daemon, 2993, "the caller's hang-up")

                answer = _open_exec(http, job, _daemon(marks / "cancel", 2994, "sleep 600"))
                daemon = _daemon_pid(marks / "cancel")
                assert _is_daemon(daemon, 2994)
                bob.cancel(job)
                assert _ended_with_its_worker(_last_line(answer))
                _gone(daemon, 2994, "the job's cancel")
            _until(lambda: _of_job(server, job) == [], f"processes of job {job} outlived it")
    finally:
        _kill_daemons(marks)


def _kill_daemons(marks: Path) -> None:
    """On a failure, the daemons that outlived the test end with it."""
    for mark in marks.iterdir():
        pid = mark.read_text().strip()
        if pid.isdigit() and (procs.cmdline(int(pid)) or [""])[0] == "sleep":
            os.kill(int(pid), signal.SIGKILL)
