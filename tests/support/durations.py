"""Where the suite's time goes: every test's setup, call and teardown, summed by tier and by module.

At the end of a run the controller (the one process under pytest-xdist) writes
`.artifacts/durations.json` (one record a test) and `.artifacts/durations.md` (the tables that
docs/testing.md quotes). Only whole runs are kept: a run of one file or one tier writes
`durations-partial.*` instead, so the tables always describe the suite.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / ".artifacts"
# A test's tier is its first marker in this order; a test with none of them is in the fast tier.
TIERS = ("kube", "docker", "browser", "faults", "slow")


def tier_of(keywords: object) -> str:
    return next((tier for tier in TIERS if tier in keywords), "fast")  # type: ignore[operator]


def plugin(config: pytest.Config) -> Durations | None:
    """The plugin for this process: the controller's (or the only process's); None on a worker."""
    if hasattr(config, "workerinput"):
        return None
    whole = (
        config.args_source == pytest.Config.ArgsSource.TESTPATHS
        and not config.option.markexpr
        and not config.option.keyword
    )
    return Durations(whole)


def worker_of(report: pytest.TestReport) -> str:
    """The xdist worker ("gw0", ...) that ran a report's test; "main" without xdist."""
    node = getattr(report, "node", None)  # set by xdist on the controller
    return str(node.gateway.id) if node is not None else "main"


@dataclass
class Timing:
    module: str
    tier: str
    worker: str
    seconds: float = 0.0
    outcome: str = "passed"


@dataclass(eq=False)  # a plugin is kept in sets: hashed by identity
class Durations:
    """The pytest plugin: collects reports as they arrive and writes the tables at the end."""

    whole_suite: bool
    started: float = field(default_factory=time.monotonic)
    tests: dict[str, Timing] = field(default_factory=dict)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = report.nodeid.split("::", 1)[0]
        timing = self.tests.setdefault(
            report.nodeid, Timing(module, tier_of(report.keywords), worker_of(report))
        )
        timing.seconds += report.duration
        if report.outcome != "passed" and timing.outcome == "passed":
            timing.outcome = report.outcome

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.tests:
            return
        wall = time.monotonic() - self.started
        stem = "durations" if self.whole_suite else "durations-partial"
        ARTIFACTS.mkdir(exist_ok=True)
        records = [{"test": nodeid, **vars(timing)} for nodeid, timing in sorted(self.tests.items())]
        (ARTIFACTS / f"{stem}.json").write_text(json.dumps({"wall_s": wall, "tests": records}, indent=1))
        (ARTIFACTS / f"{stem}.md").write_text(tables(self.tests, wall))


def _table(title: str, rows: dict[str, list[float]], total: float) -> list[str]:
    lines = [f"| {title} | tests | seconds | share | slowest test (s) |", "|---|---:|---:|---:|---:|"]
    for name, seconds in sorted(rows.items(), key=lambda kv: -sum(kv[1])):
        spent = sum(seconds)
        lines.append(
            f"| {name} | {len(seconds)} | {spent:.0f} | {100 * spent / total:.1f}% | {max(seconds):.1f} |"
        )
    return lines


def tables(tests: dict[str, Timing], wall: float) -> str:
    """The run's time by tier and by module (the 25 costliest), as Markdown tables."""
    by_tier: dict[str, list[float]] = defaultdict(list)
    by_module: dict[str, list[float]] = defaultdict(list)
    by_worker: dict[str, list[float]] = defaultdict(list)
    for timing in tests.values():
        by_tier[timing.tier].append(timing.seconds)
        by_module[timing.module].append(timing.seconds)
        by_worker[timing.worker].append(timing.seconds)
    total = sum(t.seconds for t in tests.values()) or 1.0
    costliest = dict(sorted(by_module.items(), key=lambda kv: -sum(kv[1]))[:25])
    lines = [
        f"{len(tests)} tests, {total:.0f} s of test time in {wall:.0f} s of wall time "
        f"on {len(by_worker)} worker(s).",
        "",
        *_table("tier", by_tier, total),
        "",
        *_table("module (the 25 costliest)", costliest, total),
        "",
        *_table("worker", by_worker, total),
        "",
    ]
    return "\n".join(lines)
