"""docs/walkthrough.md follows a submit through the code: every file and every name it gives exists,
so a move or a rename that leaves the page behind fails here."""

from __future__ import annotations

from tests.docs.code_names import QUOTED, REPO, page_problems

PAGE = REPO / "docs" / "walkthrough.md"
STEPS = (
    "hai_airflow/cli/submit.py",
    "hai_airflow/client.py",
    "hai_airflow/server/api/routes/jobs.py",
    "hai_airflow/server/intake/submission.py",
    "hai_airflow/server/intake/group_commit.py",
    "hai_airflow/server/control/controller.py",
    "hai_airflow/scheduling/planner.py",
    "hai_airflow/server/control/admission.py",
    "hai_airflow/backends/local/backend.py",
    "hai_airflow/backends/local/spawner.py",
    "hai_airflow/backends/local/supervisor.py",
    "hai_airflow/backends/common/ranks.py",
)
"""The files the walk must go through, from the CLI flag to the rank launcher."""


def test_every_file_and_name_the_walk_gives_exists() -> None:
    problems = page_problems(PAGE.read_text(encoding="utf-8"))
    assert not problems, "docs/walkthrough.md:\n" + "\n".join(problems)


def test_the_walk_goes_from_the_flag_to_the_process() -> None:
    named = set(QUOTED.findall(PAGE.read_text(encoding="utf-8")))
    assert not [step for step in STEPS if step not in named], "a step of the submit is missing"


def test_the_check_finds_what_does_not_exist() -> None:
    cases = {
        "`hai_airflow/server/control/admission.py`: `claim`, `launch` and `prepare`": [],
        "`hai_airflow/server/control/admission.py` makes a `Launch` of `hai_airflow/spec.py`": [
            "`Launch`: none of the files named before it defines it (hai_airflow/server/control/admission.py)"
        ],
        "`hai_airflow/backends/common/base.py`: `Launch.env`, `Handle`; `Backend.start`": [],
        "`hai_airflow/server/control/admit.py`: `claim`": [
            "`hai_airflow/server/control/admit.py`: no such file (from .)"
        ],
        "`hai_airflow/server/control/admission.py`: `claims`": [
            "`claims`: hai_airflow/server/control/admission.py defines no such name"
        ],
        "`hai_airflow/server/control/admission.py`, `hai_airflow/spec.py`: `claim`": [
            "`claim`: hai_airflow/spec.py defines no such name"
        ],
        "`Launch.env` of `hai_airflow/backends/common/base.py`": [
            "`Launch.env`: a name before any file of its paragraph"
        ],
        "`hai_airflow/backends/common/base.py`: `Launch.environment`": [
            "`Launch.environment`: hai_airflow/backends/common/base.py defines no such name"
        ],
        "`hai_airflow.server.control.admission.claim` and `hai_airflow.server.control.admission.claimed`": [
            "`hai_airflow.server.control.admission.claimed`: hai_airflow/server/control/admission.py "
            "defines no `claimed`"
        ],
        "`hai_airflow.server.control.admit.claim`": [
            "`hai_airflow.server.control.admit.claim`: "
            "hai_airflow/server/control/__init__.py defines no `admit.claim`"
        ],
        "`hai submit standalone --gpus 2`, `POST /api/v1/jobs`, `$RANK`": [],
    }
    for paragraph, expected in cases.items():
        assert page_problems(paragraph) == expected, paragraph
