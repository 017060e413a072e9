"""`hai exec` and `hai cp` act as the task's own account (`run_as`), never as the root server: a command
runs as that account, and a file in the model dir that the account may not read is not copied, however
it got there (a root-only file, a hard link to one)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from hai_airflow.client import HaiClient, HaiError
from hai_airflow.spec import CpuJobSpec
from tests.support.live_server import TEST_CONFIG, TOKENS, LiveServer

NOBODY = 65534


def _running(client: HaiClient, spec: CpuJobSpec, ready: Path) -> int:
    job = client.submit(spec)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline, client.job(job.id)
        time.sleep(0.05)
    return job.id


def test_exec_and_cp_act_as_the_tasks_account(open_dir: Path) -> None:
    model, code = open_dir / "model", open_dir / "code"
    for d in (model, code):
        d.mkdir()
        d.chmod(0o777)
    config = TEST_CONFIG.replace("[[nodes]]", '[backend]\nrun_as = "nobody"\n\n[[nodes]]', 1)
    secret = open_dir / "root-only"
    secret.write_text("ROOT-SECRET")
    secret.chmod(0o600)
    script = "echo mine > $HAI_MODEL_DIR/mine.txt; touch ready; sleep 600"
    spec = CpuJobSpec(task_name="as-nobody", code_path=str(code), model_dir=str(model), cmd=script)
    with LiveServer(open_dir / "hai", config).start() as server, server.client(TOKENS["alice"]) as alice:
        job_id = _running(alice, spec, code / "ready")
        said = list(alice.exec(job_id, ["sh", "-c", "id -u; cat " + str(secret)]))
        output = "".join(item.get("output", "") for item in said)
        assert output.startswith(f"{NOBODY}\n") and "ROOT-SECRET" not in output, said
        assert said[-1]["exit_code"] == 1
        # Root puts files the account may not read into the model dir: they stay unread.
        (model / "root.txt").write_text("ROOT-SECRET")
        (model / "root.txt").chmod(0o600)
        os.link(secret, model / "hardlink")
        assert b"".join(alice.download(job_id, "mine.txt")) == b"mine\n"
        for name in ("root.txt", "hardlink"):
            try:
                got = b"".join(alice.download(job_id, name))
            except HaiError as refused:
                assert refused.status == 403 and "the task's account may not read" in refused.message
            else:
                raise AssertionError(f"{name} was copied: {got!r}")
        server.cancel_all()
