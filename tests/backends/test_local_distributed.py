"""Distributed instances on the local backend: rank variables, per-worker logs, one failure stops all."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from hai_airflow.backends.common import procs
from hai_airflow.backends.local.backend import LocalBackend, LocalOptions, worker_log_path

from .conftest import Cluster

# GPU indices in placements are fakes: the workers only see CUDA_VISIBLE_DEVICES, no GPU is used.

PRINT_RANKS = (
    'echo "R=$RANK W=$WORLD_SIZE L=$LOCAL_RANK LS=$LOCAL_WORLD_SIZE HR=$HOROVOD_RANK HS=$HOROVOD_SIZE '
    "HL=$HOROVOD_LOCAL_RANK HLS=$HOROVOD_LOCAL_SIZE A=$MASTER_ADDR P=$MASTER_PORT C=$CUDA_VISIBLE_DEVICES "
    'I=$HAI_WORKER_INDEX N=$HAI_NODE G=$HAI_GPUS_PER_WORKER J=$HAI_JOB_ID"'
)


def test_per_worker_processes_see_worker_ranks_and_one_rendezvous(cluster: Cluster) -> None:
    h = cluster.start(
        PRINT_RANKS,
        mode="distributed",
        gpus=((0, 1), (2, 3)),
        nodes=("node-a", "node-a"),
        processes="per-worker",
    )
    ended = cluster.wait(h.instance_id)
    assert (ended.exit_code, ended.reason) == (0, "completed")
    combined = cluster.backend.read_log(h.instance_id)
    lines = sorted(combined.splitlines())
    assert len(lines) == 2
    port = h.data["master_port"]
    for rank, line in enumerate(lines):
        gpus = "0,1" if rank == 0 else "2,3"
        assert line == (
            f"[worker {rank}] R={rank} W=2 L={rank} LS=2 HR={rank} HS=2 HL={rank} HLS=2 A=127.0.0.1 "
            f"P={port} C={gpus} I={rank} N=node-a G=2 J=101"
        )
    # Each worker also has its own log, without the prefix.
    launch_log = cluster.tmp / "logs" / "instance-1.log"
    worker1 = worker_log_path(launch_log, 1).read_text()
    assert re.fullmatch(r"R=1 W=2 .* C=2,3 I=1 N=node-a G=2 J=101\n", worker1)


def test_per_worker_processes_on_different_nodes_have_local_rank_zero(cluster: Cluster) -> None:
    h = cluster.start(
        PRINT_RANKS,
        mode="distributed",
        gpus=((0,), (0,)),
        nodes=("node-a", "node-b"),
        processes="per-worker",
    )
    assert cluster.wait(h.instance_id).exit_code == 0
    lines = sorted(cluster.backend.read_log(h.instance_id).splitlines())
    assert [re.findall(r"L=(\d) LS=(\d)", x) for x in lines] == [[("0", "1")], [("0", "1")]]
    assert [re.findall(r"N=(\S+)", x) for x in lines] == [["node-a"], ["node-b"]]


PRINT_GANG = (
    'echo "R=$RANK W=$WORLD_SIZE L=$LOCAL_RANK LS=$LOCAL_WORLD_SIZE HR=$HOROVOD_RANK HS=$HOROVOD_SIZE '
    "HL=$HOROVOD_LOCAL_RANK HLS=$HOROVOD_LOCAL_SIZE HC=$HOROVOD_CROSS_RANK HCS=$HOROVOD_CROSS_SIZE "
    "HH=$HOROVOD_HOSTNAME CTL=$HOROVOD_CONTROLLER OPS=$HOROVOD_CPU_OPERATIONS IF=$HOROVOD_GLOO_IFACE "
    "RA=$HOROVOD_GLOO_RENDEZVOUS_ADDR RP=$HOROVOD_GLOO_RENDEZVOUS_PORT A=$MASTER_ADDR P=$MASTER_PORT "
    'C=$CUDA_VISIBLE_DEVICES I=$HAI_WORKER_INDEX"'
)


def test_per_gpu_processes_get_the_variables_horovods_gloo_launcher_gives_its_ranks(
    cluster: Cluster,
) -> None:
    # The platform document's definitions: rank 0..size-1 over all GPUs, local rank within a worker.
    h = cluster.start(PRINT_GANG, mode="distributed", gpus=((0, 1), (2, 3)), nodes=("node-a", "node-b"))
    ended = cluster.wait(h.instance_id, timeout=10)
    assert (ended.exit_code, ended.reason) == (0, "completed")
    lines = sorted(cluster.backend.read_log(h.instance_id).splitlines())
    assert len(lines) == 4
    found = [dict(kv.split("=", 1) for kv in line.split("] ", 2)[2].split()) for line in lines]
    ports = {(f["P"], f["RP"]) for f in found}
    assert len(ports) == 1 and len(set(next(iter(ports)))) == 2, "one store each for torch and Horovod"
    for rank, (line, f) in enumerate(zip(lines, found, strict=True)):
        worker, local = divmod(rank, 2)
        assert line.startswith(f"[worker {worker}] [rank {rank}] ")
        assert (f["R"], f["HR"], f["L"], f["HL"]) == (str(rank), str(rank), str(local), str(local))
        assert (f["W"], f["HS"], f["LS"], f["HLS"]) == ("4", "4", "2", "2")
        assert (f["HC"], f["HCS"], f["HH"], f["I"]) == (str(worker), "2", f"worker-{worker}", str(worker))
        assert (f["CTL"], f["OPS"], f["IF"], f["RA"], f["A"]) == (
            "gloo",
            "gloo",
            "lo",
            "127.0.0.1",
            "127.0.0.1",
        )
        # Every process sees its worker's GPUs and binds the one LOCAL_RANK names.
        assert f["C"] == ("0,1" if worker == 0 else "2,3")


def test_a_standalone_job_may_ask_for_a_process_per_gpu(cluster: Cluster) -> None:
    h = cluster.start('echo "R=$RANK of $WORLD_SIZE"', gpus=((0, 1, 2),), processes="per-gpu")
    assert cluster.wait(h.instance_id, timeout=10).exit_code == 0
    assert sorted(cluster.backend.read_log(h.instance_id).splitlines()) == [
        f"[rank {r}] R={r} of 3" for r in range(3)
    ]


def test_a_rank_killed_by_hand_stops_the_whole_instance_within_seconds(cluster: Cluster) -> None:
    cmd = "echo $$ > pid$RANK; exec sleep 60"
    h = cluster.start(cmd, mode="distributed", gpus=((0, 1), (2, 3)))
    # Every rank has started before one is killed: a rank stopped before its first line leaves no pid.
    pid_files = [cluster.code / f"pid{rank}" for rank in range(4)]
    deadline = time.monotonic() + 10
    while not all(f.exists() and f.read_text().strip() for f in pid_files):
        assert time.monotonic() < deadline, "not every rank started"
        time.sleep(0.02)
    t0 = time.monotonic()
    os.kill(int(pid_files[3].read_text()), signal.SIGKILL)
    ended = cluster.wait(h.instance_id, timeout=10)
    assert time.monotonic() - t0 < 5, "the other ranks were not stopped promptly"
    assert (ended.exit_code, ended.reason) == (137, "worker 1 on node-1 failed: exit code 137")
    assert "hai: rank 3 was killed by signal 9; stopping rank(s) 2" in cluster.backend.read_log(h.instance_id)
    for w in h.data["workers"]:
        assert not procs.is_alive(w["pid"], w["start_time"])
    for rank in range(3):
        assert _gone(int((cluster.code / f"pid{rank}").read_text()))


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] in "ZX"


def test_one_failing_worker_stops_the_other_and_fails_the_instance(cluster: Cluster) -> None:
    cmd = 'if [ "$RANK" = 1 ]; then sleep 0.3; echo bye; exit 7; fi; echo $$ > pid$RANK; sleep 30'
    t0 = time.monotonic()
    h = cluster.start(cmd, mode="distributed", gpus=((0,), (1,)))
    ended = cluster.wait(h.instance_id, timeout=4)
    assert time.monotonic() - t0 < 3, "the surviving worker was not stopped promptly"
    assert (ended.exit_code, ended.reason) == (7, "worker 1 on node-1 failed: exit code 7")
    w0 = h.data["workers"][0]
    assert not procs.is_alive(w0["pid"], w0["start_time"])
    assert "[worker 1] [rank 1] bye" in cluster.backend.read_log(h.instance_id)


def test_a_worker_ignoring_sigterm_after_a_failure_is_killed(cluster: Cluster) -> None:
    backend = cluster.new_backend(failure_grace_seconds=0.5)
    cmd = 'if [ "$RANK" = 0 ]; then exit 2; fi; trap "" TERM; sleep 30'
    h = cluster.start(cmd, backend=backend, mode="distributed", gpus=((0,), (1,)))
    ended = cluster.wait(h.instance_id, timeout=3, backend=backend)
    assert (ended.exit_code, ended.reason) == (2, "worker 0 on node-0 failed: exit code 2")
    w1 = h.data["workers"][1]
    assert not procs.is_alive(w1["pid"], w1["start_time"])


def test_stopping_a_distributed_instance_kills_every_worker(cluster: Cluster) -> None:
    h = cluster.start("sleep 30", mode="distributed", gpus=((0,), (1,), (2,)))
    cluster.backend.stop(h.instance_id, grace_seconds=0, notice=False)
    ended = cluster.wait(h.instance_id, timeout=1)
    assert (ended.exit_code, ended.reason) == (-9, "killed by signal 9")
    assert all(not procs.is_alive(w["pid"], w["start_time"]) for w in h.data["workers"])


def until_both_ready(backend: LocalBackend, instance_id: int) -> None:
    """Wait until both workers printed `ready` (their SIGTERM handlers are in place)."""
    deadline = time.monotonic() + 5
    while backend.read_log(instance_id).count("ready") < 2:
        assert time.monotonic() < deadline, "the workers never got ready"
        time.sleep(0.02)


SAVES_ON_SIGTERM = """
import os, signal, sys, time

