"""The faults tier's parts: `hai` as a user runs it (the CLI tests' isolated home), and a PostgreSQL of
the test's own to stop, start and cut off."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cli.conftest import hai, isolated_home
from tests.faults.load import Tally
from tests.support.own_postgres import OwnPostgres, unavailable_reason

__all__ = ["hai", "isolated_home"]


@pytest.fixture
def database() -> Iterator[OwnPostgres]:
    why = unavailable_reason()
    if why is not None:
        pytest.skip(f"faults tier: {why}")
    # Not pytest's tmp_path: the postgres account must reach it.
    pg = OwnPostgres(Path(tempfile.mkdtemp(prefix="hai-faults-pg-", dir="/tmp")))
    pg.start()
    try:
        yield pg
    finally:
        pg.close()


FIGURES = Path(
    os.environ.get("HAI_FAULT_FIGURES") or Path(__file__).parents[2] / ".artifacts" / "faults.jsonl"
)
"""Where each fault test adds the times it measured (`make chaos` prints them as a table)."""


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Callable[[str, float], None]:
    """`record(measure, seconds)`: one figure of this test's fault, kept for the table."""

    def record(measure: str, seconds: float) -> None:
        _keep({"test": request.node.name, "measure": measure, "seconds": round(seconds, 3)})

    return record


@pytest.fixture
def accounts(request: pytest.FixtureRequest) -> Callable[[str, Tally, int], None]:
    """`record(fault, tally, problems)`: what became of this run's submissions, and how many problems
    the ledger found, for the table (kept before the test asserts, so a failed run shows too)."""

    def record(fault: str, tally: Tally, problems: int) -> None:
        _keep({"test": request.node.name, "fault": fault, **dataclasses.asdict(tally), "problems": problems})

    return record


def _keep(line: dict[str, object]) -> None:
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    with FIGURES.open("a", encoding="utf-8") as f:
        f.write(json.dumps({**line, "at": time.time()}) + "\n")
