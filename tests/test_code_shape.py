"""The shape the code keeps: no function longer than a screen, except declarations."""

from __future__ import annotations

import ast
from pathlib import Path

import hai_airflow

ROOT = Path(hai_airflow.__file__).parent
MAX_LINES = 60
COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.With, ast.AsyncWith, ast.Match)


def body_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of the body without its docstring."""
    body = fn.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return 0 if not body else (body[-1].end_lineno or 0) - body[0].lineno + 1


def is_declaration(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Straight-line data (a form's fields, provider info): assignments and a return, no flow."""
    return all(isinstance(s, (ast.Expr, ast.Assign, ast.AnnAssign, ast.Return)) for s in fn.body) and not any(
        isinstance(n, (*COMPOUND, ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(fn) if n is not fn
    )


def long_functions(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = body_lines(node)
                if lines > MAX_LINES and not is_declaration(node):
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_longer_than_a_screen() -> None:
    assert long_functions(ROOT) == []


def test_the_check_finds_a_long_function_and_spares_a_declaration(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    steps = "".join(f"    if x == {i}:\n        x += 1\n" for i in range(31))
    fields = "".join(f"        'f{i}': {i},\n" for i in range(70))
    (pkg / "m.py").write_text(
        f"def long(x):\n{steps}    return x\n\n\ndef fields():\n    return {{\n{fields}    }}\n"
    )
    assert [f.split(" ", 1)[1] for f in long_functions(pkg)] == ["long (63 lines)"]
