"""How fast `hai` starts: the CPU seconds of `hai --version` and `hai task --help`, and the wall time of
`hai task` and `hai create` against a live local server, beside `python -c pass` in the same runs.

Each run times every command once, in turn, so a change in the machine's speed touches them alike; a
figure is the median of `--runs` runs with the range in brackets. CPU is the child's user + system
time (`os.wait4`); wall is from the start of the process to its exit. The server (`python -m
hai_airflow.server`, the tests' small config) runs from this tree; `--source` times the `hai` of
another checkout against it, e.g. one of the commit before a change.

Run: .venv/bin/python benchmarks/cli_bench.py [--runs 5] [--source DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from machine import speed_line  # noqa: E402

from tests.support.live_server import TEST_CONFIG, TOKENS, start_server  # noqa: E402

HAI = "import sys; from hai_airflow.cli.main import app; sys.exit(app(prog_name='hai'))"
"""What the `hai` console script runs."""

CPU_TARGET = 0.15
WALL_TARGET = 0.25


@dataclass(frozen=True)
class Case:
    """One command line, and which of its times has a target."""

    label: str
    argv: tuple[str, ...]
    target: str | None = None  # "cpu" or "wall"


def cases(code_dir: Path) -> list[Case]:
    create = (
        "create",
        "--task-name=bench",
        f"--code-path={code_dir}",
        "--resource-pkg=454",
        "--cmd=true",
    )
    return [
        Case("python -c pass", (sys.executable, "-c", "pass")),
        Case("hai --version", (sys.executable, "-c", HAI, "--version"), "cpu"),
        Case("hai task --help", (sys.executable, "-c", HAI, "task", "--help"), "cpu"),
        Case("hai task (live server)", (sys.executable, "-c", HAI, "task"), "wall"),
        Case("hai create (live server)", (sys.executable, "-c", HAI, *create), "wall"),
    ]


def timed(argv: Sequence[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """CPU seconds (user + system) and wall seconds of one run; a failed command stops the benchmark."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        error = proc.stderr.read().decode() if proc.stderr else ""
        raise SystemExit(f"cli_bench: {' '.join(argv[-3:])} exited {proc.returncode}: {error}")
    if proc.stderr:
        proc.stderr.close()
    return usage.ru_utime + usage.ru_stime, wall


def figure(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.3f} s ({min(values):.3f}-{max(values):.3f})"


def verdict(case: Case, cpu: Sequence[float], wall: Sequence[float]) -> str:
    if case.target is None:
        return ""
    values, limit = (cpu, CPU_TARGET) if case.target == "cpu" else (wall, WALL_TARGET)
    met = sum(v <= limit for v in values)
    how = "met in every run" if met == len(values) else f"met in {met} of {len(values)} runs"
    return f"{case.target} <= {limit} s: {how}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each command")
    parser.add_argument("--source", type=Path, default=REPO, help="the checkout whose `hai` is timed")
    args = parser.parse_args()
    print(speed_line())
    with tempfile.TemporaryDirectory() as tmp, start_server(Path(tmp) / "home", TEST_CONFIG) as server:
        code_dir = Path(tmp) / "code"
        code_dir.mkdir()
        env = {k: v for k, v in os.environ.items() if k not in ("HAI_REGION", "HAI_DEBUG")}
        env |= {"HAI_SERVER": server.url, "HAI_TOKEN": TOKENS["alice"], "HAI_HOME": str(Path(tmp) / "client")}
        # `python -c` puts its working directory first on sys.path: the source's `hai_airflow` is imported.
        source = args.source.resolve()
        env["PYTHONPATH"] = str(source)
        table = cases(code_dir)
        cpu: dict[str, list[float]] = {c.label: [] for c in table}
        wall: dict[str, list[float]] = {c.label: [] for c in table}
        timed(
            table[1].argv, env, source
        )  # one run unmeasured, so every run finds the files in the page cache
        for _ in range(args.runs):
            for case in table:
                used, took = timed(case.argv, env, source)
                cpu[case.label].append(used)
                wall[case.label].append(took)
    print(f"`hai` from {source}, {args.runs} runs, median (range)")
    rows = [("command", "CPU", "wall", "target")]
    rows += [
        (c.label, figure(cpu[c.label]), figure(wall[c.label]), verdict(c, cpu[c.label], wall[c.label]))
        for c in table
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
