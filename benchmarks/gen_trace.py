"""Synthetic trace for `hai sim`: writes NODES.csv, JOBS.csv and quotas.toml from a seed."""

from __future__ import annotations

import argparse
import csv
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from hai_airflow.sim.trace import JOB_COLUMNS, NODE_COLUMNS, OPTIONAL_JOB_COLUMNS

T = TypeVar("T")

NODE_TYPES = (("A100", 0.5), ("V100", 0.3), ("T4", 0.2))
"""GPU type of a machine and its share of the cluster; every machine has 8 GPUs."""
GPUS_PER_NODE = 8
# (workers, GPUs per worker, share): mostly single-machine jobs, a tenth multi-machine Horovod.
SHAPES = ((1, 1, 0.35), (1, 2, 0.15), (1, 4, 0.15), (1, 8, 0.22), (2, 8, 0.07), (4, 8, 0.04), (8, 8, 0.02))
HIGH_MAX_SCHEDULE = (4, 6, 8, 24, 48)
GROUPS = 5
USERS_PER_GROUP = 4


@dataclass(frozen=True)
class TraceSpec:
    """Knobs of the generator; `load` is the share of all GPUs busy by the time the last job arrives,
    were every job started at once (above 1 the cluster is oversubscribed and queues build)."""

    jobs: int = 10_000
    nodes: int = 1_000
    seed: int = 1
    load: float = 1.5
    high_share: float = 0.3
    median_duration_s: float = 3600.0
    duration_sigma: float = 1.2
    """Log-normal shape: 1.2 gives a heavy tail (mean about 2x the median, a few jobs 30x)."""
    max_duration_s: float = 86400.0
    any_type_share: float = 0.3
    elastic_share: float = 0.1
    no_group_share: float = 0.05


def _pick(rng: random.Random, weighted: Sequence[tuple[T, float]]) -> T:
    return rng.choices([w[0] for w in weighted], weights=[w[1] for w in weighted])[0]


def node_rows(spec: TraceSpec) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for gpu_type, share in NODE_TYPES:
        count = round(spec.nodes * share) if gpu_type != NODE_TYPES[-1][0] else spec.nodes - len(rows)
        for _ in range(count):
            rows.append(
                {"name": f"node{len(rows):04d}", "gpu_type": gpu_type, "gpus": GPUS_PER_NODE,
                 "cpus": 96, "memory_gb": 768}
            )
    return rows


def quota_toml(spec: TraceSpec) -> str:
    """Groups share about half the cluster as high-priority quota; each member may use half of it."""
    total = spec.nodes * GPUS_PER_NODE
    group_quota = max(8, total // (2 * GROUPS))
    lines: list[str] = []
    for g in range(GROUPS):
        lines += ["[[groups]]", f'name = "g{g}"', f"quota_gpus = {group_quota}", ""]
    for g in range(GROUPS):
        for u in range(USERS_PER_GROUP):
            user_quota = max(8, group_quota // 2)
            lines += ["[[users]]", f'name = "g{g}u{u}"', f'group = "g{g}"', f"quota_gpus = {user_quota}", ""]
    return "\n".join(lines)


def arrival_rate(spec: TraceSpec, sizes_and_durations: list[tuple[int, float]]) -> float:
    """Poisson rate r at which GPUs busy at the end of the arrival window W = n/r reach `load`.

    Busy GPUs at time W are about r * E[gpus * min(duration, W)]: long jobs submitted late count only
    for the part of them that fits, which a plain GPU-time average would overstate.
    """
    capacity = spec.load * spec.nodes * GPUS_PER_NODE
    n = len(sizes_and_durations)
    rate = capacity * n / sum(g * d for g, d in sizes_and_durations)
    for _ in range(50):
        window = n / rate
        rate = capacity * n / sum(g * min(d, window) for g, d in sizes_and_durations)
    return rate


def job_rows(spec: TraceSpec, rng: random.Random) -> list[dict[str, object]]:
    shapes = [((w, g), share) for w, g, share in SHAPES]
    rows: list[dict[str, object]] = []
    sizes_and_durations: list[tuple[int, float]] = []
    for job_id in range(1, spec.jobs + 1):
        workers, gpus = _pick(rng, shapes)
        duration = rng.lognormvariate(math.log(spec.median_duration_s), spec.duration_sigma)
        duration = round(min(spec.max_duration_s, max(60.0, duration)))
        sizes_and_durations.append((workers * gpus, duration))
        high = rng.random() < spec.high_share
        if rng.random() < spec.no_group_share:
            group = user = ""
        else:
            g = rng.randrange(GROUPS)
            group, user = f"g{g}", f"g{g}u{rng.randrange(USERS_PER_GROUP)}"
        rows.append(
            {
                "job_id": job_id,
                "duration": duration,
                "workers": workers,
                "gpus_per_worker": gpus,
                "gpu_type": "" if rng.random() < spec.any_type_share else _pick(rng, NODE_TYPES),
                "max_schedule": rng.choice(HIGH_MAX_SCHEDULE) if high else 0,
                "group": group,
                "user": user,
                "cpus": 10 * gpus,
                "memory_gb": 80 * gpus,
                "elastic": "true" if rng.random() < spec.elastic_share else "false",
            }
        )
    rate = arrival_rate(spec, sizes_and_durations)
    clock = 0.0
    for row in rows:
        row["submit_time"] = round(clock, 1)
        clock += rng.expovariate(rate)
    return rows


def write_trace(spec: TraceSpec, out: Path) -> tuple[Path, Path, Path]:
    """Write the three files into `out`; the same spec always writes the same bytes."""
    rng = random.Random(spec.seed)
    out.mkdir(parents=True, exist_ok=True)
    paths = (out / "NODES.csv", out / "JOBS.csv", out / "quotas.toml")
    with paths[0].open("w", newline="", encoding="utf-8") as f:
        nodes = csv.DictWriter(f, fieldnames=NODE_COLUMNS)
        nodes.writeheader()
        nodes.writerows(node_rows(spec))
    with paths[1].open("w", newline="", encoding="utf-8") as f:
        jobs = csv.DictWriter(f, fieldnames=(*JOB_COLUMNS, *OPTIONAL_JOB_COLUMNS))
        jobs.writeheader()
        jobs.writerows(job_rows(spec, rng))
    paths[2].write_text(quota_toml(spec), encoding="utf-8")
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("trace"), help="directory to write into")
    parser.add_argument("--jobs", type=int, default=TraceSpec.jobs)
    parser.add_argument("--nodes", type=int, default=TraceSpec.nodes)
    parser.add_argument("--seed", type=int, default=TraceSpec.seed)
    parser.add_argument("--load", type=float, default=TraceSpec.load, help="offered GPU load, 1.0 = full")
    parser.add_argument("--high-share", type=float, default=TraceSpec.high_share)
    args = parser.parse_args(argv)
    spec = TraceSpec(
        jobs=args.jobs, nodes=args.nodes, seed=args.seed, load=args.load, high_share=args.high_share
    )
    for path in write_trace(spec, args.out):
        print(path)


if __name__ == "__main__":
    main()
