"""Airflow tests: a temporary AIRFLOW_HOME on SQLite with the repo's dags/, and a live `hai serve`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

if "airflow.configuration" in sys.modules:
    raise pytest.UsageError(
        "Airflow was imported before tests/airflow/conftest.py could point it at a temp home"
    )

REPO = Path(__file__).resolve().parents[2]
TEST_DAGS = Path(__file__).resolve().parent / "dag_files"
LOCAL_BUNDLE = "airflow.dag_processing.bundles.local.LocalDagBundle"
AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="hai-airflow-tests-"))
# Airflow reads its configuration when first imported, so it is set before any test imports it.
os.environ.update(
    {
        "AIRFLOW_HOME": str(AIRFLOW_HOME),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{AIRFLOW_HOME}/airflow.db",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(AIRFLOW_HOME / "plugins"),
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(AIRFLOW_HOME / "logs"),
        # the example DAGs, and the DAGs the tests run (dag.test() only runs DAGs of a bundle)
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(
            [
                {"name": "dags-folder", "classpath": LOCAL_BUNDLE, "kwargs": {}},
                {"name": "hai-test-dags", "classpath": LOCAL_BUNDLE, "kwargs": {"path": str(TEST_DAGS)}},
            ]
        ),
    }
)

from tests.airflow.helpers import HAI_CONFIG, connection_json  # noqa: E402
from tests.support.live_server import LiveServer, start_server  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def airflow_db() -> Iterator[Path]:
    """Airflow's metadata database, migrated once; the whole temp home goes at the end."""
    done = subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    yield AIRFLOW_HOME
    shutil.rmtree(AIRFLOW_HOME, ignore_errors=True)


@pytest.fixture
def hai_server(tmp_path: Path) -> Iterator[LiveServer]:
    """A live `hai serve` (one node of 8 virtual V100s; see tests/support/live_server.py)."""
    with start_server(tmp_path / "hai", HAI_CONFIG) as server:
        yield server


@pytest.fixture
def hai_conn(hai_server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> Callable[[str | None], LiveServer]:
    """Point `hai_default` at the live server as a user (default: the admin); returns the server."""

    def use(token: str | None = None) -> LiveServer:
        monkeypatch.setenv("AIRFLOW_CONN_HAI_DEFAULT", connection_json(hai_server, token))
        return hai_server

    use(None)
    return use
