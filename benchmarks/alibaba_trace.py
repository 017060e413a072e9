"""Alibaba's production GPU trace (github.com/alibaba/clusterdata, cluster-trace-gpu-v2023) as a `hai sim`
trace: writes NODES.csv and JOBS.csv from openb_pod_list_default.csv, which is read, never copied.

Kept: pods asking for GPUs whose scheduled and deletion times are present and ordered, that ran at most
`--max-runtime` seconds (longer ones are services, not training) and had ended when the trace did. Each
becomes one job: whole GPUs (a pod sharing a GPU takes a whole one), runtime = deletion - scheduled,
its CPU and memory request, priority from its QoS class (LS and Guaranteed high, the rest low), a user
and group drawn from a hash of its name (the trace has none), no time limit and no task name. The
arrival times are divided by `--compress`, so a year-old production load forms queues on a small
cluster of `--nodes` 8-GPU machines.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import subprocess
import sys
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's code, not whichever one is installed

from hai_airflow.sim.trace import JOB_COLUMNS, NODE_COLUMNS  # noqa: E402

POD_LIST = "cluster-trace-gpu-v2023/csv/openb_pod_list_default.csv"
"""The pod list's path inside the clusterdata repository."""
HIGH_QOS = frozenset({"LS", "Guaranteed"})
HIGH_MAX_SCHEDULE = 4
GPUS_PER_NODE = 8
NODE_CPUS = 96
NODE_MEMORY_GB = 768
USERS = 24
GROUPS = 4


@dataclass(frozen=True)
class Conversion:
    """The knobs of the conversion; the defaults are the ones the published figures use."""

    nodes: int = 4
    compress: float = 5.0
    max_runtime: float = 86_400.0


def read_pods(source: Path) -> list[dict[str, str]]:
    """The pod list from a CSV file, or from a clone or mirror of the clusterdata repository."""
    if source.is_file():
        text = source.read_text(encoding="utf-8")
    elif (source / POD_LIST).is_file():
        text = (source / POD_LIST).read_text(encoding="utf-8")
    else:
        shown = subprocess.run(["git", "--git-dir", str(source), "show", f"HEAD:{POD_LIST}"],
                               capture_output=True, text=True, check=False)
        if shown.returncode != 0:
            raise SystemExit(f"Error: {source} is neither the pod list CSV nor a clusterdata repository. "
                             f"Give the path of {Path(POD_LIST).name} or of a clone of alibaba/clusterdata")
        text = shown.stdout
    return list(csv.DictReader(io.StringIO(text)))


def _seconds(raw: str) -> float | None:
    try:
        return float(raw)
    except ValueError:
        return None


def kept(pods: Iterable[dict[str, str]], max_runtime: float) -> list[dict[str, str]]:
    """The GPU pods with sane times that had ended when the trace did (later ones are cut off)."""
    pods = list(pods)
    trace_end = max((_seconds(p["deletion_time"]) or 0.0) for p in pods)
    out = []
    for p in pods:
        created, scheduled, deleted = (_seconds(p[k]) for k in ("creation_time", "scheduled_time",
                                                                 "deletion_time"))
        if int(p["num_gpu"] or 0) < 1 or created is None or scheduled is None or deleted is None:
            continue
        if created <= scheduled < deleted < trace_end and deleted - scheduled <= max_runtime:
            out.append(p)
    return sorted(out, key=lambda p: (float(p["creation_time"]), p["name"]))


def job_rows(pods: list[dict[str, str]], compress: float) -> list[dict[str, object]]:
    first = float(pods[0]["creation_time"]) if pods else 0.0
    rows: list[dict[str, object]] = []
    for job_id, p in enumerate(pods, start=1):
        user = zlib.crc32(p["name"].encode()) % USERS
        rows.append({
            "job_id": job_id,
            "submit_time": round((float(p["creation_time"]) - first) / compress, 1),
            "duration": round(float(p["deletion_time"]) - float(p["scheduled_time"])),
            "workers": 1,
            "gpus_per_worker": int(p["num_gpu"]),
            "gpu_type": "",
            "max_schedule": HIGH_MAX_SCHEDULE if p["qos"] in HIGH_QOS else 0,
            "group": f"g{user % GROUPS}",
            "user": f"u{user}",
            "cpus": round(float(p["cpu_milli"] or 0) / 1000, 2),
            "memory_gb": round(float(p["memory_mib"] or 0) / 1024, 2),
        })
    return rows


