"""The faults tier's figures as a table: `python -m tests.faults.figures [FILE]` (what `make chaos`
prints after its rounds): per measure, how many runs, the median and the longest."""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from tests.faults.conftest import FIGURES


def table(lines: list[str]) -> str:
    found: dict[str, list[float]] = defaultdict(list)
    for line in lines:
        if line.strip():
            row = json.loads(line)
            found[row["measure"]].append(float(row["seconds"]))
    out = ["| fault: time to | runs | p50 (s) | max (s) |", "|---|---:|---:|---:|"]
    for measure, values in sorted(found.items()):
        out.append(f"| {measure} | {len(values)} | {statistics.median(values):.2f} | {max(values):.2f} |")
    return "\n".join(out)


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else FIGURES
    print(table(path.read_text(encoding="utf-8").splitlines()))
