"""The downloadable `hai` (`GET /cli/hai`): served to anyone, run by a plain Python 3.8 with nothing
installed, and saying and sending what the full `hai` says and sends, from the same flag table."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer

from hai_airflow.cli import flagtable
from hai_airflow.cli.main import app
from tests.support.live_server import REPO, LiveServer

OLDEST = Path("/root/.pyenv/versions/3.8.18/bin/python3")
"""The oldest Python the file claims (cli_download.PYTHON)."""
FULL_ONLY = {
    "submit standalone": {"--server", "--token", "--region"},
    "submit cpu": {"--server", "--token", "--region"},
    "create": {"--server", "--token", "--region", "--filename", "-f"},
    "task": {"--server", "--token", "--region", "--watch", "-w"},
    "instance": {"--server", "--token", "--region"},
    "log": {"--server", "--token", "--region"},
    "wait": {"--server", "--token", "--region"},
    "cancel": {"--server", "--token", "--region"},
    "res": {"--server", "--token", "--region"},
}
"""Flags only the full `hai` has: where to connect (a job's environment says it), redrawing a view on
a terminal, and YAML job files."""


def oldest_python() -> Path:
    if not OLDEST.exists():
        pytest.skip(f"no Python 3.8 at {OLDEST} to run the downloaded hai with")
    return OLDEST


@pytest.fixture(scope="module")
def downloaded(server: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The file as `wget http://…/cli/hai -O hai && chmod +x hai` leaves it."""
    answer = httpx.get(f"{server.url}/cli/hai")
    assert answer.status_code == 200
    path = tmp_path_factory.mktemp("bin") / "hai"
    path.write_bytes(answer.content)
    path.chmod(0o755)
    return path


def run_full(server: LiveServer, user: str, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HAI_SERVER": server.url, "HAI_TOKEN": f"{user}-token", "NO_COLOR": "1"}
    program = "from hai_airflow.cli.main import app; app(prog_name='hai')"
    return subprocess.run(
        [sys.executable, "-c", program, *argv], capture_output=True, text=True, env=env, timeout=120
    )


def run_portable(
    hai: Path, server: LiveServer, user: str, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The downloaded file under `python3 -I`: no site-packages, no PYTHONPATH, no user site."""
    given = env if env is not None else {"HAI_TOKEN": f"{user}-token"}
    environment = {"PATH": "/usr/bin:/bin", "HAI_SERVER": server.url, **given}
    return subprocess.run(
        [str(oldest_python()), "-I", str(hai), *argv],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
    )


def test_the_server_serves_one_python_file_to_anyone(server: LiveServer, downloaded: Path) -> None:
    answer = httpx.get(f"{server.url}/cli/hai")
    assert answer.headers["content-type"].startswith("text/x-python")
    assert answer.text.splitlines()[0] == "#!/usr/bin/env python3"
    assert "max-age" in answer.headers["cache-control"]
    again = httpx.get(f"{server.url}/cli/hai", headers={"If-None-Match": answer.headers["etag"]})
    assert again.status_code == 304
    shown = subprocess.run(
        [str(oldest_python()), "-I", str(downloaded), "--help"], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert all(name.split()[0] in shown.stdout for name in flagtable.COMMANDS)


def test_an_older_python_is_told_which_it_needs(downloaded: Path) -> None:
    old = Path("/root/.pyenv/versions/3.6.15/bin/python3")
    if not old.exists():
        pytest.skip(f"no Python 3.6 at {old}")
    done = subprocess.run(
        [str(old), "-I", str(downloaded), "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.startswith("Error: hai needs Python 3.8 or later; this is 3.6.")


def job_spec(server: LiveServer, job_id: int) -> dict[str, Any]:
    return server.client().job(job_id).spec


def created_id(done: subprocess.CompletedProcess[str]) -> int:
    assert done.returncode == 0, done.stderr
    found = re.fullmatch(r"created task (\d+)\n", done.stdout)
    assert found, done.stdout
    return int(found[1])


SUBMITS = [
    pytest.param(
        (
            "submit",
            "standalone",
            "--name=gpu-job",
            "--gpus=1",
            "--worker-image=img:1",
            "--gpu-type=v100",
            "--code-dir=/tmp",
            "--time-limit=10m",
            "--env",
            "LR=0.1",
            "--label",
            "team=vision",
            "python3 -c pass",
        ),
        id="submit standalone, as the platform document writes it",
    ),
    pytest.param(
        (
            "submit",
            "standalone",
            "--task-name",
            "two",
            "--gpus",
            "3",
            "--code-path",
            "/tmp",
            "--elastic",
            "--max-schedule",
            "0",
            "--",
            "python3",
            "-c",
            "print('a b')",
        ),
        id="submit standalone on a larger package, command after --",
    ),
    pytest.param(
        ("submit", "cpu", "--name", "prep", "--code-dir", "/tmp", "--cpus", "2", "--memory", "4", "true"),
        id="submit cpu",
    ),
    pytest.param(
        (
            "create",
            "--task-name=hai-test",
            "--model-id=31",
            "--project-id=10209",
            "--code-path=/tmp",
            "--max-schedule=0",
            "--resource-pkg=454",
            "--cmd=python3 -c pass",
            "--processes",
            "per-gpu",
        ),
        id="create",
    ),
    pytest.param(
        (
            "create",
            "--task-name=d",
            "--mode",
            "distributed",
            "--code-path=/tmp",
            "--worker-resource-pkg=455",
            "--workers",
            "2",
            "--min-workers",
            "1",
            "--cmd",
            "true",
            "--array",
            "0-1",
        ),
        id="create distributed array",
    ),
    pytest.param(
        ("create", "--mode", "cpu", "--task-name=prep", "--code-path=/tmp", "--cpus=2", "--cmd=true"),
        id="create a cpu task",
    ),
]


@pytest.mark.parametrize("argv", SUBMITS)
def test_a_submit_makes_the_same_job_either_way(
    clean: LiveServer, downloaded: Path, argv: tuple[str, ...]
) -> None:
    full = run_full(clean, "alice", *argv)
    portable = run_portable(downloaded, clean, "alice", *argv)
    # The ids differ (the second submit makes the next ones); the words and the spec do not.
    assert re.sub(r"\d+", "N", portable.stderr) == re.sub(r"\d+", "N", full.stderr)
    assert job_spec(clean, created_id(portable)) == job_spec(clean, created_id(full))


def aged(text: str) -> str:
    return re.sub(r" +", " ", re.sub(r"\b\d+[smhd]\b", "AGE", text))


def test_every_reading_command_prints_what_the_full_one_prints(clean: LiveServer, downloaded: Path) -> None:
    job = created_id(
        run_full(clean, "alice", "submit", "cpu", "--name", "读 data", "--code-dir", "/tmp", "echo hi")
    )
    waited = run_portable(downloaded, clean, "alice", "wait", str(job))
    assert waited.returncode == 0 and waited.stdout == f"task {job} SUCCEEDED\n", waited.stderr
    for argv in (
        ("task", str(job)),
        ("task", str(job), "-o", "json"),
        ("task", "-o", "wide", "--state", "succeeded"),
        ("task", "--json"),
        ("instance", str(job), "-o", "csv"),
        ("instance", "--task-id", str(job)),
        ("log", str(job)),
        ("log", str(job), "--tail", "1", "-f"),
        ("wait", str(job), "--for", "running"),
        ("wait", str(job), "-o", "json"),
        ("res",),
        ("res", "-o", "name", "--no-headers"),
        ("cancel", str(job)),
    ):
        full = run_full(clean, "alice", *argv)
        portable = run_portable(downloaded, clean, "alice", *argv)
        # A listing's AGE may pass a second between the two runs.
        assert (portable.returncode, aged(portable.stdout), portable.stderr) == (
            full.returncode,
            aged(full.stdout),
            full.stderr,
        ), argv


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        pytest.param(("submit", "standalone", "--gpus", "x", "true"), "--gpus", id="not a number"),
        pytest.param(
            ("submit", "cpu", "--time-limit", "10", "true"), "--time-limit", id="a duration without unit"
        ),
        pytest.param(("create", "--mode", "solo"), "--mode", id="not a mode"),
        pytest.param(("submit", "cpu", "--env", "LR", "true"), "--env", id="not KEY=VALUE"),
        pytest.param(("submit", "cpu", "--array", "9-1", "true"), "--array", id="not an array"),
        pytest.param(("task", "--state", "done"), "--state", id="not a state"),
        pytest.param(("log", "--tail", "-1", "1"), "--tail", id="a negative tail"),
        pytest.param(("task", "--bogus"), "--bogus", id="an unknown flag"),
        pytest.param(("wait", "--timeout", "-1", "1"), "--timeout", id="below the minimum"),
        pytest.param(
            ("submit", "standalone", "--gpus", "1", "true"), "--task-name", id="the spec lacks a name"
        ),
        pytest.param(
            ("create", "--task-name", "x", "--cmd", "true", "--code-path", "/tmp"),
            "--resource-pkg",
            id="no package",
        ),
    ],
)
def test_bad_input_names_the_flag_and_exits_2(
    server: LiveServer, downloaded: Path, argv: tuple[str, ...], flag: str
) -> None:
    done = run_portable(downloaded, server, "alice", *argv)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("Error: ") and flag in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_another_users_job_is_refused_through_it(clean: LiveServer, downloaded: Path) -> None:
    secret = "python3 -c 'print(123456)'"
    job = created_id(
        run_full(clean, "alice", "submit", "cpu", "--name", "mine", "--code-dir", "/tmp", secret)
    )
    for argv in (("task", str(job)), ("log", str(job)), ("cancel", str(job)), ("instance", str(job))):
        done = run_portable(downloaded, clean, "bob", *argv)
        assert done.returncode == 1 and done.stderr.startswith("Error: "), (argv, done.stderr)
        assert "123456" not in done.stdout + done.stderr
    assert clean.client().job(job).state != "CANCELLED"


def test_the_token_comes_from_the_file_hai_token_file_names(
    server: LiveServer, downloaded: Path, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("alice-token\n")
    done = run_portable(downloaded, server, "alice", "task", "--json", env={"HAI_TOKEN_FILE": str(token)})
    assert done.returncode == 0, done.stderr
    missing = run_portable(downloaded, server, "alice", "res", env={"HAI_TOKEN_FILE": str(tmp_path / "none")})
    assert missing.returncode == 2 and "HAI_TOKEN_FILE" in missing.stderr


def error_line(done: subprocess.CompletedProcess[str]) -> tuple[int, list[str]]:
    """The exit code and the `Error:` lines on stderr."""
    return done.returncode, [line for line in done.stderr.splitlines() if line.startswith("Error")]


@pytest.mark.parametrize(
    ("who", "argv"),
    [
        pytest.param("alice", ("task", "99999"), id="an unknown task id"),
        pytest.param("alice", ("log", "99999"), id="the log of an unknown task"),
        pytest.param("alice", ("wait", "99999"), id="waiting for an unknown task"),
        pytest.param(None, ("task",), id="no token"),
        pytest.param(None, ("submit", "cpu", "--name=x", "--code-dir=/tmp", "true"),
                     id="a submit without token"),
        pytest.param("alice", ("submit", "standalone", "--gpus", "x", "true"), id="--gpus x"),
        pytest.param("alice", ("wait", "--timeout", "x", "1"), id="--timeout x"),
        pytest.param("alice", ("submit", "cpu", "--time-limit", "10", "true"),
                     id="--time-limit without unit"),
        pytest.param("alice", ("create", "--mode", "solo"), id="an unknown mode"),
        pytest.param("alice", ("submit", "cpu", "--name=x", "--code-dir=/nonexistent", "true"),
                     id="a submit the server refuses"),
        pytest.param("unknown region", ("task",), id="an unknown HAI_REGION"),
        pytest.param("bob", ("task", "JOB"), id="another user's task"),
        pytest.param("bob", ("log", "JOB"), id="another user's log"),
        pytest.param("bob", ("cancel", "JOB"), id="cancelling another user's task"),
        pytest.param("bob", ("instance", "JOB"), id="another user's instances"),
    ],
)  # fmt: skip
def test_both_clis_refuse_bad_input_in_the_same_words(
    server: LiveServer, downloaded: Path, isolated_home: Path, who: str | None, argv: tuple[str, ...]
) -> None:
    """The same bad input to the full and the downloaded `hai`: the same `Error:` line, the same exit code."""
    if "JOB" in argv:
        mine = run_full(server, "alice", "submit", "cpu", "--name=mine", "--code-dir=/tmp", "true")
        argv = tuple(str(created_id(mine)) if word == "JOB" else word for word in argv)
    env = {"HAI_HOME": str(isolated_home), "HAI_SERVER": server.url}
    if who == "unknown region":
        env = {"HAI_HOME": str(isolated_home), "HAI_REGION": "mars", "HAI_TOKEN": "alice-token"}
    elif who is not None:
        env["HAI_TOKEN"] = f"{who}-token"
    full = subprocess.run(
        [sys.executable, "-c", "from hai_airflow.cli.main import app; app(prog_name='hai')", *argv],
        capture_output=True,
        text=True,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("HAI_")}, "NO_COLOR": "1", **env},
        timeout=120,
    )
    portable = subprocess.run(
        [str(oldest_python()), "-I", str(downloaded), *argv],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", **env},
        timeout=120,
    )
    assert full.returncode in (1, 2) and error_line(full)[1], full.stderr
    assert error_line(portable) == error_line(full), (portable.stderr, full.stderr)


def _full_flags(name: str) -> set[str]:
    group = typer.main.get_group(app)
    command: Any = group
    for word in name.split():
        command = command.get_command(None, word)  # type: ignore[arg-type]
    return {
        opt for param in command.params for opt in (*param.opts, *param.secondary_opts) if opt.startswith("-")
    }


@pytest.mark.parametrize("name", list(flagtable.COMMANDS))
def test_both_clis_take_the_flags_of_the_one_table(name: str) -> None:
    """A flag added to a full command but not to the table (so not to the downloaded file) fails here."""
    table = {opt for flag in flagtable.COMMANDS[name].flags for opt in flag.names}
    assert _full_flags(name) - {"--help", "-h"} == table | FULL_ONLY[name]


# ---- the oldest claimed Python in a container -------------------------------------------------

LIBRARIES = (
    "libc.so.6",
    "libm.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "libutil.so.1",
    "libz.so.1",
    "libffi.so.8",
)


def _skipped(name: str, parts: tuple[str, ...]) -> bool:
    return any(f"/{part}" in name for part in parts)


def python_rootfs_tar(dest: Path) -> Path:
    """A root of busybox and the 3.8 build with the host libraries it links: a stock image's python3."""
    root = OLDEST.parent.parent
    skip = ("test", "idlelib", "tkinter", "ensurepip", "site-packages", "lib2to3", "turtledemo", "config-3.8")
    tar_path = dest / "python38.tar"
    libdir = Path("/lib/x86_64-linux-gnu")
    with tarfile.open(tar_path, "w") as tar:
        tar.add("/bin/busybox", "bin/busybox")
        for tool in ("sh", "wget", "chmod", "cat"):
            link = tarfile.TarInfo(f"bin/{tool}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
        # At the path it was built for: its interpreter finds libpython and its library there.
        tar.add(str(root), str(root.relative_to("/")), filter=lambda t: None if _skipped(t.name, skip) else t)
        for name, target in (("usr/bin/python3", str(OLDEST)), ("usr/bin/env", "/bin/busybox")):
            link = tarfile.TarInfo(name)
            link.type, link.linkname = tarfile.SYMTYPE, target
            tar.addfile(link)
        for lib in LIBRARIES:
            if (libdir / lib).exists():
                tar.add(str((libdir / lib).resolve()), f"lib/x86_64-linux-gnu/{lib}")
        tar.add(str(Path("/lib64/ld-linux-x86-64.so.2").resolve()), "lib64/ld-linux-x86-64.so.2")
    return tar_path


def test_the_document_line_runs_in_a_container_with_python_3_8(
    clean: LiveServer, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    oldest_python()
    engine = request.getfixturevalue("docker_engine")
    client: Any = engine.client
    tag = "hai-test/python38:portable"
    with open(python_rootfs_tar(tmp_path), "rb") as tar:
        client.api.import_image_from_data(tar.read(), repository="hai-test/python38", tag="portable")
    line = (
        f"wget -q {clean.url}/cli/hai -O /bin/hai && chmod +x /bin/hai && "
        "hai submit cpu --name=gpu-job --code-dir=/tmp 'python3 -c pass' && hai res -o name"
    )
    env = {"HAI_SERVER": clean.url, "HAI_TOKEN": "alice-token", "PATH": "/usr/bin:/bin"}
    output = client.containers.run(
        tag, ["/bin/sh", "-c", line], environment=env, network_mode="host", remove=True
    )
    created, *packages = output.decode().splitlines()
    assert re.fullmatch(r"created task \d+", created)
    assert packages == ["100", "454", "455", "456", "457"]
    assert clean.client().job(int(created.split()[-1])).user == "alice"


def test_the_file_holds_the_modules_it_is_built_from() -> None:
    from hai_airflow.server.api.routes.cli_download import MODULES, portable_cli

    text = portable_cli().decode()
    for name in MODULES:
        assert f"({name!r}, '''" in text
    assert io.StringIO(text).readline() == "#!/usr/bin/env python3\n"
    assert str(REPO) not in text
