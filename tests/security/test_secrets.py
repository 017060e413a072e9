"""Secrets: tokens stored only as keyed hashes, private files, a clean job environment, jobs as another
OS user, per-user client keys, and no process of a cancelled job left behind."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import create_engine, text

from hai_airflow.client import HaiClient
from hai_airflow.server.store.database import MIGRATIONS
from hai_airflow.spec import JobView, StandaloneJobSpec
from tests.support.live_server import REPO, TEST_CONFIG, TOKENS, LiveServer, free_port

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
PLATFORM_NAMES = {"PATH", "HOME", "LANG", "USER", "LOGNAME", "PYTHONUNBUFFERED", "CUDA_VISIBLE_DEVICES"}
SHELL_NAMES = {"PWD", "SHLVL", "_", "OLDPWD"}
"""What /bin/sh itself adds to the environment it hands to `env`."""


def with_backend(option: str) -> str:
    """The test config with one `[backend]` option."""
    return TEST_CONFIG.replace("[[nodes]]", f"[backend]\n{option}\n\n[[nodes]]", 1)


def serve_expecting_refusal(home: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run `hai serve` on home/config.toml, expecting it to refuse to start (the test asserts how)."""
    args = [sys.executable, "-m", "hai_airflow.server", "--config", str(home / "config.toml")]
    return subprocess.run(
        [*args, "--port", str(free_port())],
        env={**os.environ, "HAI_HOME": str(home), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def std(code: Path, cmd: str, **kw: object) -> StandaloneJobSpec:
    return StandaloneJobSpec(task_name="t", code_path=str(code), cmd=cmd, resource_pkg=454, **kw)  # type: ignore[arg-type]


def wait_state(client: HaiClient, job_id: int, *states: str, timeout: float = 30) -> JobView:
    deadline = time.monotonic() + timeout
    job = client.job(job_id)
    while job.state not in states:
        assert time.monotonic() < deadline, f"job {job_id} is {job.state} ({job.reason}), not {states}"
        time.sleep(0.1)
        job = client.job(job_id)
    return job


def job_log(client: HaiClient, job_id: int) -> str:
    instance = client.instances(job_id)[-1]
    return client.log(instance.id)


def wait_for_file(path: Path, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return path.read_text().strip()


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting for its parent does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def stored_text(server: LiveServer, store_env: dict[str, str]) -> str:
    """Every byte the store holds about users, as text: the SQLite files, or PostgreSQL's users table."""
    url = store_env.get("HAI_DATABASE_URL")
    if url is None:
        files = [server.home / name for name in ("hai.db", "hai.db-wal")]
        return "".join(f.read_bytes().decode("latin-1") for f in files if f.exists())
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return repr(list(conn.execute(text("SELECT * FROM users"))))
    finally:
        engine.dispose()


@pytest.fixture
def code(tmp_path: Path) -> Path:
    path = tmp_path / "code"
    path.mkdir()
    return path


# ---- tokens at rest ------------------------------------------------------------------------------


def test_tokens_are_stored_only_as_keyed_hashes(tmp_path: Path, store_env: dict[str, str]) -> None:
    with LiveServer(tmp_path / "hai", TEST_CONFIG, store_env).start() as server:
        stored = stored_text(server, store_env)
        leaked = [t for t in TOKENS.values() if t in stored]
        assert not leaked, f"the store holds plaintext tokens {leaked}"
        with httpx.Client(base_url=server.url, timeout=10) as http:
            ok = http.get("/api/v1/quota", headers={"Authorization": "Bearer alice-token"})
            assert ok.status_code == 200
            # What the store holds is no credential: its hash does not log in.
            key = bytes.fromhex((server.home / "token.key").read_text().strip())
            digest = hmac.new(key, b"alice-token", hashlib.sha256).hexdigest()
            assert digest in stored
            r = http.get("/api/v1/quota", headers={"Authorization": f"Bearer {digest}"})
            assert r.status_code == 401 and r.json()["field"] == "Authorization"


def test_an_old_store_s_plaintext_tokens_are_hashed_and_still_work(tmp_path: Path) -> None:
    """Migration 0002 converts the tokens a 0001 store kept in plain text, keeping every login."""
    home = tmp_path / "hai"
    home.mkdir()
    url = f"sqlite:///{home / 'hai.db'}"
    engine = create_engine(url)
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0001")
        conn.execute(text("INSERT INTO groups (name, admins) VALUES ('vision', '[]')"))
        conn.execute(
            text("INSERT INTO users (name, group_name, role, token) VALUES ('erin', 'vision', 'user', :t)"),
            {"t": "erin-old-plaintext-token"},
        )
    engine.dispose()
    with LiveServer(home, TEST_CONFIG).start() as server:
        assert b"erin-old-plaintext-token" not in (home / "hai.db").read_bytes()
        with server.client("erin-old-plaintext-token") as erin:
            assert erin.whoami()["user"] == "erin"
        with server.client(TOKENS["alice"]) as alice:
            assert alice.whoami()["user"] == "alice"


def test_the_local_token_file_is_the_one_plain_copy_and_a_lost_one_is_reissued(tmp_path: Path) -> None:
    home = tmp_path / "hai"
    config = TEST_CONFIG.replace('token = "admin-token"\n', "")  # the admin's token is generated
    server = LiveServer(home, config)
    with server.start():
        first = server.token
        assert first != "admin-token" and mode(home / "token") == 0o600
        assert first not in stored_text(server, {})
    with server.start():
        assert server.token == first, "a restart keeps a token file that still matches"
    (home / "token").unlink()
    with server.start():
        second = server.token
        assert second != first
        with httpx.Client(base_url=server.url, timeout=10) as http:
            old = http.get("/api/v1/quota", headers={"Authorization": f"Bearer {first}"})
            assert old.status_code == 401 and old.json()["field"] == "Authorization"
            assert http.get("/api/v1/quota", headers={"Authorization": f"Bearer {second}"}).status_code == 200


def test_a_server_with_another_key_refuses_the_store(tmp_path: Path, store_env: dict[str, str]) -> None:
    env = store_env or {"HAI_DATABASE_URL": f"sqlite:///{tmp_path / 'shared.db'}"}
    with LiveServer(tmp_path / "a", TEST_CONFIG, env).start():
        pass
    second = tmp_path / "b"
    second.mkdir()
    (second / "config.toml").write_text(TEST_CONFIG)
    out = serve_expecting_refusal(second, env)
    assert out.returncode == 2, out.stderr
    assert "server.token_key_file" in out.stderr and "same key file" in out.stderr
    # The same key file lets it in.
    shared = {**env, "HAI_TOKEN_KEY_FILE": str(tmp_path / "a" / "token.key")}
    with LiveServer(second, TEST_CONFIG, shared).start() as b, b.client(TOKENS["alice"]) as alice:
        assert alice.whoami()["user"] == "alice"


# ---- private files -------------------------------------------------------------------------------


def test_first_start_creates_home_store_token_and_key_private(tmp_path: Path) -> None:
    home = tmp_path / "fresh" / "hai"
    port = free_port()
    log = tmp_path / "server.log"
    env = {k: v for k, v in os.environ.items() if k not in ("HAI_SERVER", "HAI_TOKEN", "HAI_DATABASE_URL")}
    env |= {"HAI_HOME": str(home), "PYTHONPATH": str(REPO)}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hai_airflow.server", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert mode(home) == 0o700
        for name in ("hai.db", "hai.db-wal", "hai.db-shm", "token", "token.key", "config.toml"):
            assert mode(home / name) == 0o600, name
    finally:
        proc.terminate()
        proc.wait(20)


def test_an_older_wider_store_is_made_private(tmp_path: Path) -> None:
    home = tmp_path / "hai"
    with LiveServer(home, TEST_CONFIG).start():
        pass
    home.chmod(0o755)
    for name in ("hai.db", "token"):
        (home / name).chmod(0o644)
    with LiveServer(home, TEST_CONFIG).start():
        assert mode(home) == 0o711, "others may still traverse, never list"
        assert mode(home / "hai.db") == 0o600 and mode(home / "token") == 0o600


# ---- what a job sees -----------------------------------------------------------------------------


def test_a_job_gets_only_the_environment_the_platform_defines(
    tmp_path: Path, store_env: dict[str, str], code: Path
) -> None:
    secret = "secret-value-3c0ffee"
    db_url = store_env.get("HAI_DATABASE_URL") or f"sqlite:///{tmp_path / 'hai' / 'hai.db'}"
    env = {"HAI_DATABASE_URL": db_url, "SECRET_X": secret, "AWS_SECRET_ACCESS_KEY": secret}
    with (
        LiveServer(tmp_path / "hai", TEST_CONFIG, env).start() as server,
        server.client(TOKENS["alice"]) as alice,
    ):
        job = alice.submit(std(code, "env -0 > job.env", env={"MINE": "kept"}))
        assert wait_state(alice, job.id, *TERMINAL).state == "SUCCEEDED"
        seen = dict(entry.split("=", 1) for entry in (code / "job.env").read_text().split("\0") if entry)
    assert "SECRET_X" not in seen and "HAI_DATABASE_URL" not in seen and "AWS_SECRET_ACCESS_KEY" not in seen
    assert not [k for k, v in seen.items() if secret in v or db_url in v]
    assert "HAI_HOME" not in seen, "the job is not told where the server's token lies"
    assert seen["MINE"] == "kept" and seen["HAI_JOB_ID"] == str(job.id)
    assert seen["LANG"] == "C.UTF-8" and seen["PYTHONUNBUFFERED"] == "1"
    assert seen["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    assert seen["HOME"].startswith(str(tmp_path / "hai" / "jobs"))
    unexpected = {
        k for k in seen if k not in PLATFORM_NAMES | SHELL_NAMES | {"MINE"} and not k.startswith("HAI_")
    }
    assert not unexpected, f"the job inherited {sorted(unexpected)}"


# ---- client keys ---------------------------------------------------------------------------------


def test_another_user_cannot_pre_claim_a_client_key(
    tmp_path: Path, store_env: dict[str, str], code: Path
) -> None:
    key = "airflow:dag:task:run:-1:1"  # predictable, as Airflow's keys are
    with LiveServer(tmp_path / "hai", TEST_CONFIG, store_env).start() as server:
        with server.client(TOKENS["bob"]) as bob, server.client(TOKENS["alice"]) as alice:
            squatter = bob.submit(std(code, "sleep 60", max_schedule=0), client_key=key)
            own = alice.submit(std(code, "true"), client_key=key)
            assert own.id != squatter.id and own.user == "alice"
            assert alice.submit(std(code, "true"), client_key=key).id == own.id, "still idempotent"
            found = alice.job_by_key(key)
            assert found is not None and found.id == own.id
            bob.cancel(squatter.id)
        with server.client(TOKENS["admin"]) as admin:
            # An admin's own lookup finds none of theirs; naming the user finds that user's job.
            assert admin.job_by_key(key) is None
            named = admin.jobs(user="alice", all=True)
            assert [j.id for j in named if j.id == own.id]


# ---- no process left behind ----------------------------------------------------------------------

ESCAPE = "setsid sh -c 'echo $$ > escaped.pid; exec sleep 1000' &"
"""A grandchild in a session (and process group) of its own, which writes its pid."""


def test_a_cancelled_job_leaves_no_setsid_grandchild(tmp_path: Path, code: Path) -> None:
    cmd = ESCAPE + " sleep 1000"
    with LiveServer(tmp_path / "hai", TEST_CONFIG).start() as server, server.client(TOKENS["alice"]) as alice:
        job = alice.submit(std(code, cmd))
        escaped = int(wait_for_file(code / "escaped.pid"))
        assert alive(escaped) and os.getsid(escaped) == escaped, "it runs in a session of its own"
        alice.cancel(job.id)
        assert wait_state(alice, job.id, *TERMINAL).state == "CANCELLED"
        deadline = time.monotonic() + 5
        while alive(escaped):
            assert time.monotonic() < deadline, f"pid {escaped} outlived the cancel of job {job.id}"
            time.sleep(0.05)


def test_a_job_that_ends_leaves_no_setsid_grandchild(tmp_path: Path, code: Path) -> None:
    cmd = ESCAPE + " while [ ! -s escaped.pid ]; do sleep 0.05; done"
    with LiveServer(tmp_path / "hai", TEST_CONFIG).start() as server, server.client(TOKENS["alice"]) as alice:
        job = alice.submit(std(code, cmd))
        assert wait_state(alice, job.id, *TERMINAL).state == "SUCCEEDED"
        escaped = int((code / "escaped.pid").read_text())
        deadline = time.monotonic() + 5
        while alive(escaped):
            assert time.monotonic() < deadline, f"pid {escaped} outlived job {job.id}"
            time.sleep(0.05)


# ---- run_as --------------------------------------------------------------------------------------


@pytest.fixture
def job_account() -> pwd.struct_passwd:
    """An unprivileged OS account for `run_as`; the test needs root to switch to it."""
    if os.geteuid() != 0:
        pytest.skip("run_as needs the test to run as root (it starts jobs as another OS user)")
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("there is no OS user 'nobody' to run jobs as")


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory other accounts may traverse (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="hai-run-as-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_run_as_jobs_cannot_read_the_store_token_or_key_and_own_their_files(
    open_dir: Path, job_account: pwd.struct_passwd
) -> None:
    home = open_dir / "hai"
    code = open_dir / "code"
    code.mkdir(mode=0o755)
    code.chmod(0o755)
    config = with_backend('run_as = "nobody"')
    secrets = {"store": home / "hai.db", "token": home / "token", "key": home / "token.key"}
    probes = "; ".join(
        f"if cat {path} > /dev/null 2>&1; then echo READ-{name}; else echo DENIED-{name}; fi"
        for name, path in secrets.items()
    )
    cmd = f'echo "uid=$(id -u)"; {probes}; echo x > "$HAI_MODEL_DIR/model.ckpt"; echo x > "$HOME/scratch"'
    with LiveServer(home, config).start() as server, server.client(TOKENS["alice"]) as alice:
        job = alice.submit(std(code, cmd))
        done = wait_state(alice, job.id, *TERMINAL)
        text_ = job_log(alice, job.id)
        assert done.state == "SUCCEEDED", text_
    assert f"uid={job_account.pw_uid}" in text_
    for name in secrets:
        assert f"DENIED-{name}" in text_ and f"READ-{name}" not in text_, text_
    model = home / "jobs" / str(job.id) / "model"
    assert (model / "model.ckpt").stat().st_uid == job_account.pw_uid
    scratch = next((home / "jobs" / str(job.id) / "instances").glob("*/scratch"))
    assert scratch.stat().st_uid == job_account.pw_uid
    assert mode(home) == 0o711 and mode(home / "hai.db") == 0o600


def test_a_job_lists_neither_the_jobs_nor_its_own_jobs_directory(
    open_dir: Path, job_account: pwd.struct_passwd
) -> None:
    """Finding 9: a job's account passes through $HAI_HOME/jobs to its own dirs, and lists none of
    them, so no job learns which jobs exist or where their model dirs are."""
    home, code = open_dir / "hai", open_dir / "code"
    code.mkdir(mode=0o755)
    code.chmod(0o755)
    own = 'dirname "$HAI_MODEL_DIR"'
    cmd = (
        f'ls "$({own})" > /dev/null 2>&1 && echo LISTED-JOB || echo DENIED-JOB; '
        f'ls "$(dirname "$({own})")" > /dev/null 2>&1 && echo LISTED-JOBS || echo DENIED-JOBS; '
        'echo x > "$HAI_MODEL_DIR/ok" && echo WROTE-MODEL'
    )
    with (
        LiveServer(home, with_backend('run_as = "nobody"')).start() as server,
        server.client(TOKENS["alice"]) as alice,
    ):
        first = alice.submit(std(code, "true"))
        wait_state(alice, first.id, *TERMINAL)
        job = alice.submit(std(code, cmd))
        done = wait_state(alice, job.id, *TERMINAL)
        log = job_log(alice, job.id)
        assert done.state == "SUCCEEDED", log
    assert "DENIED-JOB" in log and "DENIED-JOBS" in log and "WROTE-MODEL" in log, log
    for d in (home / "jobs", home / "jobs" / str(job.id), home / "jobs" / str(job.id) / "instances"):
        assert mode(d) == 0o711, d


def test_run_as_an_unknown_user_stops_the_server_naming_the_field(tmp_path: Path) -> None:
    home = tmp_path / "hai"
    home.mkdir()
    config = with_backend('run_as = "no-such-user-7f3a"')
    (home / "config.toml").write_text(config)
    out = serve_expecting_refusal(home, {})
    assert out.returncode == 2 and "backend.run_as" in out.stderr and "no-such-user-7f3a" in out.stderr
    assert not (home / "hai.db").exists()


# ---- tokens from the environment (compose) -------------------------------------------------------


def test_a_token_env_keeps_the_token_out_of_the_file_and_must_be_set(tmp_path: Path) -> None:
    config = TEST_CONFIG.replace('token = "admin-token"', 'token_env = "HAI_TEST_ADMIN_TOKEN"', 1)
    home = tmp_path / "hai"
    home.mkdir()
    (home / "config.toml").write_text(config)
    out = serve_expecting_refusal(home, {})
    assert out.returncode == 2, out.stderr
    assert "users[0].token_env" in out.stderr and "HAI_TEST_ADMIN_TOKEN is not set" in out.stderr
    assert not (home / "hai.db").exists()
    secret = "env-given-admin-token-5b7e1d"
    with LiveServer(home, config, {"HAI_TEST_ADMIN_TOKEN": secret}).start() as server:
        assert server.token == secret, "the local admin's token file holds the configured token"
        with server.client(secret) as admin:
            assert admin.whoami()["user"] == "admin"
        assert secret not in stored_text(server, {})


def test_a_job_cannot_choose_the_account_it_runs_as(tmp_path: Path, code: Path) -> None:
    """The supervisor's run_as variable comes from the platform only; one in the job's env is dropped."""
    me = os.geteuid()
    other = 65534 if me != 65534 else 0
    with LiveServer(tmp_path / "hai", TEST_CONFIG).start() as server, server.client(TOKENS["alice"]) as alice:
        job = alice.submit(std(code, "id -u > uid.txt", env={"HAI_RUN_AS": f"{other}:{other}:"}))
        assert wait_state(alice, job.id, *TERMINAL).state == "SUCCEEDED", job_log(alice, job.id)
    assert (code / "uid.txt").read_text().strip() == str(me)
