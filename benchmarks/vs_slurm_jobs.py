"""Submit N one-GPU `true` jobs to Slurm or to hai from T threads, wait for all, and report the timings.

`vs_slurm.sh` starts the daemons and calls this once per system, then `report` for the ratios:

    python vs_slurm_jobs.py slurm --jobcomp FILE --out slurm.json
    python vs_slurm_jobs.py hai --server URL --code-dir DIR --out hai.json
    python vs_slurm_jobs.py report slurm.json hai.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from hai_airflow.client import HaiClient
from hai_airflow.spec import TERMINAL_STATES, JobState, StandaloneJobSpec

JOB_STATES: tuple[str, ...] = tuple(JobState)

POLL_S = 0.2


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _figures(
    system: str, jobs: int, submit_s: float, wall_s: float, latencies: list[float], note: str
) -> dict[str, Any]:
    return {
        "system": system,
        "jobs": jobs,
        "submit_s": round(submit_s, 3),
        "submissions_per_s": round(jobs / submit_s, 1),
        "wall_s": round(wall_s, 3),
        "latency_p50_s": round(_quantile(latencies, 0.50), 3),
        "latency_p95_s": round(_quantile(latencies, 0.95), 3),
        "latency_mean_s": round(statistics.fmean(latencies), 3),
        "note": note,
    }


def _submit_all(jobs: int, threads: int, submit_one: Callable[[int], None]) -> float:
    """Run `submit_one(i)` for every job from a pool; returns the seconds the submissions took."""
    began = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(submit_one, range(jobs)))
    return time.perf_counter() - began


# ---- Slurm ----------------------------------------------------------------------------------

_JOBCOMP_FIELD = re.compile(r"(\w+)=(\S*)")


def read_jobcomp(path: Path) -> list[dict[str, str]]:
    """jobcomp/filetxt: one line per ended job, `Key=Value` pairs (times to the second)."""
    if not path.exists():
        return []
    return [dict(_JOBCOMP_FIELD.findall(line)) for line in path.read_text().splitlines() if line.strip()]


def slurm(jobs: int, threads: int, jobcomp: Path) -> dict[str, Any]:
    def submit_one(_: int) -> None:
        subprocess.run(
            ["sbatch", "--parsable", "--gres=gpu:1", "--output=/dev/null", "--wrap", "true"],
            check=True,
            capture_output=True,
        )

    began = time.perf_counter()
    submit_s = _submit_all(jobs, threads, submit_one)
    while len(ended := read_jobcomp(jobcomp)) < jobs:
        time.sleep(POLL_S)
    wall_s = time.perf_counter() - began
    failed = [e["JobId"] for e in ended if e.get("JobState") != "COMPLETED"]
    if failed:
        raise SystemExit(f"Slurm jobs did not complete: {failed[:10]}")
    latencies = [
        (datetime.fromisoformat(e["StartTime"]) - datetime.fromisoformat(e["SubmitTime"])).total_seconds()
        for e in ended
    ]
    return _figures("slurm", jobs, submit_s, wall_s, latencies, "submit->start from jobcomp, 1 s resolution")


# ---- hai ------------------------------------------------------------------------------------


def hai(jobs: int, threads: int, server: str, code_dir: Path, resource_pkg: int) -> dict[str, Any]:
    local = threading.local()
    ids: list[int] = []

    def submit_one(i: int) -> None:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = HaiClient(server=server)
        spec = StandaloneJobSpec(task_name=f"bench-{i}", code_path=str(code_dir), cmd="true",
                                 resource_pkg=resource_pkg)
        ids.append(client.submit(spec).id)

    began = time.perf_counter()
    submit_s = _submit_all(jobs, threads, submit_one)
    wanted = set(ids)
    unfinished = ",".join(s for s in JOB_STATES if s not in TERMINAL_STATES)
    with HaiClient(server=server) as client:
        # The server holds only these jobs: asking for one unfinished job is enough, and costs the
        # server next to nothing, as reading jobcomp costs Slurm nothing (listing 1,000 jobs every poll
        # would take CPU from the jobs being measured).
        while client.jobs(all=True, state=unfinished, limit=1):
            time.sleep(POLL_S)
        wall_s = time.perf_counter() - began
        views = [v for v in client.jobs(all=True, limit=jobs * 2) if v.id in wanted]
        if len(views) != jobs:
            raise SystemExit(f"hai lists {len(views)} of the {jobs} jobs submitted")
        failed = [v.id for v in views if v.state != "SUCCEEDED"]
        if failed:
            raise SystemExit(f"hai jobs did not succeed: {failed[:10]}")
        latencies = []
        for v in views:
            started = v.started_at or client.instances(v.id)[0].started_at
            assert started is not None
            latencies.append((started - v.submitted_at).total_seconds())
    return _figures("hai", jobs, submit_s, wall_s, latencies, "submit->start from the server's timestamps")


# ---- report ---------------------------------------------------------------------------------


def report(slurm_figures: dict[str, Any], hai_figures: dict[str, Any]) -> str:
    rows = [
        ("wall time until all finished (s)", "wall_s", "lower"),
        ("submissions per second", "submissions_per_s", "higher"),
        ("submit->start p50 (s)", "latency_p50_s", "lower"),
        ("submit->start p95 (s)", "latency_p95_s", "lower"),
    ]
    lines = [f"{'':36} {'slurm':>10} {'hai':>10} {'hai/slurm':>10}"]
    for label, key, _better in rows:
        s, h = slurm_figures[key], hai_figures[key]
        ratio = f"{h / s:.2f}" if s else "-"
        lines.append(f"{label:36} {s:>10} {h:>10} {ratio:>10}")
    lines.append(f"jobs: {slurm_figures['jobs']} each")
    lines.append(f"slurm: {slurm_figures['note']}; hai: {hai_figures['note']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("slurm", "hai"):
        p = sub.add_parser(name)
        p.add_argument("--jobs", type=int, default=1000)
        p.add_argument("--threads", type=int, default=16)
        p.add_argument("--out", type=Path, required=True)
    sub.choices["slurm"].add_argument("--jobcomp", type=Path, required=True)
    sub.choices["hai"].add_argument("--server", required=True)
    sub.choices["hai"].add_argument("--code-dir", type=Path, required=True)
    sub.choices["hai"].add_argument("--resource-pkg", type=int, default=454)
    rep = sub.add_parser("report")
    rep.add_argument("slurm_json", type=Path)
    rep.add_argument("hai_json", type=Path)
    args = parser.parse_args()
    if args.command == "report":
        print(report(json.loads(args.slurm_json.read_text()), json.loads(args.hai_json.read_text())))
        return
    if args.command == "slurm":
        figures = slurm(args.jobs, args.threads, args.jobcomp)
    else:
        figures = hai(args.jobs, args.threads, args.server, args.code_dir, args.resource_pkg)
    args.out.write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
