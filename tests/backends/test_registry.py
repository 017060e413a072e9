"""Choosing a backend by name: lazy imports and clear refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hai_airflow.backends import BACKENDS, BackendUnavailable, load_backend


def test_local_backend_is_loaded_by_name_with_its_options(tmp_path: Path) -> None:
    backend = load_backend("local", {"failure_grace_seconds": 1}, tmp_path)
    assert backend.name == "local"
    assert type(backend).__name__ == "LocalBackend"
    backend.close()


def test_unknown_backend_names_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailable, match=r"unknown backend 'slurm'; choose one of .*local"):
        load_backend("slurm", {}, tmp_path)


def test_bad_option_value_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="watch_interval_seconds"):
        load_backend("local", {"watch_interval_seconds": 0}, tmp_path)


def test_importing_the_package_imports_no_backend() -> None:
    code = "import sys, hai_airflow.backends; print(' '.join(m for m in sys.modules if 'backends.' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(out.split())
    assert "hai_airflow.backends.common.base" in loaded
    assert not loaded & {module for module, _, _ in BACKENDS.values()}
