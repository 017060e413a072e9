"""Trace files: parsing rules and the synthetic generator's output."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import pytest
from sim_builders import JOB_HEADER, write_csv

from hai_airflow.sim import TraceError, load_jobs, load_trace, percentile, simulate, summarize

GEN_TRACE = Path(__file__).parents[2] / "benchmarks" / "gen_trace.py"


@functools.cache
def _generator():
    spec = importlib.util.spec_from_file_location("gen_trace", GEN_TRACE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up while the class is built.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_empty_fields_take_their_defaults_and_jobs_come_in_submit_order(tmp_path):
    path = write_csv(
        tmp_path / "JOBS.csv",
        [*JOB_HEADER, "elastic"],
        [[7, 50, 10, 2, 8, "A100", 24, "g", "u", 16, 128, "true"],
         [3, 50, 10, 1, 0, "", "", "", "", "", "", ""],
         [9, 0, 10, 1, 1, "", 0, "", "", "", "", "no"]],
    )
    jobs = load_jobs(path)

    assert [j.id for j in jobs] == [9, 3, 7]
    cpu_job = jobs[1]
    assert (cpu_job.gpu_type, cpu_job.max_schedule) == (None, 0)
    assert (cpu_job.group, cpu_job.user) == ("default", "default")
    assert (cpu_job.cpus, cpu_job.memory_gb, cpu_job.elastic) == (0, 0, False)
    assert (jobs[2].total_gpus, jobs[2].elastic, jobs[2].gpu_type) == (16, True, "A100")


def test_a_byte_order_mark_is_ignored_and_a_repeated_column_is_refused(tmp_path):
    good = tmp_path / "bom.csv"
    good.write_bytes(b"\xef\xbb\xbf" + ",".join(JOB_HEADER).encode() + b"\n1,0,10,1,1,,0,,,,\n")
    row = [1, 0, 10, 1, 1, "", 0, "", "", "", "", ""]
    twice = write_csv(tmp_path / "twice.csv", [*JOB_HEADER, "user"], [row])

    assert [j.id for j in load_jobs(good)] == [1]
    with pytest.raises(TraceError, match=r"twice\.csv line 1, column 'user': named twice"):
        load_jobs(twice)


@pytest.mark.parametrize(
    ("q", "expected"),
    [pytest.param(0, 1.0, id="p0 is the minimum"), pytest.param(50, 2.5, id="p50 interpolates"),
     pytest.param(100, 4.0, id="p100 is the maximum"), pytest.param(95, 3.85, id="p95")],
)
def test_percentile_interpolates_between_ranks(q, expected):
    assert percentile([1.0, 2.0, 3.0, 4.0], q) == pytest.approx(expected)


def test_percentile_of_nothing_is_none():
    assert percentile([], 50) is None


def test_generator_writes_a_trace_the_simulator_reads(tmp_path):
    gen = _generator()
    spec = gen.TraceSpec(jobs=300, nodes=20, seed=7)
    nodes_csv, jobs_csv, quotas = gen.write_trace(spec, tmp_path)

    trace = load_trace(nodes_csv, jobs_csv, quotas)

    assert len(trace.nodes) == 20 and len(trace.jobs) == 300
    assert {n.gpu_type for n in trace.nodes} == {"A100", "V100", "T4"}
    assert [j.submit_time for j in trace.jobs] == sorted(j.submit_time for j in trace.jobs)
    assert 0.2 <= sum(j.max_schedule > 0 for j in trace.jobs) / 300 <= 0.4
    assert {j.gpus_per_worker for j in trace.jobs} == {1, 2, 4, 8}
    assert any(j.workers > 1 for j in trace.jobs)
    assert any(j.gpu_type is None for j in trace.jobs) and any(j.elastic for j in trace.jobs)
    assert len(trace.quota.groups) >= 3 and len(trace.quota.users) > len(trace.quota.groups)
    durations = sorted(j.duration for j in trace.jobs)
    assert durations[-1] > 10 * durations[len(durations) // 2], "durations should be heavy-tailed"


def test_generator_is_deterministic_per_seed(tmp_path):
    gen = _generator()
    a = gen.write_trace(gen.TraceSpec(jobs=50, nodes=5, seed=3), tmp_path / "a")
    b = gen.write_trace(gen.TraceSpec(jobs=50, nodes=5, seed=3), tmp_path / "b")
    c = gen.write_trace(gen.TraceSpec(jobs=50, nodes=5, seed=4), tmp_path / "c")

    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert a[1].read_bytes() != c[1].read_bytes()


def test_a_small_generated_trace_drains(tmp_path):
    gen = _generator()
    trace = load_trace(*gen.write_trace(gen.TraceSpec(jobs=120, nodes=12, seed=5), tmp_path))

    summary = summarize(simulate(trace, "seed"))

    assert summary.jobs_finished + summary.jobs_rejected == 120
    assert summary.jobs_unfinished == 0
    assert 0 < summary.gpu_utilisation <= 1