def save_and_leave(signum, frame):
    # a checkpoint being written
    time.sleep(float(os.environ.get("SAVE_SECONDS_" + os.environ["RANK"], "0.5")))
    print("saved by rank", os.environ["RANK"], flush=True)
    sys.exit(75)

signal.signal(signal.SIGTERM, save_and_leave)
print("ready", flush=True)
time.sleep(60)
"""


def test_an_elastic_stop_lets_every_worker_save_and_log_before_the_instance_exits_75(
    cluster: Cluster,
) -> None:
    (cluster.code / "save.py").write_text(SAVES_ON_SIGTERM)
    h = cluster.start("python3 save.py", mode="distributed", gpus=((0,), (1,)), elastic=True)
    until_both_ready(cluster.backend, h.instance_id)
    cluster.backend.stop(h.instance_id, grace_seconds=10, notice=True)
    ended = cluster.wait(h.instance_id, timeout=5)
    assert (ended.exit_code, ended.reason) == (75, "exit code 75")
    combined = cluster.backend.read_log(h.instance_id)
    assert "[worker 0] [rank 0] saved by rank 0" in combined
    assert "[worker 1] [rank 1] saved by rank 1" in combined


def test_the_old_server_wide_launcher_option_is_refused_with_the_job_field_to_use() -> None:
    with pytest.raises(ValidationError, match=r"launcher is no longer a backend option.*`processes`"):
        LocalOptions(launcher="mpirun")


def test_a_slow_saver_keeps_the_whole_grace_of_the_stop_after_another_worker_saved(cluster: Cluster) -> None:
    # The failure grace (0.3 s) is for a gang whose worker failed unasked, not for one saving on notice.
    backend = cluster.new_backend(failure_grace_seconds=0.3)
    (cluster.code / "save.py").write_text(SAVES_ON_SIGTERM)
    h = cluster.start(
        "SAVE_SECONDS_0=0 SAVE_SECONDS_1=1.5 python3 save.py",
        backend=backend,
        mode="distributed",
        gpus=((0,), (1,)),
        elastic=True,
    )
    until_both_ready(backend, h.instance_id)
    backend.stop(h.instance_id, grace_seconds=10, notice=True)
    ended = cluster.wait(h.instance_id, timeout=5, backend=backend)
    assert (ended.exit_code, ended.reason) == (75, "exit code 75")
    assert "[worker 1] [rank 1] saved by rank 1" in backend.read_log(h.instance_id)


COUNTS_SIGTERMS = """
import os, signal, sys, time
got = []
signal.signal(signal.SIGTERM, lambda *a: got.append(1))
print("ready", flush=True)
while not got:
    time.sleep(0.01)
time.sleep(1)  # any second SIGTERM would come within this
print("sigterms", os.environ["RANK"], len(got), flush=True)
sys.exit(75)
"""


def test_a_stop_sends_each_process_one_sigterm(cluster: Cluster) -> None:
    # A second one could reach a job that saved and is exiting after its handler is gone, and kill it.
    (cluster.code / "count.py").write_text(COUNTS_SIGTERMS)
    h = cluster.start("python3 count.py", mode="distributed", gpus=((0,), (1,)), elastic=True)
    until_both_ready(cluster.backend, h.instance_id)
    cluster.backend.stop(h.instance_id, grace_seconds=10, notice=True)
    ended = cluster.wait(h.instance_id, timeout=5)
    assert (ended.exit_code, ended.reason) == (75, "exit code 75")
    combined = cluster.backend.read_log(h.instance_id)
    assert "sigterms 0 1" in combined and "sigterms 1 1" in combined, combined
