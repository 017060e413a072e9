"""Job states are spelled once: as `JobState` (hai_airflow/vocabulary.py, re-exported by the spec), never
as a string elsewhere in the package, so a renamed or added state cannot be missed."""

from __future__ import annotations

import ast
from pathlib import Path

import hai_airflow
from hai_airflow.spec import JobState

PACKAGE = Path(hai_airflow.__file__).parent
ALLOWED = {"spec.py", "vocabulary.py"}
"""Where the states are defined."""
ALLOWED_UNDER = ("server/store/migrations/",)
"""The migrations state what the store held when they were written, not what the code says now."""
WORDS = frozenset(s.value for s in JobState)


def _texts(tree: ast.AST) -> set[int]:
    """The string statements of a module (docstrings, and the text under a name that documents it)."""
    return {
        id(n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
    }


def _states(value: object) -> bool:
    """Whether `value` names job states: one, or several joined by commas (an API filter)."""
    return isinstance(value, str) and all(part in WORDS for part in value.split(","))


def state_words(source: str) -> list[tuple[int, str]]:
    """Each string constant of `source` that names job states, by line, docstrings left out."""
    tree = ast.parse(source)
    texts = _texts(tree)
    return sorted(
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and _states(n.value) and id(n) not in texts
    )


def test_the_scan_finds_a_state_spelled_as_a_string_and_not_one_in_a_docstring() -> None:
    lines = [
        '"""Waits while RUNNING."""',
        'if job.state == "RUNNING":',
        '    """RUNNING"""',
        '    x = {"FAILED": 1}',
        'y = "PENDING,STARTING"',
        'z = "RUNNING late"',
    ]
    found = state_words("\n".join(lines))
    assert found == [(2, "RUNNING"), (4, "FAILED"), (5, "PENDING,STARTING")]


def test_no_state_is_spelled_as_a_string_outside_the_spec() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name in ALLOWED or name.startswith(ALLOWED_UNDER):
            continue
        found += [f"{name}:{line}: {word!r}" for line, word in state_words(path.read_text(encoding="utf-8"))]
    assert not found, "spell these states as JobState members (hai_airflow.spec):\n" + "\n".join(found)
