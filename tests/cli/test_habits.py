"""The habits scripts and fingers bring from kubectl and squeue, through the real CLI against a live server:
output formats, piped and terminal tables, waiting, watching, ids as arguments, global flags, completion."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from hai_airflow.cli.queue_cmd import eta
from hai_airflow.cli.wait import TIMED_OUT
from hai_airflow.scheduling.eta import start_estimate
from tests.cli.conftest import Hai, free_port, json_out
from tests.cli.test_live import as_user, created_id, python, wait_for
from tests.support.live_server import LiveServer

BOX = re.compile("[\u2500-\u257f]")
"""Box-drawing characters: none may reach a pipe."""

COLOUR = re.compile(r"\x1b\[[0-9;]*3[0-7][0-9;]*m")
"""An SGR escape that sets a foreground colour."""

RUN_HAI = "from hai_airflow.cli.main import app; app(prog_name='hai')"

TICKS = "import sys, time\nfor i in range({n}):\n    print('tick', i, flush=True)\n    time.sleep({pause})\n"


@pytest.fixture
def code(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "ok.py").write_text("print('done', flush=True)\n", encoding="utf-8")
    (code / "fail.py").write_text("raise SystemExit(3)\n", encoding="utf-8")
    (code / "long.py").write_text(TICKS.format(n=600, pause=0.2), encoding="utf-8")
    (code / "short.py").write_text(TICKS.format(n=6, pause=0.5), encoding="utf-8")
    return code


def submit(hai: Hai, env: dict[str, str], code: Path, script: str, *extra: str) -> int:
    result = hai("submit", "cpu", f"--name={script}", f"--code-dir={code}", *extra, python(script), env=env)
    assert result.exit_code == 0, result.output
    return created_id(result.stdout)


def hai_process(args: list[str]) -> list[str]:
    return [sys.executable, "-c", RUN_HAI, *args]


def process_env(server: LiveServer, user: str, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAI_") and k != "NO_COLOR"}
    env.update(as_user(server, user), HAI_HOME=str(home), **extra)
    return env


def run_in_terminal(args: list[str], env: dict[str, str], timeout: float = 120) -> tuple[int, str]:
    """Run `hai ARGS` with a pseudo-terminal as stdin, stdout and stderr; its exit code and all it wrote."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: exec at once, nothing else
        os.execve(sys.executable, [sys.executable, "-c", RUN_HAI, *args], env)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1)
            if not ready:
                continue
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks).decode("utf-8", "replace")


# ---- output formats -------------------------------------------------------------------------


def test_listings_piped_are_plain_columns_in_every_format(hai: Hai, clean: LiveServer, code: Path) -> None:
    alice, admin = as_user(clean, "alice"), as_user(clean, "admin")
    named = hai(
        "submit",
        "cpu",
        "--name=名字 with spaces",
        f"--code-dir={code}",
        "-o",
        "name",
        python("ok.py"),
        env=alice,
    )
    assert named.exit_code == 0, named.output
    job = int(named.stdout.strip())  # -o name: the id alone
    wait_for(clean, job, {"SUCCEEDED"})

    table = hai("task", env=alice)
    assert table.exit_code == 0
    assert not BOX.search(table.stdout) and "\x1b" not in table.stdout
    lines = table.stdout.splitlines()
    header = lines[0].split()
    assert header[:2] == ["ID", "NAME"] and "AGE" in header and "USER" not in header
    # `hai task | awk '{print $1}'`: the ids, one per line, under the header.
    assert str(job) in [line.split()[0] for line in lines[1:]]
    assert all(line == line.rstrip() for line in lines)

    bare = hai("task", "--no-headers", env=alice).stdout.splitlines()

    # AGE may tick between the two listings: durations ("0s", "3m") are compared as their shape.
    def untimed(line: str) -> list[str]:
        return [re.sub(r"^(\d+[smhd])+$", "<duration>", word) for word in line.split()]

    assert [untimed(line) for line in bare] == [untimed(line) for line in lines[1:]]

    wide = hai("task", "-o", "wide", env=alice).stdout.splitlines()[0].split()
    assert {"USER", "GROUP", "SUBMITTED", "PLACEMENT", "REASON"} <= set(wide)
    everyone = hai("task", "--all", env=admin).stdout.splitlines()[0].split()
    assert "USER" in everyone, "a listing that spans users names them"
    # --all is what its help says: every task you may see (your group's only if you administer it)
    assert "groups you administer" in " ".join(hai("task", "--help").stdout.split())
    ids_of = {
        who: [int(n) for n in hai("task", "--all", "-o", "name", env=as_user(clean, who)).stdout.split()]
        for who in ("bob", "carol")
    }
    assert job not in ids_of["bob"] and job in ids_of["carol"], ids_of

    as_json = json_out(hai("task", "-o", "json", env=alice))
    assert as_json == json_out(hai("task", "--json", env=alice))
    as_yaml = hai("task", "-o", "yaml", env=alice)
    assert yaml.safe_load(as_yaml.stdout) == as_json
    assert [int(n) for n in hai("task", "-o", "name", env=alice).stdout.split()] == [j["id"] for j in as_json]

    one = hai("task", str(job), "-o", "yaml", env=alice)
    assert yaml.safe_load(one.stdout)["task_name"] == "名字 with spaces"
    res = hai("res", "--no-headers", "-o", "wide", env=alice).stdout
    assert not BOX.search(res) and res.split()[0] == "100"


