"""`hai cp` under attack (issue 56): a group admin swaps a member's model dir for a link to the member's
private dir; a job stops (SIGSTOP) its own cp readers and floods the server with copies; file names
that are not ASCII or carry CR/LF. Real server as root with `run_as = "{user}"`, real OS accounts and
a real group share, the real `hai` CLI."""

from __future__ import annotations

import contextlib
import functools
import grp
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from hai_airflow.client import HaiClient
from hai_airflow.endpoints import API, file_content_path
from hai_airflow.spec import CpuJobSpec
from tests.support.accounts import Account, made_account
from tests.support.latency import assert_answered_fast
from tests.support.live_server import TEST_CONFIG, TOKENS, LiveServer

HAI = [sys.executable, "-c", "from hai_airflow.cli.main import app; app(prog_name='hai')"]
SECRET = "ALICE-PRIVATE-KEY"
BUDGET = 4
"""`[limits] cp_streams_per_user` by default."""
BIG = 64 << 20
"""A file larger than what the loopback's socket buffers hold: a copy not read stays open."""
ENDS_WITHIN = 15.0
"""How long a copy whose reader the job stopped may take to end (a stuck reader is killed)."""
FLOOD = 45
"""Copies at once: more than the API's thread pool (40), so on old code every thread waits."""


@dataclass(frozen=True)
class Accounts:
    """OS accounts made for this module: `alice` (jobs run as her) and `carol` (her group's admin),
    both in the group `share` (alice's own supplementary group) that owns the group's directory."""

    alice: Account
    carol: Account

    @property
    def share(self) -> int:
        return self.alice.extra_gid


@pytest.fixture(scope="module")
def accounts() -> Iterator[Accounts]:
    with made_account("hcpa") as alice, made_account("hcpc") as carol:
        share = grp.getgrgid(alice.extra_gid).gr_name
        subprocess.run(["usermod", "-a", "-G", share, carol.name], check=True, capture_output=True)
        try:
            yield Accounts(alice, carol)
        finally:
            for account in (alice, carol):
                _kill_all_of(account.uid)


