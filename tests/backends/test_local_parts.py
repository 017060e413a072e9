"""The local backend's pure parts: worker slots and variables, image PATH, the rank launcher, log tails."""

from __future__ import annotations

from pathlib import Path

from hai_airflow.backends.common.log_files import read_tail
from hai_airflow.backends.common.workerenv import (
    Gang,
    WorkerSlot,
    gang_env,
    image_env,
    launcher_argv,
    rank_env,
    worker_env,
    worker_slots,
)
from hai_airflow.scheduling.model import WorkerPlacement as W
from hai_airflow.spec import CpuJobSpec, DistributedJobSpec

# GPU indices here are placement data only; nothing touches a GPU.


def test_local_ranks_count_workers_on_the_same_node() -> None:
    slots = worker_slots((W("a", (0, 1)), W("b", (0, 1)), W("a", (2, 3))))
    assert slots == [
        WorkerSlot(0, "a", (0, 1), 0, 2),
        WorkerSlot(1, "b", (0, 1), 0, 1),
        WorkerSlot(2, "a", (2, 3), 1, 2),
    ]


def test_standalone_worker_gets_no_rank_variables() -> None:
    env = worker_env(WorkerSlot(0, "a", (3,), 0, 1), workers=1, distributed=False, master_port=1234)
    assert env == {
        "CUDA_VISIBLE_DEVICES": "3",
        "HAI_WORKER_INDEX": "0",
        "HAI_WORKERS": "1",
        "HAI_NODE": "a",
        "HAI_GPUS_PER_WORKER": "1",
    }


def test_distributed_worker_gets_horovod_and_torch_variables() -> None:
    env = worker_env(WorkerSlot(2, "a", (2, 3), 1, 2), workers=3, distributed=True, master_port=29500)
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")} == {
        "RANK": "2",
        "WORLD_SIZE": "3",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
    }
    assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"], env["HOROVOD_LOCAL_RANK"]) == ("2", "3", "1")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["HAI_GPUS_PER_WORKER"]) == ("127.0.0.1", "29500", "2")


def test_a_container_worker_sees_its_gpus_from_0_and_meets_worker_0_at_the_gang_address() -> None:
    gang = Gang("w0.hai-7", 29500, "w0.hai-7", 29400, "eth0", "0.0.0.0")
    spec = DistributedJobSpec(
        task_name="t", code_path="/c", cmd="x", workers=2, worker_resource_pkg=1, processes="per-worker"
    )
    env = rank_env(spec, WorkerSlot(1, "b", (4, 5), 0, 1), 2, gang)
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"]) == ("1", "2", "w0.hai-7")
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"  # what the engine passed, numbered inside
    assert (
        rank_env(spec, WorkerSlot(1, "b", (4, 5), 0, 1), 2, gang, renumber=False)["CUDA_VISIBLE_DEVICES"]
        == "4,5"
    )
    per_gpu = spec.model_copy(update={"processes": "per-gpu"})  # the rank launcher's variables instead
    assert rank_env(per_gpu, WorkerSlot(1, "b", (4, 5), 0, 1), 2, gang)["HOROVOD_CROSS_RANK"] == "1"
    assert "HOROVOD_CROSS_RANK" not in rank_env(
        per_gpu, WorkerSlot(1, "b", (4, 5), 0, 1), 2, gang, launcher=False
    )
    cpu = CpuJobSpec(task_name="t", code_path="/c", cmd="x")
    assert rank_env(cpu, WorkerSlot(0, "", (), 0, 1), 1, gang)["HAI_WORKERS"] == "1"


def test_image_env_puts_the_venv_first_and_leaves_others_alone() -> None:
    assert image_env({"PATH": "/usr/bin"}, "/opt/venvs/t/")["PATH"] == "/opt/venvs/t/bin:/usr/bin"
    assert image_env({"PATH": "/usr/bin"}, None) == {"PATH": "/usr/bin"}


def test_the_rank_launcher_starts_one_process_per_gpu_and_worker_0_serves_the_rendezvous() -> None:
    gang = Gang("w0", 29500, "w0", 29400, "eth0", "0.0.0.0")
    first, second = worker_slots((W("a", (0, 1, 2)), W("b", (4, 5, 6))))
    argv = launcher_argv("python3 train.py --lr 0.1", first, gang)
    assert argv[:2] == ["/bin/sh", "-c"] and argv[4:] == [
        "3",
        "0",
        "0.0.0.0:29400",
        "python3 train.py --lr 0.1",
    ]
    assert launcher_argv("x", second, gang)[4:] == ["3", "3", "-", "x"]
    env = gang_env(second, 2, gang)
    assert (env["WORLD_SIZE"], env["HOROVOD_SIZE"], env["HOROVOD_LOCAL_SIZE"]) == ("6", "6", "3")
    assert (env["HOROVOD_CROSS_RANK"], env["HOROVOD_CROSS_SIZE"], env["CUDA_VISIBLE_DEVICES"]) == (
        "1",
        "2",
        "4,5,6",
    )
    # The per-process variables are the launcher's to set, never shared by a whole worker.
    assert not {"RANK", "LOCAL_RANK", "HOROVOD_RANK", "HOROVOD_LOCAL_RANK"} & set(env)


def test_a_worker_without_gpus_runs_one_process() -> None:
    (slot,) = worker_slots((W("a", ()),))
    gang = Gang("127.0.0.1", 1, "127.0.0.1", 2, "lo", "127.0.0.1")
    assert launcher_argv("x", slot, gang)[4:6] == ["1", "0"]
    assert gang_env(slot, 1, gang)["HOROVOD_SIZE"] == "1"


def test_read_tail_crosses_block_boundaries(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    log.write_text("".join(f"line {i:06d} " + "x" * 200 + "\n" for i in range(2000)))
    tail = read_tail(log, 3, home=None).splitlines()
    assert [x[:11] for x in tail] == ["line 001997", "line 001998", "line 001999"]
    assert read_tail(log, 5000, home=None).count("\n") == 2000
    assert read_tail(tmp_path / "none.log", 3, home=None) == ""


def test_read_tail_without_final_newline(tmp_path: Path) -> None:
    log = tmp_path / "p.log"
    log.write_text("a\nb\nprogress 50%")
    assert read_tail(log, 2, home=None) == "b\nprogress 50%"
