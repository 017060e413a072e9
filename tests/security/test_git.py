"""Finding 2: a job's git repository. Only allowed protocols and hosts are accepted (422 naming the
field), and the clone is the job's own start: run by its process, as its account, so one that hangs
holds nobody else's job and a cancel ends it."""

from __future__ import annotations

import http.server
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from hai_airflow.backends.common.gitcode import clone_argv
from hai_airflow.client import HaiError
from hai_airflow.server.control.controller import TICK_SECONDS
from hai_airflow.spec import CpuJobSpec
from tests.security.cli import hai
from tests.security.test_races import wait_ended
from tests.support.gitrepo import bare_origin
from tests.support.live_server import TEST_CONFIG, TOKENS, LiveServer

GIT_CONFIG = '[git]\nallowed_hosts = ["git.example.com", "127.0.0.1"]\n\n' + TEST_CONFIG


@pytest.fixture
def server(tmp_path: Path, store_env: dict[str, str]) -> Iterator[LiveServer]:
    with LiveServer(tmp_path / "hai", GIT_CONFIG, store_env).start() as live:
        yield live


def parked(url: str, name: str = "git") -> CpuJobSpec:
    """A git job no node can hold: accepted or refused at submit, never started (no clone is tried)."""
    return CpuJobSpec(task_name=name, code_src="git", code_path=url, cmd="true", cpus=1000)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("fd::17", "remote helpers"),
        ("ext::sh -c touch% /tmp/pwned", "not a repository URL"),
        ("ext::sh", "remote helpers"),
        ("file:///srv/repo.git", "file:// URLs are not cloned"),
        ("http://127.0.0.1:44107/r.git", "http:// is not an allowed protocol"),
        ("git://git.example.com/r.git", "git:// is not an allowed protocol"),
        ("https://169.254.169.254/latest", "host 169.254.169.254 is not one jobs may clone from"),
        ("https://git.example.com.evil.test/r.git", "is not one jobs may clone from"),
        ("ssh://git@internal.test:22/r.git", "host internal.test is not one"),
        ("git@internal.test:r.git", "host internal.test is not one"),
        ("-uhack", "not a repository URL"),
        ("repos/r.git", "a relative path"),
    ],
)
def test_a_repository_outside_the_rules_is_refused_at_submit(server: LiveServer, url: str, why: str) -> None:
    with server.client(TOKENS["bob"]) as bob, pytest.raises(HaiError) as refused:
        bob.submit(parked(url))
    assert (refused.value.status, refused.value.field) == (422, "spec.code_path")
    assert why in refused.value.error, refused.value.error
    assert refused.value.fix
    with server.client(TOKENS["bob"]) as bob:
        assert bob.jobs() == []  # nothing half-created


def test_allowed_hosts_over_https_and_ssh_are_accepted(server: LiveServer) -> None:
    with server.client(TOKENS["bob"]) as bob:
        for url in ("https://git.example.com/team/r.git", "ssh://git@GIT.example.com/team/r.git"):
            assert bob.submit(parked(url)).id
        assert bob.submit(parked("git@git.example.com:team/r.git")).id


