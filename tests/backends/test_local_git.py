"""Git mode of the local backend against a real local bare repository."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from hai_airflow.backends.common.gitcode import CLONE_FAILED_EXIT
from tests.support.gitrepo import bare_origin, silent_url

from .conftest import Cluster


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bare repository whose main branch and feature branch hold different train.sh files."""
    return bare_origin(
        tmp_path_factory.mktemp("git"),
        {
            "main": {"train.sh": "echo main code\n"},
            "feature": {"train.sh": 'echo "feature code in $(pwd)"\n'},
        },
    )


def test_git_mode_runs_a_fresh_checkout_of_the_branch(cluster: Cluster, origin: Path) -> None:
    h = cluster.start("sh train.sh", code_src="git", code_path=str(origin), git_branch="feature")
    assert cluster.wait(h.instance_id).exit_code == 0
    checkout = cluster.tmp / "instance-1" / "code"
    assert h.data["cwd"] == str(checkout)
    assert cluster.backend.read_log(h.instance_id) == f"feature code in {checkout}\n"


def test_git_mode_without_branch_uses_the_default_branch(cluster: Cluster, origin: Path) -> None:
    h = cluster.start("sh train.sh", code_src="git", code_path=str(origin))
    assert cluster.wait(h.instance_id).exit_code == 0
    assert cluster.backend.read_log(h.instance_id) == "main code\n"


def test_unknown_branch_ends_the_job_with_gits_message(cluster: Cluster, origin: Path) -> None:
    h = cluster.start("echo never", code_src="git", code_path=str(origin), git_branch="nope")
    assert cluster.wait(h.instance_id).exit_code == CLONE_FAILED_EXIT
    log = cluster.backend.read_log(h.instance_id)
    assert "fatal: Remote branch nope not found" in log
    assert f"hai: git clone of {origin} (branch nope) failed; the command was not started" in log
    assert "never" not in log


def test_unreachable_repository_ends_the_job(cluster: Cluster) -> None:
    h = cluster.start("echo never", code_src="git", code_path=str(cluster.tmp / "missing.git"))
    assert cluster.wait(h.instance_id).exit_code == CLONE_FAILED_EXIT
    assert "does not exist" in cluster.backend.read_log(h.instance_id)


def test_a_clone_that_hangs_is_the_jobs_own_and_ends_at_its_limit(cluster: Cluster, tmp_path: Path) -> None:
    """start() returns at once: the clone is the job's own process, not the caller's."""
    with silent_url() as url:
        backend = cluster.new_backend(git_timeout_seconds=2)
        launch = cluster.launch("echo never", code_src="git", code_path=url)
        launch = dataclasses.replace(launch, git_schemes=("http",))
        began = time.monotonic()
        h = backend.start(launch)
        cluster.handles.append(h)
        assert time.monotonic() - began < 1
        other = cluster.start("echo other")
        assert cluster.wait(other.instance_id).exit_code == 0
        assert cluster.wait(h.instance_id, timeout=15, backend=backend).exit_code == CLONE_FAILED_EXIT
        assert "failed; the command was not started" in backend.read_log(h.instance_id)


def test_multi_process_jobs_clone_once_per_process(cluster: Cluster, origin: Path) -> None:
    h = cluster.start(
        'echo "$(basename "$(pwd)")"',
        mode="distributed",
        gpus=((0,), (1,)),
        code_src="git",
        code_path=str(origin),
    )
    assert cluster.wait(h.instance_id).exit_code == 0
    assert sorted(cluster.backend.read_log(h.instance_id).splitlines()) == [
        "[worker 0] [rank 0] code-0",
        "[worker 1] [rank 1] code-1",
    ]
