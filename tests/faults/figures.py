"""The faults tier's figures as a table: `python -m tests.faults.figures [FILE]` (what `make chaos`
prints after its rounds): per measure, how many runs, the median and the longest; then per fault,
what became of the submissions and how many problems the ledger found."""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from tests.faults.conftest import FIGURES

COUNTS = ("submitted", "stored", "refused", "lost", "duplicated", "problems")


def table(lines: list[str]) -> str:
    """The recovery times, then what became of the submissions, per fault."""
    times: dict[str, list[float]] = defaultdict(list)
    counts: dict[str, list[int]] = defaultdict(lambda: [0] * (len(COUNTS) + 1))
    for line in lines:
        if not line.strip():
            continue
        row = json.loads(line)
        if "measure" in row:
            times[row["measure"]].append(float(row["seconds"]))
        else:
            total = counts[row["fault"]]
            total[0] += 1
            for i, name in enumerate(COUNTS, 1):
                total[i] += int(row[name])
    out = ["| fault: time to | runs | p50 (s) | max (s) |", "|---|---:|---:|---:|"]
    for measure, values in sorted(times.items()):
        out.append(f"| {measure} | {len(values)} | {statistics.median(values):.2f} | {max(values):.2f} |")
    if counts:
        out += ["", "| fault | runs | " + " | ".join(COUNTS) + " |", "|---|" + "---:|" * (len(COUNTS) + 1)]
        for fault, total in sorted(counts.items()):
            out.append(f"| {fault} | " + " | ".join(str(n) for n in total) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else FIGURES
    print(table(path.read_text(encoding="utf-8").splitlines()))
