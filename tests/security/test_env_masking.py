"""`--env` values whose key names a secret are masked in every view of the job, for everyone: the REST
job view and list, `hai task` and its -o yaml/json, the dashboard's job page and the events; the job
itself gets the real value, and the other values show."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx

from tests.security.cli import hai
from tests.support.live_cli import module_server  # noqa: F401 (the fixture `server`)
from tests.support.live_server import TOKENS, LiveServer

MASK = "<masked>"
"""What every view shows for a secret value."""
SECRET = "abc-9f2e7d"
"""The value of HF_TOKEN: it must appear in no view, only in the job's own output."""
PRINT_ENV = "import os; print('token', os.environ['HF_TOKEN'], 'lr', os.environ['LR'], flush=True)"


def _submitted(server: LiveServer, code: Path) -> int:
    made = hai(
        server, "alice", "submit", "cpu", "--name=masked", f"--code-dir={code}",
        f"--env=HF_TOKEN={SECRET}", "--env=LR=0.1", "--env=db_password=hunter22", "--wait",
        f"{sys.executable} -c \"{PRINT_ENV}\"",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    return int(made.stdout.split("created task ")[1].split()[0])


def _without_log(html: str) -> tuple[str, str]:
    """The job page apart from its log (what the job printed), and the log."""
    start = html.index('<pre class="log" id="log"')
    end = html.index("</pre>", start)
    return html[:start] + html[end:], html[start:end]


def test_a_secret_env_value_is_masked_in_every_view_while_the_job_gets_it(
    server: LiveServer, tmp_path: Path
) -> None:
    task = _submitted(server, tmp_path)

    views = {
        "hai task": hai(server, "alice", "task", str(task)).stdout,
        "hai task -o yaml": hai(server, "alice", "task", str(task), "-o", "yaml").stdout,
        "hai task -o json": hai(server, "alice", "task", str(task), "-o", "json").stdout,
        "hai task --json (list)": hai(server, "alice", "task", "--json").stdout,
    }
    for user in ("alice", "admin", "carol"):  # the owner, a platform admin, the group's admin
        auth = {"Authorization": f"Bearer {TOKENS[user]}"}
        views[f"REST job as {user}"] = httpx.get(f"{server.url}/api/v1/jobs/{task}", headers=auth).text
        views[f"REST list as {user}"] = httpx.get(f"{server.url}/api/v1/jobs?all=true", headers=auth).text
        page = httpx.get(f"{server.url}/ui/jobs/{task}", cookies={"hai_ui_token": TOKENS[user]})
        assert page.status_code == 200 and f"Job #{task}" in page.text, page.text[:300]
        views[f"/ui/jobs/{task} as {user}"], log = _without_log(page.text)
        assert f"token {SECRET}" in log, "the page's log is the job's own output, as it printed it"
    for name, text in views.items():
        assert SECRET not in text and "hunter22" not in text, f"{name} shows a secret"
    job_file = views["hai task -o yaml"]
    assert 'LR: "0.1"' in job_file and f'HF_TOKEN: "{MASK}"' in job_file
    detail = json.loads(views["hai task -o json"])
    assert detail["spec"]["env"] == {"HF_TOKEN": MASK, "LR": "0.1", "db_password": MASK}
    assert detail["events"], "the events are among the views checked"
    assert "0.1" in views[f"/ui/jobs/{task} as alice"]

    # The job itself got the real value.
    log = hai(server, "alice", "log", str(task), "--tail", "0")
    assert f"token {SECRET} lr 0.1" in log.stdout, log.stdout + log.stderr


def test_another_user_sees_nothing_of_the_job(server: LiveServer, tmp_path: Path) -> None:
    task = _submitted(server, tmp_path)
    refused = hai(server, "dave", "task", str(task), "-o", "json")
    assert refused.returncode != 0 and SECRET not in refused.stdout + refused.stderr
