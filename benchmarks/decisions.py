"""Every planner decision on generated traces, hashed: the planner's behaviour in one line per case.

A change to the scheduling core that should not change behaviour keeps every hash in
`decisions.json`; `--check` says which case moved. `--write` records the current hashes (do it only
for a change of behaviour that is meant, and say so in the commit).

Run: .venv/bin/python benchmarks/decisions.py [--check | --write] [--large]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gen_trace import TraceSpec, write_trace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's code, not whichever one is installed

from hai_airflow.scheduling import POLICIES  # noqa: E402
from hai_airflow.scheduling.model import Decision, Wait  # noqa: E402
from hai_airflow.sim import load_trace, with_resizable_share  # noqa: E402
from hai_airflow.sim.engine import Simulator  # noqa: E402

RECORDED = Path(__file__).with_name("decisions.json")


@dataclass(frozen=True)
class Case:
    """A generated trace and how the simulator replays it."""

    name: str
    trace: TraceSpec
    suspend_delay: float = 0.0
    cycle_interval: float = 0.0
    resizable_share: float = 0.0
    """A share of the multi-worker jobs made resizable to half their workers (`hai sim --resizable-share`)."""


SMALL = (
    Case("300x30-load2", TraceSpec(jobs=300, nodes=30, seed=1, load=2.0)),
    Case("300x30-load3-high50", TraceSpec(jobs=300, nodes=30, seed=2, load=3.0, high_share=0.5)),
    Case("400x20-load2-delay", TraceSpec(jobs=400, nodes=20, seed=3, load=2.0), suspend_delay=60.0),
    Case("600x60-load1.5-tick", TraceSpec(jobs=600, nodes=60, seed=4, load=1.5), cycle_interval=30.0),
    Case("400x20-load2-resizable", TraceSpec(jobs=400, nodes=20, seed=5, load=2.0, high_share=0.3),
         suspend_delay=30.0, resizable_share=0.8),
)
"""Fast enough for the test suite (a few seconds for every policy)."""

LARGE = (
    Case("10000x1000-bench", TraceSpec()),
    Case("10000x1000-bench-tick60", TraceSpec(), cycle_interval=60.0),
)
"""The simulator benchmark's trace (`sim_bench.py`), exact and on a 60 s timer."""


def digest(case: Case, policy: str, scratch: Path) -> tuple[str, int]:
    """sha256 over every cycle's time and decisions (ids, placements, reasons); and the cycle count."""
    trace = load_trace(*write_trace(case.trace, scratch / case.name))
    if case.resizable_share:
        trace = with_resizable_share(trace, case.resizable_share)
    h = hashlib.sha256()
    cycles = 0

    def observe(now: float, decisions: Sequence[Decision]) -> None:
        nonlocal cycles
        cycles += 1
        h.update(f"{now!r}\n".encode())
        for d in decisions:
            h.update(f"{recorded_name(d)}\n".encode())

    Simulator(
        trace, policy, suspend_delay=case.suspend_delay, cycle_interval=case.cycle_interval, observe=observe
    ).run()
    return h.hexdigest(), cycles


def recorded_name(d: Decision) -> str:
    """The decision as text, as the hashes were recorded: the waiting decision was called Hold then."""
    text = repr(d)
    return "Hold" + text[len("Wait") :] if isinstance(d, Wait) else text


def hashes(cases: Sequence[Case], policies: Sequence[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="hai-decisions-") as tmp:
        for case in cases:
            for policy in policies:
                began = time.perf_counter()
                value, cycles = digest(case, policy, Path(tmp))
                out.setdefault(case.name, {})[policy] = value
                print(
                    f"{case.name:28} {policy:16} {value[:16]}  {cycles} cycles, "
                    f"{time.perf_counter() - began:.1f} s",
                    flush=True,
                )
    return out


def differences(found: dict[str, dict[str, str]], recorded: dict[str, dict[str, str]]) -> list[str]:
    """The cases whose hash differs from the recorded one (a case never recorded counts as different)."""
    return [
        f"{case}/{policy}"
        for case, per in found.items()
        for policy, value in per.items()
        if recorded.get(case, {}).get(policy) != value
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--large", action="store_true", help="also the 10,000-job benchmark trace (minutes)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a hash differs from decisions.json")
    parser.add_argument("--write", action="store_true", help="record the hashes in decisions.json")
    args = parser.parse_args(argv)
    cases = SMALL + LARGE if args.large else SMALL
    found = hashes(cases, sorted(POLICIES))
    recorded = json.loads(RECORDED.read_text()) if RECORDED.exists() else {}
    if args.write:
        RECORDED.write_text(json.dumps({**recorded, **found}, indent=1, sort_keys=True) + "\n")
        print(f"recorded in {RECORDED.name}")
        return 0
    moved = differences(found, recorded)
    print(
        "every decision as recorded"
        if not moved
        else f"decisions differ from {RECORDED.name}: {', '.join(moved)}"
    )
    return 1 if moved and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