def test_terminal_tables_have_colour_unless_no_color(
    clean: LiveServer, code: Path, tmp_path: Path, hai: Hai
) -> None:
    alice = as_user(clean, "alice")
    job = submit(hai, alice, code, "ok.py")
    wait_for(clean, job, {"SUCCEEDED"})
    env = process_env(clean, "alice", tmp_path, TERM="xterm-256color", COLUMNS="200")

    code_tty, shown = run_in_terminal(["task"], env)
    assert code_tty == 0, shown
    assert COLOUR.search(shown), "states are coloured on a terminal"
    assert "SUCCEEDED" in shown and BOX.search(shown), "a terminal gets rich's table"

    code_plain, plain = run_in_terminal(["task"], {**env, "NO_COLOR": "1"})
    assert code_plain == 0 and "SUCCEEDED" in plain
    assert not COLOUR.search(plain), "NO_COLOR: no colour at all"

    piped = subprocess.run(hai_process(["task"]), env=env, capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and "SUCCEEDED" in piped.stdout
    assert "\x1b" not in piped.stdout and not BOX.search(piped.stdout), "piped: plain text"


# ---- waiting --------------------------------------------------------------------------------


def test_wait_exits_with_the_outcome(hai: Hai, clean: LiveServer, code: Path) -> None:
    alice = as_user(clean, "alice")
    waited = hai("submit", "cpu", "--name=ok", f"--code-dir={code}", "--wait", python("ok.py"), env=alice)
    assert waited.exit_code == 0, waited.output
    ok = created_id(waited.stdout.splitlines()[0] + "\n")
    assert waited.stdout.splitlines()[-1] == f"task {ok} SUCCEEDED"

    failed = submit(hai, alice, code, "fail.py")
    result = hai("wait", str(failed), env=alice)
    assert result.exit_code == 1, result.output
    assert result.stdout.startswith(f"task {failed} FAILED")

    both = hai("wait", str(ok), "--task-id", str(failed), env=alice)
    assert both.exit_code == 1
    assert [line.split()[:3] for line in both.stdout.splitlines()] == [
        ["task", str(ok), "SUCCEEDED"],
        ["task", str(failed), "FAILED"],
    ]

    long = submit(hai, alice, code, "long.py")
    running = hai("wait", str(long), "--for", "running", "--timeout", "60", env=alice)
    assert running.exit_code == 0 and running.stdout.strip() == f"task {long} RUNNING"
    began = time.monotonic()
    timed_out = hai("wait", f"--task_id={long}", "--timeout", "1", env=alice)
    assert timed_out.exit_code == TIMED_OUT == 124
    assert time.monotonic() - began < 10
    assert timed_out.stdout.strip() == f"task {long} still RUNNING when the wait timed out"

    as_json = hai("wait", str(ok), "-o", "json", env=alice)
    assert as_json.exit_code == 0 and json_out(as_json)["state"] == "SUCCEEDED"
    created = hai(
        "create", "--task-name=w", f"--code-path={code}", "--resource-pkg=454", f"--cmd={python('fail.py')}",
        "--wait", "--wait-timeout=120", env=alice,
    )  # fmt: skip
    assert created.exit_code == 1 and "FAILED" in created.stdout.splitlines()[-1]
    unknown = hai("wait", "99999", env=alice)
    assert unknown.exit_code == 1 and unknown.stderr.startswith("Error: ") and "99999" in unknown.stderr


def test_wait_shows_the_state_on_a_terminal_and_nothing_extra_when_piped(
    hai: Hai, clean: LiveServer, code: Path, tmp_path: Path
) -> None:
    job = submit(hai, as_user(clean, "alice"), code, "short.py")
    wait_for(clean, job, {"RUNNING"})
    env = process_env(clean, "alice", tmp_path, TERM="xterm", COLUMNS="160")
    status, shown = run_in_terminal(["wait", str(job)], env)
    assert status == 0, shown
    assert f"task {job} is RUNNING" in shown, "a status line while it waits"
    assert shown.rstrip().endswith(f"task {job} SUCCEEDED")
    piped = subprocess.run(
        hai_process(["wait", str(job)]), env=env, capture_output=True, text=True, timeout=60
    )
    assert (piped.returncode, piped.stdout, piped.stderr) == (0, f"task {job} SUCCEEDED\n", "")


# ---- ids as arguments -----------------------------------------------------------------------


def test_ids_as_arguments_one_line_each_and_exit_1_if_any_failed(
    hai: Hai, clean: LiveServer, code: Path
) -> None:
    alice, dave = as_user(clean, "alice"), as_user(clean, "dave")
    first, second = submit(hai, alice, code, "long.py"), submit(hai, alice, code, "long.py")
    wait_for(clean, first, {"RUNNING"})
    detail = hai("task", str(first), env=alice)
    assert detail.exit_code == 0 and f"Task {first}" in detail.stdout and "Events" in detail.stdout
    two = json_out(hai("task", str(first), str(second), "--json", env=alice))
    assert [j["id"] for j in two] == [first, second]

    # RUNNING comes before the job's first line: wait for it (bounded), then ask for the last one.
    deadline = time.monotonic() + 60
    while "tick" not in hai("log", str(first), env=alice).stdout:
        assert time.monotonic() < deadline, "the job printed nothing in 60 s"
        time.sleep(0.2)
    tail = hai("log", str(first), "--tail", "1", env=alice)
    assert tail.exit_code == 0 and tail.stdout.startswith("tick") and tail.stdout.count("\n") == 1

    hidden = submit(hai, dave, code, "long.py")
    cancelled = hai("cancel", str(first), str(hidden), str(second), "--yes", env=alice)
    assert cancelled.exit_code == 1, "one of the three was not alice's to cancel"
    assert [line.split()[1:3] for line in cancelled.stdout.splitlines()] == [
        ["task", str(first)],
        ["task", str(second)],
    ]
    errors = cancelled.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("Error: ") and str(hidden) in errors[0]
    for job in (first, second):
        wait_for(clean, job, {"CANCELLED"})
    assert clean.client().job(hidden).state != "CANCELLED"

    again = hai("cancel", "--task-id", str(first), "--task_id", str(second), "--yes", "-o", "json", env=alice)
    assert again.exit_code == 1 and again.stdout == "" and len(again.stderr.strip().splitlines()) == 2


# ---- the queue's ETA and position -----------------------------------------------------------


def test_queue_shows_position_and_the_dashboards_eta(hai: Hai, clean: LiveServer, code: Path) -> None:
    alice, dave = as_user(clean, "alice"), as_user(clean, "dave")
    whole = hai(
        "submit", "standalone", "--name=whole", "--gpus=8", "--max-schedule=4", f"--code-dir={code}",
        python("long.py"), env=alice,
    )  # fmt: skip
    wait_for(clean, created_id(whole.stdout), {"RUNNING"})
    low = hai("submit", "standalone", "--name=low", f"--code-dir={code}", python("long.py"), env=dave)
    waiting = created_id(low.stdout)
    high = hai(
        "submit", "standalone", "--name=urgent", "--gpus=1", "--max-schedule=24", f"--code-dir={code}",
        python("long.py"), env=dave,
    )  # fmt: skip
    high_id = created_id(high.stdout)

    entries = {e["job"]["id"]: e for e in json_out(hai("queue", "-o", "json", env=dave))}
    assert {waiting, high_id} <= set(entries)
    table = hai("queue", env=dave).stdout.splitlines()
    header = table[0].split()
    assert header[:2] == ["POS", "TASK"] and "ETA" in header
    row = next(line for line in table[1:] if line.split()[1] == str(high_id))
    assert row.split()[0] == str(entries[high_id]["position"])

    with clean.client(dave["HAI_TOKEN"]) as client:
        entry = next(e for e in client.queue() if e.job.id == high_id)
    promised = eta(start_estimate(entry, None))
    assert promised is not None and promised.startswith("by "), "a high job's ETA is its max_schedule promise"
    assert promised in row
    explained = hai("queue", "--explain", str(high_id), env=dave).stdout
    assert re.search(rf"^expected start\s+{re.escape(promised)} \(max_schedule 24 h\)$", explained, re.M), (
        explained
    )
    due = entry.job.submitted_at.timestamp() + 24 * 3600
    assert datetime.fromtimestamp(due).strftime("%H:%M") in promised
    assert hai("queue", "-o", "name", env=dave).stdout.split()[0] == str(
        entries[min(entries, key=lambda i: entries[i]["position"])]["job"]["id"]
    )


# ---- watching -------------------------------------------------------------------------------


def test_watch_redraws_when_the_task_changes_and_stops_when_it_ended(
    clean: LiveServer, code: Path, tmp_path: Path, hai: Hai
) -> None:
    alice = as_user(clean, "alice")
    env = process_env(clean, "alice", tmp_path)
    job = submit(hai, alice, code, "short.py")
    wait_for(clean, job, {"RUNNING"})
    began = time.monotonic()
    watched = subprocess.run(
        hai_process(["task", str(job), "--watch", "--no-headers"]),
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    took = time.monotonic() - began
    assert watched.returncode == 0, watched.stderr
    states = re.findall(r"^state\s+(\S+)$", watched.stdout, re.M)
    assert states[0] == "RUNNING" and states[-1] == "SUCCEEDED", watched.stdout
    # The job runs about 3 s; a long-poll notices its end at once, a 10 s refresh would not.
    assert took < 9, took

    listing = subprocess.Popen(
        hai_process(["task", "--watch", "--no-headers"]),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        second = submit(hai, alice, code, "short.py")
        wait_for(clean, second, {"SUCCEEDED"})
        time.sleep(2)
    finally:
        listing.terminate()
        out, _ = listing.communicate(timeout=30)
    frames = [f for f in out.split("\n\n") if f.strip()]
    assert len(frames) >= 2, out
    last = next(line for line in frames[-1].splitlines() if line.split()[0] == str(second))
    assert "SUCCEEDED" in last


def test_watch_on_a_terminal_redraws_in_place_and_ctrl_c_stops_it(
    clean: LiveServer, code: Path, tmp_path: Path, hai: Hai
) -> None:
    job = submit(hai, as_user(clean, "alice"), code, "long.py")
    wait_for(clean, job, {"RUNNING"})
    env = process_env(clean, "alice", tmp_path, TERM="xterm", COLUMNS="200")
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(sys.executable, [sys.executable, "-c", RUN_HAI, "task", "--watch"], env)
    seen = b""
    deadline = time.monotonic() + 60
    while b"RUNNING" not in seen and time.monotonic() < deadline:
        if select.select([fd], [], [], 1)[0]:
            seen += os.read(fd, 65536)
    os.kill(pid, signal.SIGINT)
    # Read until the child has gone (the pty then reads EOF or EIO): closing it earlier would hang up
    # on a child still shutting down under load, which then dies of SIGHUP instead of exiting 130.
    until = time.monotonic() + 60
    with contextlib.suppress(OSError):
        while time.monotonic() < until:
            if select.select([fd], [], [], 1)[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                seen += chunk
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    text = seen.decode("utf-8", "replace")
    assert os.waitstatus_to_exitcode(status) == 130, text
    assert "\x1b[H\x1b[2J" in text and "hai task (watching; Ctrl-C to stop)" in text
    assert str(job) in text and "Traceback" not in text


# ---- global flags ---------------------------------------------------------------------------


def test_server_token_and_region_flags_beat_the_environment(
    hai: Hai, clean: LiveServer, code: Path, isolated_home: Path
) -> None:
    mine = submit(hai, as_user(clean, "dave"), code, "ok.py")
    dead = f"http://127.0.0.1:{free_port()}"
    wrong_env = {"HAI_SERVER": dead, "HAI_TOKEN": "alice-token"}
    for args in (
        ("--server", clean.url, "--token", "dave-token", "task", "--json"),
        ("task", "--server", clean.url, "--token", "dave-token", "--json"),
        ("--server", dead, "task", "--server", clean.url, "--token", "dave-token", "--json"),
    ):
        result = hai(*args, env=wrong_env)
        assert result.exit_code == 0, (args, result.output)
        assert mine in [j["id"] for j in json_out(result)], "dave's token, not alice's from HAI_TOKEN"

    (isolated_home / "client.toml").write_text(f'[regions]\nsh-a = "{clean.url}"\n', encoding="utf-8")
    by_region = hai("task", "--region", "sh-a", "--token", "dave-token", "-o", "name", env=wrong_env)
    assert by_region.exit_code == 0, by_region.output
    assert str(mine) in by_region.stdout.split()
    unknown = hai("res", "--region", "mars", env=wrong_env)
    assert unknown.exit_code == 2 and "unknown region 'mars'" in unknown.stderr
    assert "HAI_SERVER" in hai("--help").stdout and "beats" in hai("--help").stdout


def test_a_bad_region_names_where_it_came_from(hai: Hai, clean: LiveServer, isolated_home: Path) -> None:
    (isolated_home / "client.toml").write_text(f'[regions]\nsh-a = "{clean.url}"\n', encoding="utf-8")
    flag = hai("task", "--region", "mars", "--token", "dave-token")
    assert flag.exit_code == 2
    assert flag.stderr.startswith("Error: --region: unknown region 'mars' (known: sh-a). Give --region sh-a")
    assert "HAI_REGION" not in flag.stderr
    variable = hai("task", "--token", "dave-token", env={"HAI_REGION": "mars"})
    assert variable.exit_code == 2
    assert variable.stderr.startswith("Error: unknown region 'mars' in HAI_REGION (known: sh-a). Unset")
    assert "--region" not in variable.stderr
    # The default region: the one [regions] calls `default`, used when none is named.
    (isolated_home / "client.toml").write_text(f'[regions]\ndefault = "{clean.url}"\n', encoding="utf-8")
    assert hai("res", "-o", "name", "--token", "dave-token").exit_code == 0


# ---- completion -----------------------------------------------------------------------------


def test_completion_offers_task_ids_from_the_server_and_nothing_when_it_is_down(
    hai: Hai, clean: LiveServer, code: Path
) -> None:
    alice = as_user(clean, "alice")
    job = submit(hai, alice, code, "ok.py")
    running = submit(hai, alice, code, "long.py")
    wait_for(clean, job, {"SUCCEEDED"})
    words = {"_HAI_COMPLETE": "complete_bash", "COMP_WORDS": "hai cancel ", "COMP_CWORD": "2"}
    offered = hai(env={**alice, **words})
    assert offered.exit_code == 0, offered.output
    offered_ids = offered.stdout.split()
    assert str(running) in offered_ids and str(job) not in offered_ids, "only what can be cancelled"
    log_words = {"_HAI_COMPLETE": "complete_bash", "COMP_WORDS": "hai log ", "COMP_CWORD": "2"}
    assert str(job) in hai(env={**alice, **log_words}).stdout.split(), "hai log takes any task id"
    instance_words = {**log_words, "COMP_WORDS": "hai log --instance-id ", "COMP_CWORD": "3"}
    instances = json_out(hai("instance", str(job), "--json", env=alice))
    assert str(instances[0]["id"]) in hai(env={**alice, **instance_words}).stdout.split()
    package_words = {**words, "COMP_WORDS": "hai create --resource-pkg 45", "COMP_CWORD": "3"}
    assert hai(env={**alice, **package_words}).stdout.split() == ["454", "455", "456", "457"]

    down = {**alice, "HAI_SERVER": f"http://127.0.0.1:{free_port()}"}
    began = time.monotonic()
    silent = hai(env={**down, **words})
    assert silent.exit_code == 0 and silent.stdout.strip() == "" and silent.stderr == ""
    assert time.monotonic() - began < 5


def test_install_completion_writes_the_shell_hook(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "SHELL": "/bin/bash"}
    script = f'{sys.executable} -c "{RUN_HAI}" --install-completion; true'
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "completion installed" in done.stdout.lower(), done.stdout
    assert "_HAI_COMPLETE" in "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file())


# ---- progress -------------------------------------------------------------------------------


def test_sim_shows_progress_on_a_terminal_only(tmp_path: Path) -> None:
    nodes = tmp_path / "NODES.csv"
    nodes.write_text("name,gpu_type,gpus,cpus,memory_gb\nn1,V100,8,96,768\n", encoding="utf-8")
    jobs = tmp_path / "JOBS.csv"
    header = (
        "job_id,submit_time,duration,workers,gpus_per_worker,gpu_type,max_schedule,group,user,cpus,memory_gb"
    )
    rows = [f"{i},{i * 10},3600,1,1,,0,,,," for i in range(1, 200)]
    jobs.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    args = ["sim", "--nodes", str(nodes), "--jobs", str(jobs), "--compare", "seed,fifo"]
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"} | {"TERM": "xterm", "COLUMNS": "160"}

    code_tty, shown = run_in_terminal(args, env)
    assert code_tty == 0, shown
    assert "jobs finished" in shown and "seed" in shown and "fifo" in shown

    piped = subprocess.run([sys.executable, "-c", RUN_HAI, *args], env=env, capture_output=True, text=True)
    assert piped.returncode == 0 and "jobs finished" not in piped.stdout + piped.stderr
    assert piped.stderr == "" and not BOX.search(piped.stdout)
    as_json = subprocess.run(
        [sys.executable, "-c", RUN_HAI, *args, "-o", "json"], env=env, capture_output=True, text=True
    )
    assert [s["policy"] for s in json.loads(as_json.stdout)] == ["seed", "fifo"]


def test_log_follow_reconnects_after_a_server_restart_without_repeating_lines(
    live_server: LiveServer, code: Path, tmp_path: Path, hai: Hai
) -> None:
    alice = as_user(live_server, "alice")
    (code / "ticks.py").write_text(TICKS.format(n=40, pause=0.25), encoding="utf-8")
    job = submit(hai, alice, code, "ticks.py")
    wait_for(live_server, job, {"RUNNING"})
    env = process_env(live_server, "alice", tmp_path)
    follower = subprocess.Popen(
        hai_process(["log", "--task-id", str(job), "-f"]),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(2)
    live_server.stop()
    time.sleep(1.5)
    live_server.start()
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err
    ticks = [int(line.split()[1]) for line in out.splitlines() if line.startswith("tick")]
    assert ticks == list(range(len(ticks))), "no line repeated or lost across the reconnect"
    assert ticks[-1] >= 10, out
