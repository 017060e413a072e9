"""The code a docs page names: files, and the functions, classes and constants defined in them.

Names are looked up by reading the files (`ast`), not by importing them, so a page is checked
against what a file defines, not against what it happens to import.

Two ways a page names code:

- A file, by its path in backticks: `` `hai_airflow/server/control/admission.py` ``. A name right
  after it, after a colon (`` `admission.py`: `claim`, `launch` ``), is defined in that file; any
  other name in backticks is defined in one of the files its paragraph (or table cell) named before
  it. A name is a Python identifier or a dotted one (`Class.method`); what has other characters
  (`--gpus`, `POST /api/v1/jobs`, `$RANK`) is not a name.
- A module's dotted path from the package: `` `hai_airflow.server.control.admission.claim` ``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "hai_airflow"
QUOTED = re.compile(r"`([^`]+)`")
NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
NAME_LIST = re.compile(r"`[\w.]+`(?:(?:,\s*|,?\s+and\s+|,?\s+or\s+)`[\w.]+`)*")
"""`a`, `b` and `c`: the names a colon after a file gives."""
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def _bound(node: ast.stmt) -> Iterator[tuple[str, ast.stmt]]:
    """The names a statement binds at its own level, with the statement (a class to look into)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        yield node.name, node
    elif isinstance(node, ast.Assign):
        for target in node.targets:
            if isinstance(target, ast.Name):
                yield target.id, node
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        yield node.target.id, node
    elif isinstance(node, (ast.If, ast.Try)):  # `if TYPE_CHECKING:`, a guarded import's fallback
        for inner in [*node.body, *node.orelse, *getattr(node, "finalbody", [])]:
            yield from _bound(inner)


@cache
def _module(path: Path) -> list[ast.stmt]:
    return ast.parse(path.read_text(encoding="utf-8")).body


def defines(path: Path, dotted: str) -> bool:
    """Whether the file defines `dotted`: a function, class or assigned name at its top level, or
    one inside a class (`Class.method`, `Class.Inner.field`)."""
    body = _module(path)
    for part in dotted.split("."):
        found = dict(kv for node in body for kv in _bound(node)).get(part)
        if found is None:
            return False
        body = found.body if isinstance(found, ast.ClassDef) else []
    return True


def module_name_problem(dotted: str) -> str | None:
    """Why `hai_airflow.module.name` names nothing: its longest prefix that is a module, then the
    rest defined in it."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:cut])
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                rest = ".".join(parts[cut:])
                if rest and not defines(path, rest):
                    return f"`{dotted}`: {path.relative_to(REPO)} defines no `{rest}`"
                return None
    return f"`{dotted}`: no such module"


def paragraphs(text: str) -> list[str]:
    """The page's paragraphs (table rows count as one each), without its fenced code blocks."""
    text = FENCE.sub("", text)
    return [p for block in re.split(r"\n\s*\n", text) for p in _rows(block)]


def _rows(block: str) -> list[str]:
    lines = block.splitlines()
    return lines if lines and all(line.startswith("|") for line in lines) else [block]


def paragraph_problems(paragraph: str, root: Path = REPO) -> list[str]:
    """What a paragraph names that does not exist: files (paths from `root`), names in them, and
    names in backticks before any file of the paragraph."""
    problems: list[str] = []
    files: list[Path] = []
    missing = False
    colon_names: dict[int, Path | None] = {}
    """Where a name given after a file's colon starts: that file (None: it does not exist)."""
    for quoted in QUOTED.finditer(paragraph):
        token = quoted[1]
        if token.endswith(".py"):
            path = root / token
            exists = path.is_file()
            if exists:
                files.append(path)
            else:
                missing = True
                problems.append(f"`{token}`: no such file (from {root.relative_to(REPO)})")
            after = re.match(r":\s*(" + NAME_LIST.pattern + ")", paragraph[quoted.end() :])
            if after:
                start = quoted.end() + after.start(1)
                for name in QUOTED.finditer(after[1]):
                    colon_names[start + name.start()] = path if exists else None
        elif token.startswith(f"{PACKAGE}.") and NAME.fullmatch(token):
            if (problem := module_name_problem(token)) is not None:
                problems.append(problem)
        elif NAME.fullmatch(token):
            if quoted.start() in colon_names:
                own = colon_names[quoted.start()]
                if own is not None and not defines(own, token):
                    problems.append(f"`{token}`: {own.relative_to(REPO)} defines no such name")
            elif not files:
                if not missing:  # else the missing file is the problem
                    problems.append(f"`{token}`: a name before any file of its paragraph")
            elif not any(defines(f, token) for f in files):
                named = ", ".join(dict.fromkeys(str(f.relative_to(REPO)) for f in files))
                problems.append(f"`{token}`: none of the files named before it defines it ({named})")
    return problems


def page_problems(text: str, root: Path = REPO) -> list[str]:
    return [problem for p in paragraphs(text) for problem in paragraph_problems(p, root)]
