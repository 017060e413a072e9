"""dockerd restarted under a running `hai serve` with the docker backend (a dockerd of the test's own,
with `--live-restore`): the containers outlive the daemon, so a job that goes on through the restart
ends SUCCEEDED in its first and only run, with its whole log; a job that ends while no daemon runs has
its exit recorded once the daemon is back (what it printed meanwhile is lost with the daemon that
writes the container logs); a job submitted meanwhile waits and then runs; the API
answers throughout; the ledger finds nothing."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import pytest

from hai_airflow.client import HaiClient
from hai_airflow.spec import StandaloneJobSpec
from tests.cli.test_live import wait_for
from tests.support.docker_engine import OwnEngine, docker_server, import_busybox
from tests.support.live_server import TOKENS
from tests.support.own_postgres import OwnPostgres

pytestmark = [pytest.mark.faults, pytest.mark.docker, pytest.mark.slow]


class ApiProbe:
    """Lists jobs through the API every 0.1 s while a fault lasts; `answers` holds every status code
    (or the error of a request that got none)."""

    def __init__(self, url: str, token: str) -> None:
        self.request = urllib.request.Request(
            f"{url}/api/v1/jobs", headers={"Authorization": f"Bearer {token}"}
        )
        self.answers: list[int | str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="api-probe", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                with urllib.request.urlopen(self.request, timeout=30) as answer:
                    self.answers.append(answer.status)
            except urllib.error.HTTPError as refused:
                self.answers.append(refused.code)
            except OSError as e:
                self.answers.append(f"{type(e).__name__}: {e}")

    def __enter__(self) -> ApiProbe:
        self._thread.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(60)


def released(name: str) -> str:
    """A job's command: runs until the test creates `name` in its code dir, then says so and leaves
    `name`.ended there (how the test knows, with no daemon to ask, that it has exited)."""
    return f"echo started; until [ -e {name} ]; do sleep 0.1; done; echo released; touch {name}.ended"


def one_run_each(client: HaiClient, logs: dict[int, str | None]) -> None:
    """Each job ran once (none was started twice), exited 0 and left exactly `logs[job]` (None: its
    log is not checked)."""
    runs = {job_id: client.instances(job_id) for job_id in logs}
    assert all(len(r) == 1 for r in runs.values()), runs
    seen = {
        job_id: (run.exit_code, None if logs[job_id] is None else client.log(run.id))
        for job_id, (run,) in runs.items()
    }
    assert seen == {job_id: (0, text) for job_id, text in logs.items()}, seen


def wait_file(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout:.0f} s"
        time.sleep(0.05)


def test_dockerd_restarted_under_running_containers_loses_nothing(
    database: OwnPostgres, own_engine: OwnEngine, tmp_path: Path, figures: Callable[[str, float], None]
) -> None:
    engine = own_engine.start()
    image = import_busybox(engine, tmp_path)
    code = tmp_path / "code"
    code.mkdir()

    def job(name: str, cmd: str) -> StandaloneJobSpec:
        return StandaloneJobSpec(task_name=name, code_path=str(code), cmd=cmd, image=image, resource_pkg=454)

    env = {"HAI_DATABASE_URL": database.url}
    with docker_server(engine, tmp_path / "hai", env) as (server, _):
        alice = server.client(TOKENS["alice"])
        through = alice.submit(job("through", released("go-through")))
        during = alice.submit(job("during", released("go-during")))
        wait_for(server, through.id, {"RUNNING"})
        wait_for(server, during.id, {"RUNNING"})
        with ApiProbe(server.url, TOKENS["alice"]) as probe:
            own_engine.stop()
            (code / "go-during").touch()
            wait_file(code / "go-during.ended")  # it exited while no daemon ran
            late = alice.submit(job("late", "echo late"))
            # Longer than `poll` waits for the engine: controller steps fail meanwhile, and a start
            # tried now would fail the job.
            time.sleep(3)
            assert alice.job(late.id).state == "PENDING"
            back = time.monotonic()
            own_engine.start()
            wait_for(server, during.id, {"SUCCEEDED"})
            figures("dockerd restarted: the exit of its outage recorded", time.monotonic() - back)
            wait_for(server, late.id, {"SUCCEEDED"})
            figures("dockerd restarted: the job submitted meanwhile ran", time.monotonic() - back)
        assert probe.answers and set(probe.answers) == {200}, sorted(set(map(str, probe.answers)))
        assert alice.job(through.id).state == "RUNNING"
        (code / "go-through").touch()
        wait_for(server, through.id, {"SUCCEEDED"})
        # The daemon writes the container logs: what a container printed while no daemon ran, if it
        # exited before the daemon was back, is gone (its exit code is not).
        one_run_each(alice, {through.id: "started\nreleased\n", during.id: "started\n", late.id: "late\n"})
        assert server.client(TOKENS["admin"]).check_store().problems == []
    assert "without live-restore" not in server.log_text()  # the backend saw the engine's setting


def test_an_engine_that_does_not_answer_holds_the_controller_back(
    own_engine: OwnEngine, tmp_path: Path
) -> None:
    """With nothing running too: `poll` raises, so the controller plans nothing and starts nothing
    (a start would fail its job), until the engine answers again."""
    from hai_airflow.backends.docker.backend import DockerBackend, EngineUnreachable

    engine = own_engine.start()
    backend = DockerBackend({"docker_host": engine.url, "owner": "hai-test-away"}, tmp_path)
    try:
        assert backend.poll() == []
        own_engine.stop()
        with pytest.raises(EngineUnreachable, match="does not answer"):
            backend.poll()
        own_engine.start()
        assert backend.poll() == []
    finally:
        backend.close()