def _processes_of(uid: int) -> list[int]:
    """The pids of processes running as `uid` (the fresh accounts run nothing but this test's)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            status = (entry / "status").read_text()
            uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()
            if int(uids[1]) == uid:
                pids.append(int(entry.name))
    return pids


def _kill_all_of(uid: int) -> None:
    for pid in _processes_of(uid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _config(accounts: Accounts, allowed: str) -> str:
    alice, carol = f'"{accounts.alice.name}"', f'"{accounts.carol.name}"'
    users = TEST_CONFIG.replace('"alice"', alice).replace('"carol"', carol)
    users = users.replace("[[nodes]]", '[backend]\nrun_as = "{user}"\n\n[[nodes]]', 1)
    return f"[paths]\nallowed = [{allowed}]\n\n" + users


def _own(path: Path, account: Account, mode: int) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, account.uid, account.gid)
    path.chmod(mode)
    return path


def _hai(server: LiveServer, token: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    """The real `hai` CLI, as the holder of `token`; bytes out (a copy to stdout is a file's bytes)."""
    env = {**os.environ, "HAI_SERVER": server.url, "HAI_TOKEN": token, "HAI_HOME": str(server.home)}
    return subprocess.run([*HAI, *args], env=env, capture_output=True, timeout=120)


def _wait_until(what: str, ready: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def _running(client: HaiClient, spec: CpuJobSpec, code: Path) -> int:
    """Submit; wait until the task touched `ready-<its id>` in its code dir."""
    job = client.submit(spec)
    _wait_until(f"task {job.id} is running ({client.job(job.id).reason})", (code / f"ready-{job.id}").exists)
    return job.id


# ---- 1. the swapped share ------------------------------------------------------------------------


@pytest.fixture
def nas(open_dir: Path, accounts: Accounts) -> Path:
    """The "NAS": the group's share (root:share 2770, no sticky bit, as group shares are), alice's model
    dir in it, and alice's private dir (0700) with a key and a newer checkpoint in it."""
    nas = open_dir / "nas"
    nas.mkdir(mode=0o755)
    share = nas / "groups" / "vision"
    share.mkdir(parents=True)
    (nas / "groups").chmod(0o755)
    os.chown(share, 0, accounts.share)
    share.chmod(0o2770)
    alice = accounts.alice
    private = _own(nas / f"p{alice.name}", alice, 0o700)
    key = _own(private / "private", alice, 0o700) / "id_rsa"
    key.write_text(SECRET)
    os.chown(key, alice.uid, -1)
    key.chmod(0o600)
    newer = private / "checkpoint-99999999.pt"
    newer.write_text(SECRET)
    os.chown(newer, alice.uid, -1)
    for d in ("am", "control"):
        _own(share / d, alice, 0o2770)
    _own(private / "code", alice, 0o700)
    return nas


SAVES = "echo mine > $HAI_MODEL_DIR/checkpoint-00000001.pt; touch ready-$HAI_JOB_ID; sleep 600"


def _swap_as(account: Account, model_dir: Path, target: Path) -> None:
    """`mv am am.orig; ln -s TARGET am`, done by `account` (a member of the share, not its owner)."""
    script = f'mv "{model_dir}" "{model_dir}.orig" && ln -s "{target}" "{model_dir}"'
    done = subprocess.run(
        ["sh", "-c", script],
        user=account.uid,
        group=account.gid,
        extra_groups=os.getgrouplist(account.name, account.gid),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert model_dir.is_symlink()


def _checkpoint_seen(client: HaiClient, job_id: int, path: Path) -> bool:
    return client.job(job_id).latest_checkpoint == str(path)


def _scanned_after(client: HaiClient, control: int, control_dir: Path, rounds: int = 2) -> None:
    """Wait for `rounds` whole scans of every running job: each writes a newer checkpoint in the control
    job's model dir and waits until the scanner reports it."""
    for n in range(rounds):
        path = control_dir / f"checkpoint-c{n}.pt"
        path.write_text("control")
        os.utime(path, (time.time() + n + 1, time.time() + n + 1))
        _wait_until(f"the scanner reports {path}", functools.partial(_checkpoint_seen, client, control, path))


def _refused_everywhere(server: LiveServer, carol: str, job_id: int, out: Path) -> None:
    """carol's copies of alice's private key through the swapped model dir: the CLI and the REST
    endpoints refuse with a 4xx naming the model dir and the fix, and show nothing of the file."""
    said = _hai(server, carol, "cp", f"{job_id}:private/id_rsa", "-")
    assert said.returncode == 1, said
    assert SECRET.encode() not in said.stdout + said.stderr
    assert b"is a symbolic link" in said.stderr and b"put the directory back" in said.stderr
    whole = _hai(server, carol, "cp", f"{job_id}:", str(out))
    assert whole.returncode == 1 and SECRET.encode() not in whole.stdout + whole.stderr, whole
    assert not any(SECRET in p.read_text() for p in out.rglob("*") if p.is_file())
    headers = {"Authorization": f"Bearer {carol}"}
    for url in (file_content_path(job_id), f"{API}/jobs/{job_id}/files"):
        answer = httpx.get(server.url + url, params={"path": "private/id_rsa"}, headers=headers, timeout=30)
        assert answer.status_code == 403 and SECRET not in answer.text, answer.text
        body = answer.json()
        assert body["field"] == "spec.model_dir" and "symbolic link" in body["error"] and body["fix"], body


@pytest.mark.parametrize(
    "allowed",
    [
        pytest.param('"{nas}"', id="one root for the whole NAS"),
        pytest.param('"{nas}/groups/{{group}}", "{nas}/p{{user}}"', id="a root per group and per user"),
    ],
)
def test_a_swapped_group_share_leads_no_copy_and_no_scan_to_the_owners_private_dir(
    open_dir: Path, accounts: Accounts, nas: Path, allowed: str
) -> None:
    """Finding 3: carol, admin of alice's group, swaps alice's model dir in the group share for a link
    to alice's private dir. Copies as carol (who may read alice's task) are refused, while it runs and
    after it ended, and the checkpoint scan reports nothing from the private dir."""
    share, private = nas / "groups" / "vision", nas / f"p{accounts.alice.name}"
    config = _config(accounts, allowed.format(nas=nas))
    code = private / "code"
    alice_token, carol_token = TOKENS["alice"], TOKENS["carol"]
    with LiveServer(open_dir / "hai", config).start() as server, server.client(alice_token) as alice:
        spec = CpuJobSpec(task_name="am", code_path=str(code), model_dir=str(share / "am"), cmd=SAVES)
        job_id = _running(alice, spec, code)
        control_spec = spec.model_copy(update={"model_dir": str(share / "control"), "task_name": "c"})
        control = _running(alice, control_spec, code)
        mine = share / "am" / "checkpoint-00000001.pt"
        os.utime(mine, (time.time() - 600, time.time() - 600))
        _wait_until("the scan reports alice's checkpoint", lambda: _checkpoint_seen(alice, job_id, mine))
        before = _hai(server, carol_token, "cp", f"{job_id}:checkpoint-00000001.pt", "-")
        assert before.returncode == 0 and before.stdout == b"mine\n", before  # carol may read the task

        later = time.time() + 3600  # newer than anything the scan saw: on old code it is reported
        os.utime(private / "checkpoint-99999999.pt", (later, later))
        _swap_as(accounts.carol, share / "am", private)
        _refused_everywhere(server, carol_token, job_id, open_dir / "out-running")
        _scanned_after(alice, control, share / "control")
        assert alice.job(job_id).latest_checkpoint == str(mine)

        alice.cancel(job_id)
        _wait_until("the task ended", lambda: alice.job(job_id).state == "CANCELLED")
        _refused_everywhere(server, carol_token, job_id, open_dir / "out-ended")


# ---- 2. a stopped reader, a flood of copies ---------------------------------------------------------

STOPPER = """\
import os, pathlib, signal, time
model = pathlib.Path(os.environ["HAI_MODEL_DIR"])
with open(model / "big.bin", "wb") as f:
    f.write(bytes({big}))
pathlib.Path("ready-" + os.environ["HAI_JOB_ID"]).touch()
me, flag, stopped = os.getuid(), pathlib.Path("stop-readers"), pathlib.Path("stopped")
while True:
    for pid in os.listdir("/proc") if flag.exists() else []:
        try:
            if not pid.isdigit() or os.stat(f"/proc/{{pid}}").st_uid != me:
                continue
            argv = open(f"/proc/{{pid}}/cmdline", "rb").read().split(b"\\0")
            state = open(f"/proc/{{pid}}/stat", "rb").read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if argv[1:4] == [b"-I", b"-S", b"-c"] and state != b"T":
            os.kill(int(pid), signal.SIGSTOP)
            with open(stopped, "a") as f:
                f.write(pid + "\\n")
    time.sleep(0.01)
"""
"""Alice's job: writes a big file, then stops (SIGSTOP) every cp reader of its account it sees while
the file `stop-readers` exists in its code dir; `stopped` appears once it stopped one."""


@pytest.fixture
def stopper(open_dir: Path, accounts: Accounts) -> Iterator[tuple[LiveServer, int, Path]]:
    """A server with alice's stopper job running: (server, task id, its code dir)."""
    nas = open_dir / "nas"
    nas.mkdir(mode=0o755)
    owner = accounts.alice
    private = _own(nas / f"p{owner.name}", owner, 0o755)
    code = _own(private / "code", owner, 0o755)
    (code / "stopper.py").write_text(STOPPER.format(big=BIG))
    model = _own(private / "m", owner, 0o755)
    config = _config(accounts, f'"{nas}"')
    with LiveServer(open_dir / "hai", config).start() as server, server.client(TOKENS["alice"]) as alice:
        spec = CpuJobSpec(
            task_name="stops", code_path=str(code), model_dir=str(model), cmd="python3 stopper.py"
        )
        job_id = _running(alice, spec, code)
        try:
            yield server, job_id, code
        finally:
            (code / "stop-readers").unlink(missing_ok=True)
            _kill_all_of(accounts.alice.uid)


def _get(server: LiveServer, user: str, url: str, timeout: float, **params: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {TOKENS[user]}"}
    return httpx.get(server.url + url, params=params, headers=headers, timeout=timeout)


FLOOD_SCRIPT = """\
import json, sys, threading, time, httpx
url, token, n, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
ended = []
def copy():
    started = time.monotonic()
    try:
        with httpx.stream("GET", url, params={"path": "big.bin"}, timeout=timeout,
                          headers={"Authorization": "Bearer " + token}) as answer:
            said = answer.read().decode() if answer.status_code != 200 else ""
            for _ in answer.iter_bytes():
                pass
            outcome = [answer.status_code, said]
    except httpx.HTTPError as e:
        outcome = [type(e).__name__, ""]
    ended.append([time.monotonic() - started, *outcome])
threads = [threading.Thread(target=copy) for _ in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(ended))
"""
"""`n` copies of the big file at once, each read whole: how long each took, its status and error."""


def test_a_stopped_reader_ends_its_copy_and_a_flood_never_slows_another_user(
    stopper: tuple[LiveServer, int, Path],
) -> None:
    """Finding 1 (cp): alice's job SIGSTOPs its own cp readers while alice floods the server with
    copies (from a process of their own). Each copy ends within a bound (its reader killed), dave's
    list answers within 1 s meanwhile, and copies past `[limits] cp_streams_per_user` get 429 naming it."""
    server, job_id, code = stopper
    (code / "stop-readers").touch()
    url = server.url + file_content_path(job_id)
    args = [url, TOKENS["alice"], str(FLOOD), str(ENDS_WITHIN + 10)]
    flood = subprocess.Popen([sys.executable, "-c", FLOOD_SCRIPT, *args], stdout=subprocess.PIPE, text=True)
    try:
        _wait_until("the job stopped a reader", (code / "stopped").exists)
        waits: list[float] = []
        while len(waits) < 3 or flood.poll() is None:
            started = time.monotonic()
            listed = _get(server, "dave", f"{API}/jobs", timeout=5)
            waits.append(time.monotonic() - started)
            assert listed.status_code == 200, listed.text
            time.sleep(0.1)
        assert_answered_fast(waits, "dave")
        out, _ = flood.communicate(timeout=ENDS_WITHIN + 30)
    finally:
        flood.kill()
        flood.wait()
    ended = json.loads(out)
    took, statuses = [e[0] for e in ended], [e[1] for e in ended]
    assert len(ended) == FLOOD and max(took) < ENDS_WITHIN, took
    assert 429 in statuses and 500 not in statuses, statuses
    refused = next(e[2] for e in ended if e[1] == 429)
    assert f"[limits] cp_streams_per_user = {BUDGET}" in refused, refused
    stopped = [int(pid) for pid in (code / "stopped").read_text().split()]
    _wait_until("no reader the job stopped is left", lambda: not any(map(_is_stopped_reader, stopped)), 10)


def _is_stopped_reader(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return argv[1:4] == [b"-I", b"-S", b"-c"] and state in (b"T", b"t")


def test_copies_past_the_budget_get_429_naming_it_and_others_are_untouched(
    stopper: tuple[LiveServer, int, Path],
) -> None:
    """Four copies of alice's held open (not read: a slow client): the fifth, through the real CLI and
    the REST endpoint, gets 429 naming `[limits] cp_streams_per_user`; carol, admin of alice's group,
    copies meanwhile; once one of alice's ends, alice copies again."""
    server, job_id, _ = stopper
    url = server.url + file_content_path(job_id)
    with contextlib.ExitStack() as held:
        http = held.enter_context(httpx.Client(headers={"Authorization": f"Bearer {TOKENS['alice']}"}))
        streams = [
            held.enter_context(http.stream("GET", url, params={"path": "big.bin"}, timeout=60))
            for _ in range(BUDGET)
        ]
        assert [s.status_code for s in streams] == [200] * BUDGET
        fifth = http.get(url, params={"path": "big.bin"}, timeout=30)
        assert fifth.status_code == 429, fifth.text
        assert f"[limits] cp_streams_per_user = {BUDGET}" in fifth.json()["error"], fifth.text
        assert "raise [limits] cp_streams_per_user" in fifth.json()["fix"]
        cli = _hai(server, TOKENS["alice"], "cp", f"{job_id}:big.bin", "-")
        assert cli.returncode == 1 and b"[limits] cp_streams_per_user = 4" in cli.stderr, cli.stderr
        assert cli.stdout == b""
        carol = _get(server, "carol", file_content_path(job_id), 60, path="big.bin")
        assert carol.status_code == 200 and len(carol.content) == BIG
    _wait_until(
        "alice may copy again",
        lambda: _get(server, "alice", f"{API}/jobs/{job_id}/files", 30, path="big.bin").status_code == 200,
        30,
    )


# ---- 3. names that are not ASCII, names with CR/LF ------------------------------------------------

NAMES = """\
import os, pathlib, time
model = pathlib.Path(os.environ["HAI_MODEL_DIR"])
(model / "sub").mkdir(exist_ok=True)
(model / "模型.pt").write_text("weights")
(model / "sub" / "第二.txt").write_text("second")
(model / "a\\r\\nb.pt").write_text("crlf")
(model / 'q"uote\\\\d.txt').write_text("quoted")
os.symlink("/etc", model / "l\\r\\nk")
pathlib.Path("ready-" + os.environ["HAI_JOB_ID"]).touch()
time.sleep(600)
"""


def test_names_that_are_not_ascii_or_carry_crlf_are_copied_with_their_names(tmp_path: Path) -> None:
    """Finding 11: `模型.pt` and a name with CR/LF, copied alone and in a whole-dir copy through the real
    CLI: no 500, no dropped connection, each file arrives under its own name; the header carries the
    exact name as RFC 5987 `filename*` and an ASCII fallback, never a raw CR/LF."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "names.py").write_text(NAMES, encoding="utf-8")
    with LiveServer(tmp_path / "hai", TEST_CONFIG).start() as server, server.client(TOKENS["alice"]) as alice:
        spec = CpuJobSpec(task_name="names", code_path=str(code), cmd=f"{sys.executable} names.py")
        job_id = _running(alice, spec, code)
        token = TOKENS["alice"]
        one = _hai(server, token, "cp", f"{job_id}:模型.pt", "-")
        assert one.returncode == 0 and one.stdout == b"weights", one
        crlf = _hai(server, token, "cp", f"{job_id}:a\r\nb.pt", str(tmp_path))
        assert crlf.returncode == 0 and (tmp_path / "a\r\nb.pt").read_text() == "crlf", crlf
        whole = _hai(server, token, "cp", f"{job_id}:", str(tmp_path / "run"))
        assert whole.returncode == 0, whole
        assert b"skipped l\\r\\nk: a link, not copied" in whole.stderr, whole.stderr
        got = {str(p.relative_to(tmp_path / "run")): p.read_text() for p in (tmp_path / "run").rglob("*.*")}
        assert got == {
            "模型.pt": "weights",
            "sub/第二.txt": "second",
            "a\r\nb.pt": "crlf",
            'q"uote\\d.txt': "quoted",
        }
        answer = _get(server, "alice", file_content_path(job_id), 30, path="a\r\nb.pt")
        said = answer.headers["content-disposition"]
        assert answer.status_code == 200 and "\r" not in said and "\n" not in said
        assert said == "attachment; filename=\"a__b.pt\"; filename*=UTF-8''a%0D%0Ab.pt"
        wide = _get(server, "alice", file_content_path(job_id), 30, path="模型.pt")
        assert wide.headers["content-disposition"].endswith("filename*=UTF-8''%E6%A8%A1%E5%9E%8B.pt")
