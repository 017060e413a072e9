"""`GET /cli/hai`: the downloadable `hai` a job fetches with `wget … -O /bin/hai && chmod +x /bin/hai`.

One Python file for a plain `python3` (3.8+), assembled from the very modules the full CLI uses for
these commands' flags, requests, spec fields and output (read as source here, never imported into
the server), so the two cannot drift. No authentication: the file holds no secret and is the same
for everyone, like a public binary download; every command it runs sends the job's own token."""

from __future__ import annotations

import functools
import hashlib
from enum import Enum
from pathlib import Path
from typing import get_args

from fastapi import APIRouter, Request, Response

import hai_airflow
from hai_airflow import vocabulary

router = APIRouter()

PACKAGE = Path(hai_airflow.__file__).resolve().parent
MODULES = (
    "hai_airflow.durations",
    "hai_airflow.arrays",
    "hai_airflow.labels",
    "hai_airflow.api_routes",
    "hai_airflow.scheduling.packages",
    "hai_airflow.cli.listing",
    "hai_airflow.cli.columns",
    "hai_airflow.cli.flagtable",
    "hai_airflow.cli.jobfields",
    "hai_airflow.cli.portable",
)
"""The modules the downloaded file holds, each after those it imports."""
PYTHON = (3, 8)
"""The oldest Python the file runs on (tests/cli/test_portable.py runs it there, in a container too)."""
MEDIA_TYPE = "text/x-python"
CACHE_CONTROL = "public, max-age=3600"
"""An hour: the file changes only when the server is upgraded, and its ETag says when it did."""

LOADER = '''
import sys

if sys.version_info < {python}:
    sys.stderr.write(
        "Error: hai needs Python {shown} or later; this is %d.%d. Run it with a newer python3.\\n"
        % tuple(sys.version_info[:2])
    )
    sys.exit(2)

import types


def _load():
    """Each module of SOURCES under its own name, so they import one another as in the package."""
    for name in ("hai_airflow", "hai_airflow.cli", "hai_airflow.scheduling"):
        package = types.ModuleType(name)
        package.__path__ = []
        sys.modules[name] = package
    # The spec's views are named in annotations only; without pydantic they are plain objects.
    spec = types.ModuleType("hai_airflow.spec")
    spec.__getattr__ = lambda name: object
    sys.modules["hai_airflow.spec"] = spec
    for name, source in SOURCES:
        module = types.ModuleType(name)
        module.__file__ = __file__ + "/" + name
        sys.modules[name] = module
        exec(compile(source, module.__file__, "exec"), module.__dict__)
        parent, _, child = name.rpartition(".")
        setattr(sys.modules[parent], child, module)
    return sys.modules["hai_airflow.cli.portable"]


if __name__ == "__main__":
    sys.exit(_load().main())
'''


def _literal(source: str) -> str:
    """`source` as a triple-quoted Python string that reads back as `source`."""
    return "'''" + source.replace("\\", "\\\\").replace("'''", "\\'\\'\\'") + "'''"


def _plain(value: object) -> object:
    """A vocabulary value as plain Python data (a StrEnum member as its string)."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, frozenset):
        return sorted(_plain(v) for v in value)  # type: ignore[type-var]
    return value


def vocabulary_source() -> str:
    """`hai_airflow.vocabulary`'s words as plain values: its StrEnum needs Python 3.11."""
    states = "".join(f"    {s.name} = {s.value!r}\n" for s in vocabulary.JobState)
    terminal = _plain(vocabulary.TERMINAL_STATES)
    return (
        '"""hai_airflow.vocabulary, its values written out by the server for Python 3.8."""\n'
        "from enum import Enum\nfrom typing import Literal\n\n"
        f"MAX_SCHEDULE_CHOICES = {vocabulary.MAX_SCHEDULE_CHOICES!r}\n"
        f"PROCESSES_HELP = {vocabulary.PROCESSES_HELP!r}\n"
        f"FIELD_FLAGS = {vocabulary.FIELD_FLAGS!r}\n"
        f"Processes = Literal[{', '.join(map(repr, get_args(vocabulary.Processes)))}]\n\n\n"
        f"class JobState(str, Enum):\n{states}\n\n"
        f"TERMINAL_STATES = frozenset({terminal!r})\n"
    )


def module_source(name: str) -> str:
    return (PACKAGE.parent / (name.replace(".", "/") + ".py")).read_text(encoding="utf-8")


@functools.cache
def portable_cli() -> bytes:
    """The downloadable file: a version check, the modules' sources, and the loader that runs them."""
    version = getattr(hai_airflow, "__version__", "0")
    sources = [("hai_airflow.vocabulary", vocabulary_source())]
    sources += [(name, module_source(name)) for name in MODULES]
    listed = "".join(f"    ({name!r}, {_literal(source)}),\n" for name, source in sources)
    shown = ".".join(map(str, PYTHON))
    return (
        "#!/usr/bin/env python3\n"
        f"# hai {version}, the downloadable CLI: submit, create, task, instance, log, wait, cancel, res.\n"
        f"# Runs on a plain python3 ({shown} or later) with nothing installed; served by GET /cli/hai.\n"
        "# Server: $HAI_SERVER; token: $HAI_TOKEN, else the file $HAI_TOKEN_FILE names.\n"
        + LOADER.replace("{python}", repr(PYTHON))
        .replace("{shown}", shown)
        .replace("if __name__", "SOURCES = [\n" + listed + "]\n\n\nif __name__")
    ).encode("utf-8")


@router.get("/cli/hai", response_class=Response, responses={200: {"content": {MEDIA_TYPE: {}}}})
def download_cli(request: Request) -> Response:
    """No auth: the downloadable `hai` (Python 3.8+, standard library only) for jobs to fetch."""
    body = portable_cli()
    tag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    headers = {"ETag": tag, "Cache-Control": CACHE_CONTROL, "Content-Disposition": 'inline; filename="hai"'}
    if request.headers.get("if-none-match") == tag:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type=MEDIA_TYPE, headers=headers)
