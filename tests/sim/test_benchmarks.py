"""The benchmark scripts run on tiny inputs (their figures are printed, never asserted on speed)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"


@pytest.fixture
def benchmarks_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))


def test_sim_bench_prints_speed_and_the_comparison(benchmarks_on_path, capsys):
    import sim_bench

    sim_bench.main(["--jobs", "40", "--nodes", "4", "--cycle-intervals", "0,30", "--compare", "seed,fifo"])

    out = capsys.readouterr().out
    assert re.match(r"machine: 10,000,000 Python additions took \d+\.\d\d s of CPU \(", out)
    assert "trace: 40 jobs, 4 nodes, 32 GPUs" in out
    assert "a cycle at every event time" in out and "a cycle every 30 s" in out
    assert out.count("simulated jobs per wall-clock second") == 2
    assert "lost GPU-hours" in out and "fifo" in out


def test_vs_slurm_report_gives_ratios(benchmarks_on_path):
    import vs_slurm_jobs

    common = {"jobs": 10, "note": "n"}
    slurm = {**common, "wall_s": 20.0, "submissions_per_s": 50.0, "latency_p50_s": 1.0, "latency_p95_s": 2.0}
    hai = {**common, "wall_s": 10.0, "submissions_per_s": 100.0, "latency_p50_s": 0.5, "latency_p95_s": 3.0}

    lines = vs_slurm_jobs.report(slurm, hai).splitlines()

    assert lines[1].split()[-1] == "0.50"
    assert lines[2].split()[-1] == "2.00"
    assert lines[4].split()[-1] == "1.50"


def test_slurm_jobcomp_lines_are_parsed(benchmarks_on_path, tmp_path):
    import vs_slurm_jobs

    path = tmp_path / "jobcomp.txt"
    path.write_text(
        "JobId=7 UserId=root(0) GroupId=root(0) Name=wrap JobState=COMPLETED Partition=bench "
        "TimeLimit=UNLIMITED StartTime=2026-11-29T16:00:03 EndTime=2026-11-29T16:00:03 "
        "NodeList=h NodeCnt=1 ProcCnt=1 WorkDir=/tmp SubmitTime=2026-11-29T16:00:01\n"
    )

    (entry,) = vs_slurm_jobs.read_jobcomp(path)

    assert (entry["JobId"], entry["JobState"]) == ("7", "COMPLETED")
    assert entry["SubmitTime"] == "2026-11-29T16:00:01"


def test_server_bench_prints_every_figure_for_each_store():
    # A subprocess: the benchmark starts real `hai serve` processes (and PostgreSQL when one answers).
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "server_bench.py"), "--jobs", "3", "--clients", "2",
         "--submissions", "4", "--store-jobs", "30", "--load-nodes", "2", "--load-submissions", "6"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith(("sqlite", "postgresql"))]
    rows = [line.split() for line in lines if "under load" not in line]
    assert rows and rows[0][0] == "sqlite"
    for row in rows:
        # 30 jobs stored; the planner cycle timed over 25 s: its cycles, and (in brackets) the plans
        # a settled cluster makes every 10 s. Two or three fall in that window on a quiet machine; a
        # busy one can delay one past its end, so only some plan is required here.
        assert row[-5] == "30" and row[-4] != "0.0" and int(row[-2]) > 0, row
        assert int(row[-1].strip("()")) >= 1, row
    loaded = [line for line in lines if "under load" in line]
    assert len(loaded) == len(rows), done.stdout
    for line in loaded:
        found = re.search(r"30 queued behind 2 full nodes, 6 submissions .*: ([\d.]+)/s, planner cycle", line)
        assert found is not None and float(found[1]) > 0, line


def test_cycle_bench_times_the_controller_cycle_on_a_full_cluster(benchmarks_on_path, capsys):
    import cycle_bench

    cycle_bench.main(["--queued", "60", "--nodes", "6", "--cycles", "2", "--stores", "sqlite"])

    out = capsys.readouterr().out
    found = re.search(r"sqlite: (\d+) queued x 6 nodes: cycle idle \(settled, no plan\) median [\d.]+", out)
    assert found is not None, out
    # 60 queued plus 6 bursts of 16 (2 that wait, 2 with an exit, 2 with an exit and the forecaster
    # at work), less the jobs started on the GPUs of the 4 jobs stopped.
    assert 60 <= int(found[1]) < 156
    assert "idle planned anyway median" in out and "after 16 submits + 1 exit median" in out and "RSS" in out
    assert "the same with the forecaster at work median" in out
    assert "after 16 submits that wait anyway median" in out


POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
)
PODS = [
    "pod-a,8000,16384,1,500,,LS,Succeeded,100,4000,200",  # kept: a shared GPU becomes a whole one, high
    "pod-b,4000,8192,2,1000,,BE,Failed,300,1300,300",  # kept: low
    "pod-c,4000,8192,0,0,,BE,Succeeded,300,900,300",  # no GPU
    "pod-d,4000,8192,1,1000,,LS,Pending,400,,",  # never scheduled
    "pod-e,4000,8192,1,1000,,BE,Succeeded,500,200000,500",  # ran longer than --max-runtime
    "pod-f,4000,8192,1,1000,,LS,Running,600,300000,700",  # still running when the trace ended
]


def test_alibaba_pods_become_a_trace(benchmarks_on_path, tmp_path):
    import alibaba_trace

    source = tmp_path / "pods.csv"
    source.write_text("\n".join([POD_HEADER, *PODS]) + "\n")

    nodes, jobs, load = alibaba_trace.write_trace(
        source, tmp_path / "out", alibaba_trace.Conversion(nodes=2, compress=2, max_runtime=86_400)
    )

    from hai_airflow.sim import load_trace

    trace = load_trace(nodes, jobs)
    assert [(n.gpus, n.gpu_type) for n in trace.nodes] == [(8, "G2"), (8, "G2")]
    assert [(j.submit_time, j.duration, j.gpus_per_worker, j.max_schedule) for j in trace.jobs] == [
        (0.0, 3800.0, 1, 4), (100.0, 1000.0, 2, 0),
    ]
    assert (trace.jobs[0].cpus, trace.jobs[0].memory_gb) == (8.0, 16.0)
    assert load == pytest.approx((3800 + 2 * 1000) / (16 * 100))


def test_forecast_accuracy_prints_both_tables(benchmarks_on_path, tmp_path, capsys):
    import forecast_accuracy

    source = tmp_path / "pods.csv"
    source.write_text("\n".join([POD_HEADER, *PODS]) + "\n")

    forecast_accuracy.main(["--jobs", "40", "--nodes", "2", "--runs", "2", "--alibaba", str(source)])

    out = capsys.readouterr().out
    assert "synthetic (gen_trace.py seed 1" in out and "alibaba cluster-trace-gpu-v2023" in out
    assert out.count("the figures are the same in every run (deterministic)") == 2
    assert out.count("| low | slurm-style |") == 2 and out.count("| high | unknown |") == 2


def test_resize_sim_prints_a_row_per_policy_and_share(benchmarks_on_path, tmp_path, capsys):
    import resize_sim

    source = tmp_path / "pods.csv"
    source.write_text("\n".join([POD_HEADER, *PODS]) + "\n")

    resize_sim.main(["--jobs", "60", "--nodes", "3", "--load", "2", "--alibaba", str(source)])

    out = capsys.readouterr().out
    assert "synthetic (gen_trace.py seed 1, load 2)" in out and "alibaba cluster-trace-gpu-v2023" in out
    assert out.count("| policy | resizable share |") == 2
    assert out.count("| seed | 0.5 |") == 2 and out.count("| fifo | 0 |") == 2
    # Alibaba's pods are single workers: nothing to make resizable, said so.
    assert "--resizable-share has nothing to mark" in out


def test_resize_sim_says_when_the_alibaba_trace_is_missing(benchmarks_on_path, monkeypatch, capsys):
    import resize_sim

    monkeypatch.delenv("HAI_ALIBABA_TRACE", raising=False)
    resize_sim.main(["--jobs", "20", "--nodes", "2", "--policies", "seed", "--shares", "0"])

    assert "alibaba: skipped, no pod list found" in capsys.readouterr().out
