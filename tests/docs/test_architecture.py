"""docs/architecture.md's tables of where each rule lives: every file, name and test file they give
exists, so a move or a rename that leaves the page behind fails here."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tests.docs.code_names import QUOTED, REPO, paragraph_problems

PAGE = REPO / "docs" / "architecture.md"
CODE = REPO / "hai_airflow"
"""The tables give the code's paths from the package, the tests' from the repository."""
TEST_FILE = re.compile(r"tests/(?:\w+/)*test_\w+\.py")


@dataclass(frozen=True)
class Rule:
    rule: str
    where: str
    tested_by: str


def rules(text: str) -> list[Rule]:
    """The rows of every table of the page with a `where` and a `tested by` column."""
    found: list[Rule] = []
    columns: list[str] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            columns = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if columns is None:
            columns = cells
        elif not set(line) <= set("|-: ") and {"where", "tested by"} <= set(columns):
            found.append(Rule(cells[0], cells[columns.index("where")], cells[columns.index("tested by")]))
    return found


def rule_problems(rule: Rule) -> list[str]:
    problems = [f"{rule.rule!r}: {p}" for p in paragraph_problems(rule.where, CODE)]
    if not any(token.endswith(".py") for token in QUOTED.findall(rule.where)):
        problems.append(f"{rule.rule!r}: names no file where it lives")
    tests = QUOTED.findall(rule.tested_by)
    if not tests:
        problems.append(f"{rule.rule!r}: names no test file")
    for test in tests:
        if not TEST_FILE.fullmatch(test):
            problems.append(f"{rule.rule!r}: `{test}` is not a test file (tests/…/test_*.py)")
        elif not (REPO / test).is_file():
            problems.append(f"{rule.rule!r}: `{test}`: no such test file")
    return problems


def test_every_rule_names_code_and_test_files_that_exist() -> None:
    found = rules(PAGE.read_text(encoding="utf-8"))
    assert len(found) >= 30, "the rules table and the controller's concerns, each with a tested-by column"
    problems = [p for rule in found for p in rule_problems(rule)]
    assert not problems, "docs/architecture.md:\n" + "\n".join(problems)


def test_both_tables_have_a_tested_by_column() -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert "| rule | where | tested by |" in text
    assert "| concern | where | tested by |" in text


def test_the_check_finds_a_missing_file_name_or_test_file() -> None:
    page = """
| rule | where | tested by |
|---|---|---|
| holds | `scheduling/placement.py`: `never_fits` | `tests/scheduling/test_plan.py` |
| file moved | `scheduling/placing.py`: `never_fits` | `tests/scheduling/test_plan.py` |
| name renamed | `scheduling/placement.py`: `never_fit` | `tests/scheduling/test_plan.py` |
| test moved | `scheduling/placement.py`: `never_fits` | `tests/server/test_controller.py` |
| not a test | `scheduling/placement.py`: `never_fits` | `tests/scheduling/builders.py` |
| untested | `scheduling/placement.py`: `never_fits` | none |
| nowhere | the planner | `tests/scheduling/test_plan.py` |
"""
    found = {rule.rule: rule_problems(rule) for rule in rules(page)}
    assert found["holds"] == []
    assert found["file moved"] == ["'file moved': `scheduling/placing.py`: no such file (from hai_airflow)"]
    assert found["name renamed"] == [
        "'name renamed': `never_fit`: hai_airflow/scheduling/placement.py defines no such name"
    ]
    assert found["test moved"] == ["'test moved': `tests/server/test_controller.py`: no such test file"]
    assert found["not a test"] == [
        "'not a test': `tests/scheduling/builders.py` is not a test file (tests/…/test_*.py)"
    ]
    assert found["untested"] == ["'untested': names no test file"]
    assert found["nowhere"] == ["'nowhere': names no file where it lives"]
