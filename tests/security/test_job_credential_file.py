"""With `run_as = "{user}"` a job's credential file is its owner's account's alone: 0600, owned by that
account, in a work dir only it enters. Real server as root, real OS accounts."""

from __future__ import annotations

import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hai_airflow.client import HaiClient
from hai_airflow.spec import CpuJobSpec
from tests.support.accounts import Account, made_account
from tests.support.live_server import TEST_CONFIG, LiveServer, start_server


@pytest.fixture(scope="module")
def accounts() -> Iterator[tuple[Account, Account]]:
    with made_account("hjca") as owner, made_account("hjcb") as other:
        yield owner, other


@pytest.fixture
def server(open_dir: Path, accounts: tuple[Account, Account]) -> Iterator[LiveServer]:
    owner, _ = accounts
    config = TEST_CONFIG.replace('"alice"', f'"{owner.name}"')
    config = config.replace("[[nodes]]", '[backend]\nrun_as = "{user}"\n\n[[nodes]]', 1)
    with start_server(open_dir / "home", config) as live:
        yield live


def test_the_credential_file_is_readable_by_the_jobs_account_alone(
    server: LiveServer, open_dir: Path, accounts: tuple[Account, Account]
) -> None:
    owner, other = accounts
    code = open_dir / "code"
    code.mkdir(mode=0o755)
    with server.client("alice-token") as client:
        cmd = 'test -r "$HAI_TOKEN_FILE" && echo "the job reads it"; sleep 30'
        job = client.submit(CpuJobSpec(task_name="owned", code_path=str(code), cmd=cmd))
        deadline = time.monotonic() + 30
        while client.job(job.id).state != "RUNNING":
            assert time.monotonic() < deadline, client.job(job.id).reason
            time.sleep(0.1)
        (inst,) = client.instances(job.id)
        path = server.home / "jobs" / str(job.id) / "instances" / str(inst.id) / "hai-token"
        while "the job reads it" not in client.log(inst.id):
            assert time.monotonic() < deadline, client.log(inst.id)
            time.sleep(0.1)
    info, work = path.stat(), path.parent.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (owner.uid, owner.gid, 0o600)
    assert (work.st_uid, stat.S_IMODE(work.st_mode)) == (owner.uid, 0o700)
    # Another account on the machine reads neither the file nor the work dir.
    peek = subprocess.run(
        ["cat", str(path)], user=other.uid, group=other.gid, capture_output=True, text=True, timeout=10
    )
    assert peek.returncode != 0 and "Permission denied" in peek.stderr
    # What the job reads acts as its owner.
    with HaiClient(server=server.url, token=path.read_text().strip()) as job_client:
        assert job_client.whoami()["user"] == owner.name
