"""`make demo` and `make up`: the whole platform on this machine, for trying it and developing it.

A development tool of the repository, not part of the installed package: ``python -m dev.demo`` from
the repository root. :mod:`.processes` starts and stops what it runs, :mod:`.services` is hai serve
and Airflow's settings, :mod:`.story` the demo's preemption and :mod:`.up` the long-running stack.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
INCLUDE = REPO / "include"


def log(message: str) -> None:
    print(f"[demo] {message}", flush=True)