def offered_load(rows: list[dict[str, object]], gpus: int) -> float:
    """GPU-seconds asked for over GPU-seconds the cluster has while jobs arrive (1.0 = full)."""
    span = max(float(str(r["submit_time"])) for r in rows) or 1.0
    asked = sum(float(str(r["gpus_per_worker"])) * float(str(r["duration"])) for r in rows)
    return asked / (gpus * span)


def write_trace(source: Path, out: Path, conversion: Conversion = Conversion()) -> tuple[Path, Path, float]:
    """Write NODES.csv and JOBS.csv into `out`; returns their paths and the offered load."""
    pods = kept(read_pods(source), conversion.max_runtime)
    rows = job_rows(pods, conversion.compress)
    out.mkdir(parents=True, exist_ok=True)
    nodes_path, jobs_path = out / "NODES.csv", out / "JOBS.csv"
    with nodes_path.open("w", newline="", encoding="utf-8") as f:
        nodes = csv.DictWriter(f, fieldnames=NODE_COLUMNS)
        nodes.writeheader()
        nodes.writerows({"name": f"node{i:02d}", "gpu_type": "G2", "gpus": GPUS_PER_NODE, "cpus": NODE_CPUS,
                         "memory_gb": NODE_MEMORY_GB} for i in range(conversion.nodes))
    with jobs_path.open("w", newline="", encoding="utf-8") as f:
        jobs = csv.DictWriter(f, fieldnames=JOB_COLUMNS)
        jobs.writeheader()
        jobs.writerows(rows)
    return nodes_path, jobs_path, offered_load(rows, conversion.nodes * GPUS_PER_NODE)


ALIBABA_ENV = "HAI_ALIBABA_TRACE"
"""Where the benchmarks look for the pod list when `--alibaba` is not given."""


def alibaba_source(given: Path | None) -> Path | None:
    """The pod list (or a clone of its repository) given, else the one ALIBABA_ENV names; None if neither."""
    for candidate in (given, os.environ.get(ALIBABA_ENV)):
        if candidate and Path(candidate).exists():
            return Path(candidate)
    return None


def alibaba_trace(given: Path | None, scratch: Path) -> tuple[str, Path, Path] | None:
    """The trace's nodes and jobs files written under `scratch`, with a label saying how it was converted;
    None, having said so, when no pod list is found."""
    source = alibaba_source(given)
    if source is None:
        print("\nalibaba: skipped, no pod list found. Give --alibaba PATH (openb_pod_list_default.csv "
              "of github.com/alibaba/clusterdata cluster-trace-gpu-v2023, or a clone of that repository)")
        return None
    conversion = Conversion()
    nodes, jobs, load = write_trace(source, scratch / "alibaba", conversion)
    label = (f"alibaba cluster-trace-gpu-v2023 (arrivals compressed {conversion.compress:g}x, "
             f"offered load {load:.2f})")
    return label, nodes, jobs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path,
                        help=f"{Path(POD_LIST).name}, or a clone or git mirror of alibaba/clusterdata")
    parser.add_argument("--out", type=Path, default=Path("alibaba-trace"), help="directory to write into")
    parser.add_argument("--nodes", type=int, default=Conversion.nodes, help="8-GPU machines of the cluster")
    parser.add_argument("--compress", type=float, default=Conversion.compress,
                        help="divide inter-arrival times by this")
    parser.add_argument("--max-runtime", type=float, default=Conversion.max_runtime,
                        help="drop pods that ran longer (seconds)")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.compress <= 0 or args.max_runtime <= 0:
        parser.error("--nodes must be >= 1, --compress and --max-runtime > 0")
    conversion = Conversion(args.nodes, args.compress, args.max_runtime)
    nodes, jobs, load = write_trace(args.source, args.out, conversion)
    print(nodes)
    print(jobs)
    print(f"offered load {load:.2f} on {args.nodes * GPUS_PER_NODE} GPUs", file=sys.stderr)


if __name__ == "__main__":
    main()
