"""Small fluent builders for simulator traces, shared by the simulator tests."""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

from hai_airflow.scheduling.model import Node, Quota
from hai_airflow.sim import Trace, TraceJob


def node(name: str, gpus: int = 8, gpu_type: str = "V100") -> Node:
    return Node(name, gpu_type, gpus, 96, 768)


@dataclass(frozen=True)
class JobBuilder:
    """`job(1).high(4).gpus(8).at(4000).lasting(1000).build()`."""

    spec: TraceJob

    def at(self, submit_time: float) -> JobBuilder:
        return JobBuilder(replace(self.spec, submit_time=submit_time))

    def lasting(self, duration: float) -> JobBuilder:
        return JobBuilder(replace(self.spec, duration=duration))

    def gpus(self, gpus: int, workers: int = 1) -> JobBuilder:
        return JobBuilder(replace(self.spec, gpus_per_worker=gpus, workers=workers))

    def high(self, max_schedule: int = 4) -> JobBuilder:
        return JobBuilder(replace(self.spec, max_schedule=max_schedule))

    def low(self) -> JobBuilder:
        return JobBuilder(replace(self.spec, max_schedule=0))

    def max_schedule(self, hours: int) -> JobBuilder:
        return JobBuilder(replace(self.spec, max_schedule=hours))

    def elastic(self, on: bool = True) -> JobBuilder:
        return JobBuilder(replace(self.spec, elastic=on))

    def resizable(self, min_workers: int) -> JobBuilder:
        """Resizable down to `min_workers` (and elastic, as a resizable job always is)."""
        return JobBuilder(replace(self.spec, min_workers=min_workers, elastic=True))

    def using(self, cpus: float, memory_gb: float) -> JobBuilder:
        """CPUs and memory per worker."""
        return JobBuilder(replace(self.spec, cpus=cpus, memory_gb=memory_gb))

    def limit(self, seconds: float) -> JobBuilder:
        """The job's time limit (what a slurm-style estimate and a `limit` runtime estimate read)."""
        return JobBuilder(replace(self.spec, time_limit=seconds))

    def of(self, user: str, group: str) -> JobBuilder:
        return JobBuilder(replace(self.spec, user=user, group=group))

    def build(self) -> TraceJob:
        return self.spec


def job(job_id: int) -> JobBuilder:
    return JobBuilder(TraceJob(job_id, 0.0, 100.0, 1, 1, None, 0, "default", "default"))


def trace(nodes: list[Node], jobs: list[JobBuilder], quota: Quota | None = None) -> Trace:
    built = sorted((j.build() for j in jobs), key=lambda j: (j.submit_time, j.id))
    return Trace(tuple(nodes), tuple(built), quota or Quota())


def write_csv(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


NODE_HEADER = ["name", "gpu_type", "gpus", "cpus", "memory_gb"]
JOB_HEADER = [
    "job_id", "submit_time", "duration", "workers", "gpus_per_worker", "gpu_type",
    "max_schedule", "group", "user", "cpus", "memory_gb",
]
