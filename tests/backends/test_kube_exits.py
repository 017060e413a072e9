"""How a gang of pods decides its instance's end, from the states the watch saw: no cluster needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from hai_airflow.backends.kubernetes.exits import Doomed, Ending, pods_verdict, start_timed_out
from hai_airflow.backends.kubernetes.instance import KubeInstance
from hai_airflow.backends.kubernetes.pods import PodState

TIMEOUT = 60.0


def pod(name: str, phase: str, code: int | None = None, reason: str = "") -> PodState:
    return PodState(name, 1, None, None, phase, code, reason, "", False, None)


def gang(*states: PodState | None, started: float = 0.0, stopping: bool = False) -> KubeInstance:
    names = [f"w{i}" for i in range(len(states))]
    inst = KubeInstance(1, "pods", names, None, None, Path("1.log"), started, stopping=stopping)
    inst.last = {s.name: s for s in states if s is not None}
    return inst


@pytest.mark.parametrize(
    ("states", "now", "stopping", "expected"),
    [
        pytest.param(
            [pod("w0", "Running"), pod("w1", "Running")], 1.0, False, None, id="a running gang goes on"
        ),
        pytest.param(
            [pod("w0", "Failed", 3), pod("w1", "Running")],
            1.0,
            False,
            Doomed("w0", ["w1"]),
            id="one failed worker dooms the running others",
        ),
        pytest.param(
            [pod("w0", "Succeeded", 0), pod("w1", "Succeeded", 0)],
            1.0,
            False,
            Ending(0, "completed"),
            id="every worker completed",
        ),
        pytest.param(
            [pod("w0", "Succeeded", 0), pod("w1", "Running")],
            1.0,
            True,
            None,
            id="a stop ends the gang only once no pod runs",
        ),
        pytest.param(
            [pod("w0", "Pending", reason="InvalidImageName")],
            1.0,
            False,
            Ending(None, "pod w0 cannot start: InvalidImageName"),
            id="a pod that cannot start fails at once",
        ),
        pytest.param(
            [pod("w0", "Running"), pod("w1", "Pending")],
            TIMEOUT + 1,
            False,
            Ending(
                None,
                "not every worker was Running within 60 s (1 of 2 running); torn down to be scheduled again",
                lost=True,
            ),
            id="a gang not formed in time is lost",
        ),
    ],
)
def test_a_gang_s_verdict(states: list[PodState], now: float, stopping: bool, expected: object) -> None:
    inst = gang(*states, stopping=stopping)
    assert pods_verdict(inst, list(states), now, TIMEOUT) == expected


def test_a_pod_deleted_outside_hai_loses_the_instance() -> None:
    inst = gang(pod("w0", "Running"), pod("w1", "Running"))
    assert pods_verdict(inst, [pod("w0", "Running"), None], 1.0, TIMEOUT) == Ending(
        None, "pod w1 was deleted outside hai", lost=True
    )


def test_an_image_that_cannot_be_pulled_fails_instead_of_being_requeued() -> None:
    ending = start_timed_out([pod("w0", "Pending", reason="ImagePullBackOff")], 1, TIMEOUT)
    assert ending.lost is False and ending.reason.startswith("the image cannot be pulled: ")
