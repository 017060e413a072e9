"""Git mode of the local backend against a real local bare repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hai_airflow.backends.base import StartError

from .conftest import Cluster


def git(*args: str, cwd: Path) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bare repository whose main branch and feature branch hold different train.sh files."""
    root = tmp_path_factory.mktemp("git")
    bare = root / "origin.git"
    git("init", "--quiet", "--bare", "--initial-branch=main", str(bare), cwd=root)
    work = root / "work"
    git("clone", "--quiet", str(bare), str(work), cwd=root)
    git("checkout", "--quiet", "-b", "main", cwd=work)
    (work / "train.sh").write_text("echo main code\n")
    git("add", "train.sh", cwd=work)
    git("commit", "--quiet", "-m", "main", cwd=work)
    git("push", "--quiet", "origin", "main", cwd=work)
    git("checkout", "--quiet", "-b", "feature", cwd=work)
    (work / "train.sh").write_text('echo "feature code in $(pwd)"\n')
    git("commit", "--quiet", "-am", "feature", cwd=work)
    git("push", "--quiet", "origin", "feature", cwd=work)
    return bare


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


def test_unknown_branch_is_a_start_error_with_gits_message(cluster: Cluster, origin: Path) -> None:
    launch = cluster.launch("true", code_src="git", code_path=str(origin), git_branch="nope")
    expected = r"git clone of .*origin.git \(branch nope\) failed: fatal: Remote branch nope not found"
    with pytest.raises(StartError, match=expected):
        cluster.backend.start(launch)


def test_unreachable_repository_is_a_start_error(cluster: Cluster) -> None:
    launch = cluster.launch("true", code_src="git", code_path=str(cluster.tmp / "missing.git"))
    with pytest.raises(StartError, match=r"does not exist|not appear to be a git repository"):
        cluster.backend.start(launch)
