"""The site builds with no warning, and its reference pages cover all of the code they describe."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import typer
import yaml

from hai_airflow.backends import OPTIONS as BACKEND_OPTIONS
from hai_airflow.backends import options_model as backend_options_model
from hai_airflow.cli.main import app
from hai_airflow.server.config import ServerConfig
from hai_airflow.spec import CpuJobSpec, DistributedJobSpec, StandaloneJobSpec

REPO = Path(__file__).resolve().parents[2]


def load_hook() -> ModuleType:
    """docs/hooks/reference.py, loaded from its file as MkDocs loads it (tests/docs shadows `docs`)."""
    spec = importlib.util.spec_from_file_location(
        "hai_docs_reference", REPO / "docs" / "hooks" / "reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference = load_hook()


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    """A broken link or anchor, a page missing from the nav or a hand-written copy of a generated
    page fails the build."""
    missing = [m for m in ("mkdocs", "material") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed: pip install -e '.[docs]' (make install does)")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for page in reference.PAGES:
        assert (tmp_path / "site" / page.removesuffix(".md") / "index.html").is_file()


def test_the_nav_lists_every_page() -> None:
    """Every page under docs/ and every generated page is in the nav, and nothing else is."""
    config = yaml.load((REPO / "mkdocs.yml").read_text(encoding="utf-8"), Loader=yaml.BaseLoader)

    def listed(entries: Any) -> list[str]:
        out = []
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            out += listed(value) if isinstance(value, list) else [value]
        return out

    nav = listed(config["nav"])
    docs = REPO / "docs"
    on_disk = [str(p.relative_to(docs)) for p in docs.rglob("*.md") if "hooks" not in p.parts]
    pages = [*on_disk, *reference.PAGES]
    assert not [p for p in pages if p not in nav], "pages missing from the nav of mkdocs.yml"
    assert not [p for p in nav if p not in pages], "nav entries of mkdocs.yml without a page"
    assert len(nav) == len(set(nav)), "a page listed twice in the nav"
    assert not [p for p in reference.PAGES if (docs / p).exists()], "generated pages must not be files"


def test_the_config_reference_has_every_key() -> None:
    page = reference.config_page()
    for name, field in ServerConfig.model_fields.items():
        assert f"{{#{name}}}" in page
        shape = reference._section_model(field.annotation)
        if shape is not None:
            for key in shape[1].model_fields:
                assert f"| `{key}` |" in page, f"[{name}] {key}"
    for backend in BACKEND_OPTIONS:
        assert f"{{#backend-{backend}}}" in page
        for key in backend_options_model(backend).model_fields:
            assert f"| `{key}` |" in page, f"[backend] {key} ({backend})"


def test_the_cli_reference_has_every_command_and_option() -> None:
    page = reference.cli_page()
    root = typer.main.get_command(app)
    from typer import _click as click

    seen = 0
    for command, ctx in reference._commands(root, click.Context(root, info_name="hai")):
        section = page.split(f"## `{ctx.command_path}` ", 1)[1].split("\n## ", 1)[0]
        for param in command.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                assert f"| `{record[0]}` |" in section, f"{ctx.command_path} {record[0]}"
        seen += 1
    assert seen >= 20
    for path in ("hai serve", "hai submit cpu", "hai quota set", "hai airflow sync-pools"):
        assert f"## `{path}` " in page
    assert "`--check-config FILE`" in page


def test_the_spec_reference_has_every_field_of_every_mode() -> None:
    page = reference.spec_page()
    for mode, model in zip(reference.MODES, (CpuJobSpec, StandaloneJobSpec, DistributedJobSpec), strict=True):
        section = page.split(f'## `mode = "{mode}"`', 1)[1].split("\n## ", 1)[0]
        for name in model.model_fields:
            assert f"| `{name}` |" in section, f"{mode}: {name}"


def test_the_rest_reference_has_every_operation() -> None:
    document = reference.openapi_document()
    page = reference.rest_page(document)
    operations = [(m.upper(), p) for p, ops in document["paths"].items() for m in ops]
    assert ("POST", "/api/v1/jobs") in operations
    for method, path in operations:
        assert f"## `{method} {path}` " in page
    for name in document["components"]["schemas"]:
        assert f"{{#schema-{name.lower()}}}" in page
    assert "Request body (required): [SubmitRequest](#schema-submitrequest)" in page


def test_the_changelog_page_is_the_root_file() -> None:
    assert reference.changelog_page() == (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "## [Unreleased]" in reference.changelog_page()


def test_the_concepts_page_shows_every_job_move_from_the_code() -> None:
    from hai_airflow.spec import MOVES

    source = (REPO / "docs" / "concepts.md").read_text()
    assert reference.JOB_MOVES in source, "concepts.md lost the line the state machine is built into"
    built = reference.on_page_markdown(source, None, None, None)
    for a, b in MOVES:
        assert f"| `{a}` | `{b}` |" in built and f"    {a} --> {b}\n" in built
