"""Resizing with the real local backend and real processes: a high job shrinks a resizable
distributed job by whole workers, it keeps running at its new size, and grows back when the high job
ends. The controller is stepped by hand, on both stores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hai_airflow.scheduling import resize
from tests.server.conftest import Api
from tests.server.control.instances import instances

INCLUDE = Path(__file__).resolve().parents[2] / "include"
TRAINING = 240.0
"""Seconds a stage of the Horovod job may take on a loaded 2-core machine."""

WORKER = """
import os, pathlib, signal, sys, time
model = pathlib.Path(os.environ["HAI_MODEL_DIR"])
notice = pathlib.Path(os.environ["HAI_PREEMPT_NOTICE"])
rank, size = os.environ["RANK"], os.environ["WORLD_SIZE"]
signal.signal(signal.SIGTERM, lambda *a: None)  # save first, then leave
run = os.environ["HAI_INSTANCE_ID"]
(model / f"size-{run}-{rank}").write_text(size)
while not notice.exists():
    if (model / "finish").exists():
        sys.exit(0)
    time.sleep(0.05)
if rank == "0":
    (model / f"step-{run}.pt").write_text("saved on notice")
signal.signal(signal.SIGTERM, signal.SIG_IGN)
sys.exit(75)
"""


@pytest.fixture
def run(api: Api) -> Api:
    (api.code / "worker.py").write_text(WORKER)
    api.with_controller()
    return api


def sizes(api: Api, job_id: int, instance_id: int) -> dict[str, str]:
    model = api.ctx.home / "jobs" / str(job_id) / "model"
    return {p.name.rsplit("-", 1)[1]: p.read_text() for p in model.glob(f"size-{instance_id}-*")}


def test_high_job_shrinks_a_resizable_job_which_grows_back_when_it_ends(
    run: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resize, "SETTLE_SECONDS", 1.0)  # grow back as soon as the GPUs are free
    low = run.submit(mode="distributed", workers=4, worker_resource_pkg=455, min_workers=2,
                     processes="per-worker", cmd="exec python3 worker.py")
    assert low["spec"]["elastic"] is True, "min_workers implies elastic"
    run.until_state(low["id"], "RUNNING")
    first = instances(run, low["id"])[0]
    run.until(lambda: len(sizes(run, low["id"], first["id"])) == 4, what="4 workers up")
    assert set(sizes(run, low["id"], first["id"]).values()) == {"4"}

    high = run.submit(user="dave", cmd="sleep 3", resource_pkg=456, max_schedule=4)
    run.until_state(high["id"], "RUNNING", timeout=15)
    run.until(lambda: len(instances(run, low["id"])) == 2 and run.job(low["id"])["state"] == "RUNNING",
              what="the low job running again")
    second = instances(run, low["id"])[1]
    ended = instances(run, low["id"])[0]
    assert (ended["end_reason"], ended["exit_code"]) == ("resized", 75)
    assert len(second["placement"]) == 2 and second["resume"] is True
    assert second["checkpoint"].endswith(f"step-{first['id']}.pt")
    run.until(lambda: len(sizes(run, low["id"], second["id"])) == 2, what="2 workers up")
    assert sizes(run, low["id"], second["id"]) == {"0": "2", "1": "2"}, "ranks renumbered for 2 workers"
    kept = {(w["node"], tuple(w["gpus"])) for w in first["placement"][:2]}
    assert {(w["node"], tuple(w["gpus"])) for w in second["placement"]} == kept, "it keeps its first workers"

    run.until_state(high["id"], "SUCCEEDED", timeout=15)
    run.until(lambda: len(instances(run, low["id"])) == 3 and run.job(low["id"])["state"] == "RUNNING",
              what="the low job grown back")
    third = instances(run, low["id"])[2]
    assert len(third["placement"]) == 4
    run.until(lambda: len(sizes(run, low["id"], third["id"])) == 4, what="4 workers up again")
    assert set(sizes(run, low["id"], third["id"]).values()) == {"4"}

    (run.ctx.home / "jobs" / str(low["id"]) / "model" / "finish").write_text("")
    done = run.until_state(low["id"], "SUCCEEDED", timeout=15)
    assert done["preemptions"] == 0, "a resize is not a preemption"
    kinds = [e["kind"] for e in done["events"]]
    assert kinds.count("resizing") == 2 and kinds.count("resized") == 2
    ledger = run.get("/admin/check").json()
    assert (ledger["instances"], ledger["problems"]) == (4, []), "legal moves, no GPU held twice"


def test_a_resizable_job_at_its_least_workers_is_suspended_whole(run: Api) -> None:
    low = run.submit(mode="distributed", workers=2, worker_resource_pkg=456, min_workers=2,
                     processes="per-worker", cmd="exec python3 worker.py")
    assert low["spec"]["min_workers"] == 2
    run.until_state(low["id"], "RUNNING")
    high = run.submit(user="dave", cmd="sleep 1", resource_pkg=456, max_schedule=4)
    run.until_state(high["id"], "RUNNING", timeout=15)
    assert instances(run, low["id"])[0]["end_reason"] == "preempted"


HOROVOD_ARGS = "--samples 2072 --batch-size 8 --lr 0.005 --ckpt-every 5 --seed 0 --step-sleep 0.25"


@pytest.mark.slow
def test_a_horovod_job_shrunk_and_grown_by_the_platform_trains_every_sample(run: Api) -> None:
    """The platform's own decisions on a plain `python3 train_distributed.py` (real Horovod, 4 ranks
    of 1 GPU): a high job shrinks it to 2 ranks, it grows back to 4 when that job ends, and it ends on
    exactly the planned samples with a loss within training noise (tests/training/test_resize_live.py
    measures the noise against unresized runs)."""
    pytest.importorskip("horovod.torch", reason="Horovod is not installed: make provision builds it")
    for script in INCLUDE.glob("*.py"):
        (run.code / script.name).write_text(script.read_text())
    run.submit(user="dave", cmd="sleep 600", resource_pkg=456, max_schedule=4)  # 4 GPUs nobody preempts
    low = run.submit(mode="distributed", workers=4, worker_resource_pkg=454, min_workers=2,
                     env={"OMP_NUM_THREADS": "1", "HOROVOD_FUSION_THRESHOLD": "0"},
                     cmd=f"exec python3 train_distributed.py {HOROVOD_ARGS}")
    model = run.ctx.home / "jobs" / str(low["id"]) / "model"
    run.until(lambda: any(model.glob("checkpoint-*.pt")), TRAINING, "a checkpoint at 4 ranks")
    high = run.submit(user="dave", cmd="sleep 5", resource_pkg=455, max_schedule=4)
    run.until_state(high["id"], "RUNNING", timeout=TRAINING)
    run.until_state(high["id"], "SUCCEEDED", timeout=TRAINING)
    done = run.until_state(low["id"], "SUCCEEDED", "FAILED", timeout=TRAINING)
    runs = instances(run, low["id"])
    logs = [run.get(f"/instances/{i['id']}/log", params={"tail": 0}).text for i in runs]
    assert done["state"] == "SUCCEEDED", logs[-1][-3000:]
    assert [len(i["placement"]) for i in runs] == [4, 2, 4]
    assert [i["end_reason"] for i in runs] == ["resized", "resized", "completed"]
    assert "hvd.size()=2:" in logs[1] and "resuming at sample" in logs[1]
    assert "hvd.size()=4:" in logs[2] and "(saved at size 2)" in logs[2]
    finals = [json.loads((model / f"final-rank{r}.json").read_text()) for r in range(4)]
    assert {(f["samples"], f["size"]) for f in finals} == {(2072, 4)}
    assert len({f["weights_sha256"] for f in finals}) == 1
    assert float(finals[0]["loss"]) <= 0.171 + 0.1, "unresized runs end at 0.119-0.171 (seeds 0-3)"