def test_the_cli_says_which_field_and_exits_2(server: LiveServer) -> None:
    submit = ("submit", "cpu", "--name", "t", "--code-src", "git", "--code-dir", "fd::17", "--cpus", "1")
    done = hai(server, "bob", *submit, "true")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "(field --code-path)" in done.stderr and "remote helpers" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_clone_that_hangs_delays_no_other_job(tmp_path: Path, silent_host: str) -> None:
    """bob's clone never gets an answer: alice's job, submitted after it, starts within a controller
    cycle, and bob's cancel ends his clone at once."""
    config = GIT_CONFIG.replace("[git]\n", '[git]\nschemes = ["https", "http"]\n', 1)
    code = tmp_path / "code"
    code.mkdir()
    with (
        LiveServer(tmp_path / "hai", config).start() as server,
        server.client(TOKENS["bob"]) as bob,
        server.client(TOKENS["alice"]) as alice,
    ):
        hung = bob.submit(CpuJobSpec(task_name="hangs", code_src="git", code_path=silent_host, cmd="true"))
        deadline = time.monotonic() + 30
        while bob.job(hung.id).state != "RUNNING":
            assert time.monotonic() < deadline, bob.job(hung.id)
            time.sleep(0.05)
        began = time.monotonic()
        other = alice.submit(CpuJobSpec(task_name="other", code_path=str(code), cmd="sleep 30"))
        while alice.job(other.id).state != "RUNNING":
            # one controller cycle, and a second for a busy CI machine
            assert time.monotonic() - began < TICK_SECONDS + 1, alice.job(other.id)
            time.sleep(0.05)
        assert bob.job(hung.id).state == "RUNNING"  # still cloning
        bob.cancel(hung.id)
        assert wait_ended(bob, hung.id, timeout=20).state == "CANCELLED"
        alice.cancel(other.id)
        port = silent_host.split(":")[2].split("/")[0]
        left = subprocess.run(["pgrep", "-f", f"127.0.0.1:{port}"], capture_output=True, text=True)
        assert left.stdout.strip() == "", "the cancelled job's git process is still running"


def test_the_clone_runs_as_the_jobs_account(open_dir: Path) -> None:
    """With run_as, the job's account clones its own repository: git's ownership check passes (no
    `safe.directory` exception is needed) and the checkout is the account's, never root's."""
    origin = bare_origin(open_dir, {"main": {"train.sh": 'echo "cloned by $(id -un) into $(pwd)"\n'}})
    subprocess.run(["chown", "-R", "nobody:nogroup", str(origin)], check=True)
    origin.chmod(0o700)  # only its owner, the job's account, can read it: root would need safe.directory
    config = TEST_CONFIG.replace("[[nodes]]", '[backend]\nrun_as = "nobody"\n\n[[nodes]]', 1)
    with LiveServer(open_dir / "hai", config).start() as server, server.client(TOKENS["bob"]) as bob:
        spec = CpuJobSpec(task_name="git", code_src="git", code_path=str(origin), cmd="sh train.sh")
        job = wait_ended(bob, bob.submit(spec).id)
        (inst,) = bob.instances(job.id)
        log = bob.log(inst.id)
    assert job.state == "SUCCEEDED", (job.reason, log)
    checkout = open_dir / "hai" / "jobs" / str(job.id) / "instances" / str(inst.id) / "code"
    assert f"cloned by nobody into {checkout}" in log
    assert checkout.stat().st_uid == (nobody := int(subprocess.check_output(["id", "-u", "nobody"])))
    assert (checkout / "train.sh").stat().st_uid == nobody


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every GET with `redirect_to` (a 302) when set, else 404; keeps the paths asked for."""

    redirect_to: ClassVar[str] = ""
    asked: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.asked.append(self.path)
        if self.redirect_to:
            self.send_response(302)
            self.send_header("Location", self.redirect_to + self.path)
        else:
            self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _serve(handler: type[http.server.BaseHTTPRequestHandler]) -> http.server.HTTPServer:
    httpd = http.server.HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def test_a_redirect_from_an_allowed_host_to_another_is_not_followed(tmp_path: Path) -> None:
    """The allowed host answers with a redirect to a host the rules never allowed: the clone fails
    and the other host is never asked."""
    unlisted = _serve(type("Unlisted", (_Recorder,), {"asked": []}))
    allowed = _serve(
        type(
            "Allowed", (_Recorder,), {"asked": [], "redirect_to": f"http://localhost:{unlisted.server_port}"}
        )
    )
    try:
        url = f"http://127.0.0.1:{allowed.server_port}/team/r.git"
        argv = clone_argv(url, None, str(tmp_path / "code"), ("http",))
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=60,
            env={"GIT_TERMINAL_PROMPT": "0", "PATH": "/usr/bin:/bin"},
        )
        assert done.returncode != 0, done.stderr
        assert allowed.RequestHandlerClass.asked, "the allowed host was never asked"  # type: ignore[attr-defined]
        assert unlisted.RequestHandlerClass.asked == []  # type: ignore[attr-defined]
    finally:
        allowed.shutdown()
        unlisted.shutdown()
