"""Finding 7: a job's output cannot fill the platform's disk. A job writing far more than
`[limits] log_bytes_per_instance` to stdout ends as it would, and its log keeps the first bytes of its
share and one line saying the rest was dropped; every worker of a distributed job keeps its share."""

from __future__ import annotations

from pathlib import Path

from hai_airflow.spec import CpuJobSpec, DistributedJobSpec
from tests.security.test_races import wait_ended
from tests.support.live_server import TEST_CONFIG, TOKENS, LiveServer

LIMIT = 1 << 20
FLOOD = "head -c 8388608 /dev/zero | tr '\\0' x; echo; echo after-the-flood >&2"
"""8 MiB of output, then a line the cap drops too."""


def _server(home: Path) -> LiveServer:
    return LiveServer(home, f"[limits]\nlog_bytes_per_instance = {LIMIT}\n\n" + TEST_CONFIG)


def test_a_flood_of_output_is_cut_at_the_limit_and_the_job_ends_as_it_would(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    with _server(tmp_path / "hai").start() as server, server.client(TOKENS["alice"]) as alice:
        spec = CpuJobSpec(task_name="flood", code_path=str(code), cmd=FLOOD)
        job = wait_ended(alice, alice.submit(spec).id)
        (inst,) = alice.instances(job.id)
        log = alice.log(inst.id)
        kept = tmp_path / "hai" / "jobs" / str(job.id) / "instances" / str(inst.id) / "output.log"
        size = kept.stat().st_size
    assert job.state == "SUCCEEDED", job.reason
    assert LIMIT <= size < LIMIT + 200, size
    assert log.startswith("x" * 1000)
    assert "the log reached [limits] log_bytes_per_instance" in log
    assert "after-the-flood" not in log


def test_each_worker_of_a_distributed_job_keeps_its_share(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    with _server(tmp_path / "hai").start() as server, server.client(TOKENS["alice"]) as alice:
        spec = DistributedJobSpec(
            task_name="flood2", code_path=str(code), cmd=FLOOD, workers=2, worker_resource_pkg=454
        )
        job = wait_ended(alice, alice.submit(spec).id)
        (inst,) = alice.instances(job.id)
        combined = alice.log(inst.id)
        home = tmp_path / "hai" / "jobs" / str(job.id) / "instances" / str(inst.id)
        sizes = sorted(p.stat().st_size for p in home.glob("output.worker*.log"))
    assert job.state == "SUCCEEDED", job.reason
    assert len(sizes) == 2 and all(LIMIT // 2 <= s < LIMIT // 2 + 200 for s in sizes), sizes
    assert combined.count("log_bytes_per_instance") == 2
