"""Nobody learns who is registered or which storages exist by asking about them, and a group admin
sets the quotas of the others in her group, not her own (issue 37, findings 10 and 11)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.security.cli import hai
from tests.support.live_server import TEST_CONFIG, TOKENS, LiveServer

STORAGES = """
[storages.10111]
path = "{home}/storage-10111"
groups = ["vision"]

[storages.20222]
path = "{home}/storage-20222"
groups = ["nlp"]
"""


@pytest.fixture
def server(tmp_path: Path, store_env: dict[str, str]) -> Iterator[LiveServer]:
    for sid in ("10111", "20222"):
        (tmp_path / "hai" / f"storage-{sid}").mkdir(parents=True)
    with LiveServer(tmp_path / "hai", TEST_CONFIG + STORAGES, store_env).start() as live:
        yield live


def as_user(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[user]}"}


def test_asking_for_a_user_answers_the_same_whether_or_not_they_exist(server: LiveServer) -> None:
    with httpx.Client(base_url=f"{server.url}/api/v1", timeout=30) as http:
        known = http.get("/jobs", params={"user": "dave"}, headers=as_user("bob"))
        ghost = http.get("/jobs", params={"user": "nosuchuser"}, headers=as_user("bob"))
        assert known.status_code == ghost.status_code == 403
        assert known.json()["error"].replace("dave", "X") == ghost.json()["error"].replace("nosuchuser", "X")
        assert "nlp" not in known.text  # dave's group is not named
        # a group admin lists her group's members, and only them
        assert http.get("/jobs", params={"user": "bob"}, headers=as_user("carol")).status_code == 200
        assert http.get("/jobs", params={"user": "dave"}, headers=as_user("carol")).status_code == 403

        other = http.put("/quotas/users/dave", json={"gpus": 4}, headers=as_user("carol"))
        nobody = http.put("/quotas/users/nosuchuser", json={"gpus": 4}, headers=as_user("carol"))
        assert other.status_code == nobody.status_code == 403
        assert "nlp" not in other.text


def test_an_unknown_storage_is_refused_like_another_groups_naming_only_ones_own(
    server: LiveServer, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    answers = {}
    for sid in ("20222", "99999"):
        done = hai(
            server,
            "alice",
            "submit",
            "cpu",
            "--name",
            "x",
            "--code-dir",
            str(code),
            "--project-storage",
            sid,
            "true",
        )
        assert done.returncode == 1, done.stderr  # a refusal (403), as for any storage not yours
        answers[sid] = done.stderr.replace(sid, "N")
    assert answers["20222"] == answers["99999"]
    assert "10111" in answers["99999"] and "20222" not in answers["99999"]
    with server.client() as admin:
        assert admin.jobs(all=True) == []
    # the platform admin, who sees every storage anyway, is told the id is unknown and which are known
    body = {
        "mode": "cpu",
        "task_name": "x",
        "code_path": str(code),
        "cmd": "true",
        "project_storage": [99999],
    }
    unknown = httpx.post(
        f"{server.url}/api/v1/jobs", json={"spec": body}, headers=as_user("admin"), timeout=30
    )
    assert unknown.status_code == 422 and unknown.json()["field"] == "spec.project_storage"
    assert "10111, 20222" in unknown.json()["fix"]


def test_a_group_admin_sets_the_others_quotas_not_her_own(server: LiveServer) -> None:
    own = hai(server, "carol", "quota", "set", "--user=carol", "--gpus=64")
    assert own.returncode != 0 and "a platform admin" in own.stderr, own.stdout + own.stderr
    others = hai(server, "carol", "quota", "set", "--user=bob", "--gpus=2")
    assert others.returncode == 0, others.stderr
    admin = hai(server, "admin", "quota", "set", "--user=carol", "--gpus=4")
    assert admin.returncode == 0, admin.stderr
    with server.client() as client:
        quotas = {q.group: q for q in client.quotas()}
    users = {u.user: u.quota_gpus for u in quotas["vision"].users}
    assert users["carol"] == 4 and users["bob"] == 2
