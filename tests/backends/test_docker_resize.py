"""Resizing with `hai serve` on the docker backend: a high job shrinks a resizable distributed job of 4
containers to 2, its next instance's containers see the smaller gang (WORLD_SIZE, ranks 0 and 1), and it
grows back to 4 containers when the high job ends. `resize_scenario` is shared with the kube node tier."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hai_airflow.backends.docker import containers as cfg
from hai_airflow.client import HaiClient
from hai_airflow.spec import DistributedJobSpec, InstanceView, StandaloneJobSpec
from tests.support.docker_engine import Engine, docker_server
from tests.support.live_server import LiveServer

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TIMEOUT = 120.0

WORKER = """trap '' TERM
echo "$WORLD_SIZE" > "$HAI_MODEL_DIR/size-$HAI_INSTANCE_ID-$RANK"
while [ ! -e "$HAI_PREEMPT_NOTICE" ]; do
  if [ -e "$HAI_MODEL_DIR/finish" ]; then exit 0; fi
  sleep 0.2
done
if [ "$RANK" = 0 ]; then echo "saved on notice" > "$HAI_MODEL_DIR/step-$HAI_INSTANCE_ID.pt"; fi
exit 75"""
"""A busybox worker: writes the gang size it sees, saves on the notice (rank 0) and exits 75, or ends
with 0 once the test writes `finish` to the model dir."""


def resizable_job(code: Path, model: Path, image: str, pkg: int) -> DistributedJobSpec:
    """4 workers of package `pkg`, resizable down to 2, one process per worker running `WORKER`."""
    return DistributedJobSpec(
        task_name="resizable", code_path=str(code), model_dir=str(model), image=image, cmd=WORKER,
        workers=4, worker_resource_pkg=pkg, min_workers=2, processes="per-worker",
    )  # fmt: skip


def high_job(code: Path, image: str, pkg: int) -> StandaloneJobSpec:
    """A high-priority job (max_schedule) needing GPUs only a shrink of the resizable job frees."""
    return StandaloneJobSpec(
        task_name="urgent", code_path=str(code), image=image, resource_pkg=pkg, max_schedule=4, cmd="sleep 3"
    )


def until(check: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(0.2)


def sizes(model: Path, instance_id: int) -> dict[str, str]:
    """Rank -> the WORLD_SIZE its worker saw, of every worker of the instance that has started."""
    return {p.name.rsplit("-", 1)[1]: p.read_text().strip() for p in model.glob(f"size-{instance_id}-*")}


def running_instance(c: HaiClient, job_id: int, count: int) -> InstanceView | None:
    """The job's `count`th instance once the job runs it, else None."""
    found = c.instances(job_id)
    return found[count - 1] if len(found) == count and c.job(job_id).state == "RUNNING" else None


def resize_scenario(
    live: LiveServer, low_spec: DistributedJobSpec, high_spec: StandaloneJobSpec, model: Path,
    tokens: tuple[str, str], workers_of: Callable[[int], int], exit_codes: tuple[int | None, ...] = (75,),
) -> None:  # fmt: skip
    """The low job (first token) is shrunk 4 -> 2 by the high one (second token), then grows back to 4.
    `workers_of`: how many containers or pods the backend runs for an instance; `exit_codes`: what the
    resized instance's exit code may be as the backend sees it."""
    with live.client(tokens[0]) as c, live.client(tokens[1]) as h:
        low = c.submit(low_spec)
        until(lambda: running_instance(c, low.id, 1) is not None, "the low job running")
        first = c.instances(low.id)[0]
        until(lambda: len(sizes(model, first.id)) == 4, "4 workers up")
        assert sizes(model, first.id) == {str(r): "4" for r in range(4)}
        until(lambda: workers_of(first.id) == 4, "4 workers running")

        high = h.submit(high_spec)
        until(lambda: running_instance(c, low.id, 2) is not None, "the low job running at 2 workers")
        ended, second = c.instances(low.id)
        assert ended.end_reason == "resized" and ended.exit_code in exit_codes, ended
        assert len(second.placement) == 2 and second.resume, second
        assert (second.checkpoint or "").endswith(f"step-{first.id}.pt"), second.checkpoint
        kept = [(w.node, w.gpus) for w in first.placement[:2]]
        assert [(w.node, w.gpus) for w in second.placement] == kept, "it keeps its first workers"
        until(lambda: len(sizes(model, second.id)) == 2, "2 workers up")
        assert sizes(model, second.id) == {"0": "2", "1": "2"}, "ranks renumbered for 2 workers"
        until(lambda: workers_of(second.id) == 2, "2 workers running")

        until(lambda: h.job(high.id).state in ("SUCCEEDED", "FAILED"), "the high job's end")
        done_high = h.job(high.id)
        assert done_high.state == "SUCCEEDED", done_high.reason
        until(lambda: running_instance(c, low.id, 3) is not None, "the low job grown back to 4")
        third = c.instances(low.id)[2]
        assert len(third.placement) == 4, third
        until(lambda: len(sizes(model, third.id)) == 4, "4 workers up again")
        assert sizes(model, third.id) == {str(r): "4" for r in range(4)}
        until(lambda: workers_of(third.id) == 4, "4 workers running again")

        (model / "finish").write_text("")
        until(lambda: c.job(low.id).state in ("SUCCEEDED", "FAILED"), "the low job's end")
        done = c.job(low.id)
        assert done.state == "SUCCEEDED", done.reason
        assert (done.instances, done.preemptions) == (3, 0), "a resize is not a preemption"
        kinds = [e.kind for e in done.events]
        assert kinds.count("resizing") == 2 and kinds.count("resized") == 2, kinds


@pytest.fixture
def server(docker_engine: Engine, tmp_path: Path) -> Iterator[tuple[LiveServer, str]]:
    with docker_server(docker_engine, tmp_path / "home") as pair:
        yield pair


def containers_of(engine: Engine, owner: str) -> Callable[[int], int]:
    """How many containers of `owner` an instance has, by their labels."""

    def count(instance_id: int) -> int:
        labels = [f"{cfg.LABEL_OWNER}={owner}", f"{cfg.LABEL_INSTANCE}={instance_id}"]
        return len(engine.client.containers.list(all=True, filters={"label": labels}))  # type: ignore[attr-defined]

    return count


def test_a_high_job_shrinks_a_resizable_job_of_containers_which_grows_back(
    server: tuple[LiveServer, str], busybox_image: str, docker_engine: Engine, tmp_path: Path
) -> None:
    live, owner = server
    # Beside $HAI_HOME, not in it: a mount that contains the server's state is refused.
    code, model = tmp_path / "code", tmp_path / "model"
    code.mkdir()
    model.mkdir()
    low = resizable_job(code, model, busybox_image, pkg=455)  # 4 x 2 of the node's 8 GPUs
    high = high_job(code, busybox_image, pkg=456)
    tokens = ("alice-token", "dave-token")
    resize_scenario(live, low, high, model, tokens, containers_of(docker_engine, owner))
