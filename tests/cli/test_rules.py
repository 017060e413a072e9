"""The CLI's own rules: flags to spec, the package `hai submit` picks, what a command reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from hai_airflow.cli.control import asks_first, outcome_line
from hai_airflow.cli.jobspec import build_spec, join_command
from hai_airflow.cli.submit import smallest_package
from hai_airflow.spec import TERMINAL_STATES, JobView, ResourcePackageView


def package(
    id: int, gpus: int, gpu_type: str = "V100", cpus: float = 8, memory_gb: float = 64
) -> ResourcePackageView:
    return ResourcePackageView(
        id=id, name=f"{gpus}x{gpu_type}", gpu_type=gpu_type, gpus=gpus, cpus=cpus, memory_gb=memory_gb
    )


PACKAGES = (
    package(10, 8),
    package(11, 1, cpus=8),
    package(12, 1, cpus=4),
    package(13, 4),
    package(14, 1, gpu_type="P100"),
    package(15, 0, gpu_type="none"),
)


@pytest.mark.parametrize(
    ("gpus", "gpu_type", "chosen"),
    [
        pytest.param(1, "V100", 12, id="fewest CPUs among one-GPU V100 packages"),
        pytest.param(1, "p100", 14, id="GPU type in any case"),
        pytest.param(2, "V100", 13, id="no exact size: the next bigger package"),
        pytest.param(8, None, 10, id="any type"),
        pytest.param(16, "V100", None, id="nothing that big"),
        pytest.param(1, "T4", None, id="no such type"),
    ],
)
def test_smallest_package(gpus: int, gpu_type: str | None, chosen: int | None) -> None:
    found = smallest_package(PACKAGES, gpus, gpu_type)
    assert (found.id if found else None) == chosen


def test_ties_break_on_the_lowest_id() -> None:
    twins = (package(21, 1), package(20, 1))
    found = smallest_package(twins, 1, "V100")
    assert found is not None and found.id == 20


def test_build_spec_drops_unset_flags_so_spec_defaults_apply() -> None:
    spec = build_spec(
        "standalone",
        {"task_name": "训练", "code_path": "/c", "cmd": "x", "resource_pkg": 3, "image": None, "shm": None},
        {},
        "create",
    )
    assert spec.image == "local"
    assert spec.task_name == "训练"


@pytest.mark.parametrize(
    ("words", "command"),
    [
        pytest.param(
            ["python3 train.py --lr 0.1"], "python3 train.py --lr 0.1", id="one quoted string as written"
        ),
        pytest.param(
            ["python3", "a b.py", "--lr", "1"], "python3 'a b.py' --lr 1", id="words quoted as needed"
        ),
    ],
)
def test_join_command(words: list[str], command: str) -> None:
    assert join_command(words) == command


@pytest.mark.parametrize(
    ("state", "line"),
    [
        pytest.param("CANCELLED", "cancelled task 7 (now CANCELLED)", id="already done"),
        pytest.param("RUNNING", "cancelling task 7 (now RUNNING)", id="on its way"),
        pytest.param("SUSPENDED", "cancelling task 7 (now SUSPENDED)", id="suspended is not cancelled"),
    ],
)
def test_cancel_says_whether_it_happened_or_is_on_its_way(state: str, line: str) -> None:
    job = JobView.model_validate(
        {
            "id": 7,
            "task_name": "t",
            "mode": "standalone",
            "user": "u",
            "group": "g",
            "state": state,
            "priority": "low",
            "max_schedule": 0,
            "gpus": 1,
            "gpu_type": "V100",
            "workers": 1,
            "spec": {},
            "submitted_at": "2024-05-01T12:00:00Z",
        }
    )
    assert outcome_line("cancelled", "cancelling", job, TERMINAL_STATES) == line


@pytest.mark.parametrize(
    ("code_src", "code_path", "expected"),
    [
        pytest.param("nas", ".", "{cwd}", id="the current directory"),
        pytest.param("nas", "src/../code", "{cwd}/code", id="relative, normalised as cd would"),
        pytest.param("nas", "/nas/alice/code", "/nas/alice/code", id="absolute stays"),
        pytest.param("git", "https://example.org/r.git", "https://example.org/r.git", id="git URL stays"),
    ],
)
def test_a_relative_code_path_is_sent_as_the_absolute_directory_seen_from_here(
    code_src: str, code_path: str, expected: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(str(tmp_path))
    fields = {"task_name": "t", "code_src": code_src, "code_path": code_path, "resource_pkg": 457}
    fields["cmd"] = "true"
    spec = build_spec("standalone", fields, {}, "create")
    assert spec.code_path == expected.replace("{cwd}", str(tmp_path))


@pytest.mark.parametrize(
    ("tasks", "yes", "terminal", "asks"),
    [
        (1, False, True, False),  # one task: never asked, as scancel
        (1, False, False, False),
        (3, False, False, False),  # a script: no terminal to ask on, so it acts
        (3, False, True, True),  # a person cancelling several
        (3, True, True, False),
    ],
)
def test_cancel_asks_only_a_person_cancelling_several_tasks(
    tasks: int, yes: bool, terminal: bool, asks: bool
) -> None:
    assert asks_first(tasks, yes, terminal) is asks
