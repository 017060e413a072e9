"""Table tests of `plan`: each case is a small cluster and queue, and the whole list of decisions."""

from __future__ import annotations

import copy

import pytest

from hai_airflow.scheduling import POLICIES, plan
from hai_airflow.scheduling.model import (
    Admit,
    Decision,
    Reject,
    Reservation,
    Reserve,
    Snapshot,
    Suspend,
    Wait,
)

from .builders import T0, JobBuilder, job, node, snapshot, wp

LONGEST = "the longest-running low-priority job whose suspension makes room"
NO_VICTIM = "suspending running low-priority jobs would not make room"
SET_RULE = f"no single job frees enough; fewest jobs in order: {LONGEST}"
FULL = "needs 8xV100 on one node; largest free block is 0"
ALL8 = tuple(range(8))


def full_node(job_id: int, name: str, since: float) -> JobBuilder:
    """A low-priority job filling an 8-GPU node since `since`."""
    return job(job_id).low().gpus(8).running_since(since).on(name)


CASES = [
    pytest.param(
        snapshot([node("n1"), node("n2")], [
            job(9).gpus(4).running_since(T0 - 10).on("n1"),
            job(1).gpus(4),
        ]),
        [Admit(1, (wp("n1", 4, 5, 6, 7),), False, "starts on n1 GPUs 4-7")],
        id="best fit: a 4-GPU job fills the half-used node, not the empty one",
    ),
    pytest.param(
        snapshot([node("n1"), node("n2"), node("n3")], [
            full_node(11, "n1", T0 - 100), full_node(12, "n2", T0 - 300), full_node(13, "n3", T0 - 200),
            job(1).high().gpus(8),
        ]),
        [
            Suspend(12, 1, f"suspended so high-priority job 1 can run ({LONGEST})"),
            Reserve(1, (wp("n2", *ALL8),), "GPUs freed by suspending job 12 are held for job 1: n2 GPUs 0-7"),
            Wait(1, "waiting for job 12 to suspend", 1, 12),
        ],
        id="suspends the longest-running low job",
    ),
    pytest.param(
        snapshot([node("n1"), node("n2")], [
            job(11).low().gpus(4).running_since(T0 - 500).on("n1"),
            job(12).low().gpus(4).running_since(T0 - 400).on("n1", first=4),
            full_node(13, "n2", T0 - 100),
            job(1).high().gpus(8),
        ]),
        [
            Suspend(13, 1, f"suspended so high-priority job 1 can run ({LONGEST})"),
            Reserve(1, (wp("n2", *ALL8),), "GPUs freed by suspending job 13 are held for job 1: n2 GPUs 0-7"),
            Wait(1, "waiting for job 13 to suspend", 1, 13),
        ],
        id="a single sufficient victim is preferred over a longer-running set",
    ),
    pytest.param(
        snapshot([node("n1"), node("n2")], [
            job(21).low().gpus(4).running_since(T0 - 900).on("n1"),
            job(24).low().gpus(4).running_since(T0 - 850).on("n2"),
            job(22).low().gpus(4).running_since(T0 - 800).on("n1", first=4),
            job(25).low().gpus(4).running_since(T0 - 100).on("n2", first=4),
            job(1).high().gpus(8),
        ]),
        [
            *(Suspend(v, 1, "suspended so high-priority job 1 can run (no single job frees enough; "
                            f"fewest jobs in order: {LONGEST})") for v in (21, 22)),
            Reserve(1, (wp("n1", *ALL8),), "GPUs freed by suspending jobs 21, 22 are held for job 1: "
                                           "n1 GPUs 0-7"),
            Wait(1, "waiting for jobs 21, 22 to suspend", 1, 21),
        ],
        id="a victim set when no single job suffices, the unneeded job 24 dropped",
    ),
    pytest.param(
        snapshot([node("n1")], [
            job(11).high().gpus(8).running_since(T0 - 900).on("n1"),
            job(1).high().gpus(8),
        ]),
        [Wait(1, f"{FULL}; {NO_VICTIM}; nodes n1 are kept for it (starvation guard)", 1)],
        id="high never preempts high",
    ),
    pytest.param(
        snapshot([node("n1")], [full_node(11, "n1", T0 - 900), job(1).low().gpus(8)]),
        [Wait(1, FULL, 1)],
        id="low never preempts",
    ),
    pytest.param(
        snapshot([node("n1"), node("n2")], [
            job(11).high().gpus(8).by("alice").running_since(T0 - 50).on("n1"),
            job(1).high().gpus(8).by("alice"),
            job(2).low().gpus(8).by("alice"),
        ], users={"alice": 8}),
        [
            Wait(1, "over your high-priority quota (16/8 GPUs in group vision)", 1),
            Admit(2, (wp("n2", *ALL8),), False, "starts on n2 GPUs 0-7"),
        ],
        id="over the user's quota a high job waits; a low one runs",
    ),
    pytest.param(
        snapshot([node("n1"), node("n2")], [
            job(11).high().gpus(8).by("bob").running_since(T0 - 50).on("n1"),
            job(1).high().gpus(8).by("alice"),
        ], groups={"vision": 8}),
        [Wait(1, "over group vision's high-priority quota (16/8 GPUs)", 1)],
        id="over the group's quota a high job waits",
    ),
    pytest.param(
        snapshot([node("n1"), node("n2"), node("n3")], [
            job(1).high().gpus(8).by("alice"),
            job(2).high(8).gpus(8).by("alice"),
            job(3).high(24).gpus(8).by("alice"),
        ], users={"alice": 16}),
        [
            Admit(1, (wp("n1", *ALL8),), False, "starts on n1 GPUs 0-7"),
            Admit(2, (wp("n2", *ALL8),), False, "starts on n2 GPUs 0-7"),
            Wait(3, "over your high-priority quota (24/16 GPUs in group vision)", 1),
        ],
        id="admissions in one cycle count against quota at once",
    ),
    pytest.param(
        snapshot([node("n1"), node("n2")], [
            job(9).gpus(4).running_since(T0 - 10).on("n2"),
            job(1).gpus(8).workers(2),
            job(2).gpus(4).submitted(T0 - 30),
        ]),
        [
            Wait(1, "needs 2 workers of 8xV100; room for 1 now", 1),
            Admit(2, (wp("n2", 4, 5, 6, 7),), False, "starts on n2 GPUs 4-7"),
        ],
        id="gang: two 8-GPU workers get both nodes or none",
    ),
    pytest.param(
        snapshot([node("n1"), node("n2")], [job(1).gpus(8).workers(2)]),
        [Admit(1, (wp("n1", *ALL8), wp("n2", *ALL8)), False, "starts on n1 GPUs 0-7, n2 GPUs 0-7")],
        id="gang: whole-node workers go on distinct nodes",
    ),
    pytest.param(
        snapshot([node("v1"), node("a1", "A100")], [
            job(1).gpus(8, "A100").submitted(T0 - 90),
            job(2).gpus(2, "V100").submitted(T0 - 80),
            job(3).gpus(2, "A100"),
        ]),
        [
            Admit(1, (wp("a1", *ALL8),), False, "starts on a1 GPUs 0-7"),
            Admit(2, (wp("v1", 0, 1),), False, "starts on v1 GPUs 0-1"),
            Wait(3, "needs 2xA100 on one node; largest free block is 0", 1),
        ],
        id="GPU type is respected",
    ),
    pytest.param(
        snapshot([node("n1")], [
            job(1).gpus(2, "T4"),
            job(2).gpus(16),
            job(3).gpus(8).workers(2),
            job(4).cpu_only(64, 8),
        ]),
        [
            Reject(1, "no node has GPU type T4 (this cluster has V100)"),
            Reject(2, "needs 16 GPUs per worker; the largest V100 node has 8"),
            Reject(3, "needs 2 workers of 8xV100; the whole cluster has room for 1"),
            Reject(4, "needs 64 CPUs / 8 GB per worker; no node with 0 GPUs has that much"),
        ],
        id="jobs that can never fit are rejected",
    ),
    pytest.param(
        snapshot([node("n1", cpus=8, memory_gb=64)], [
            job(1).gpus(2).resources(6, 16).submitted(T0 - 90),
            job(2).gpus(2).resources(4, 16).submitted(T0 - 80),
            job(3).cpu_only(2, 48),
        ]),
        [
            Admit(1, (wp("n1", 0, 1, cpus=6, memory_gb=16),), False, "starts on n1 GPUs 0-1"),
            Wait(2, "needs 2xV100 on one node; nodes with 2 free GPUs lack 4 CPUs / 16 GB free", 1),
            Admit(3, (wp("n1", cpus=2, memory_gb=48),), False, "starts on n1"),
        ],
        id="CPUs and memory limit placement; CPU jobs place by CPUs and memory only",
    ),
    pytest.param(
        snapshot([node("n1")], [
            job(1).gpus(8).submitted(T0 - 100),
            job(2).gpus(8).submitted(T0 - 900).suspended(since=T0 - 600),
        ]),
        [
            Admit(2, (wp("n1", *ALL8),), True, "resumes on n1 GPUs 0-7"),
            Wait(1, FULL, 1),
        ],
        id="a suspended job resumes before a newer pending low job",
    ),
    pytest.param(
        snapshot([node("n1"), node("n2")], [
            job(11).low().gpus(4).running_since(T0 - 900).on("n1").suspending(),
            full_node(12, "n2", T0 - 950),
            job(7).high().gpus(8),
            job(3).low().gpus(4),
        ], reservations=(Reservation(7, "n1", ALL8),)),
        [
            Wait(7, "waiting for job 11 to suspend", 1, 11),
            Wait(3, "needs 4xV100 on one node; largest free block is 0", 2),
        ],
        id="reserved GPUs stay free for their job, which takes no new victims meanwhile",
    ),
    pytest.param(
        snapshot([node("n1"), node("n2")], [
            job(9).gpus(4).running_since(T0 - 10).on("n2"),
            job(7).high().gpus(4),
        ], reservations=(Reservation(7, "n1", (4, 5, 6, 7)),), users={"alice": 4}),
        [Admit(7, (wp("n1", 4, 5, 6, 7),), False, "starts on n1 GPUs 4-7 on its reserved GPUs")],
        id="a job is admitted onto its reserved GPUs once they are free, counted once against quota",
    ),
    pytest.param(
        snapshot([node("n1"), node("n2")], [
            job(11).low().gpus(8).running_since(T0 - 900).on("n1").suspending(),
            job(7).high(24).gpus(8),
            job(8).high(4).gpus(8),
        ], reservations=(Reservation(7, "n1", ALL8),), users={"alice": 8}),
        [
            Wait(8, "over your high-priority quota (16/8 GPUs in group vision)", 1),
            Admit(7, (wp("n2", *ALL8),), False, "starts on n2 GPUs 0-7"),
        ],
        id="a job with a reservation counts against quota, and starts elsewhere if it can",
    ),
    pytest.param(
        snapshot([node("n1")], [
            job(7).high().gpus(8).running_since(T0 - 10).on("n1"),
            job(3).gpus(2, "A100"),
            job(4).gpus(2),
        ], reservations=(Reservation(7, "n1", ALL8),)),
        [
            Reject(3, "no node has GPU type A100 (this cluster has V100)"),
            Wait(4, FULL.replace("8x", "2x"), 1),
        ],
        id="a reservation of a job that no longer waits is ignored",
    ),
    pytest.param(
        snapshot([node("n1"), node("n2"), node("n3")], [
            job(11).high().gpus(8).running_since(T0 - 90).on("n1"),
            job(12).high().gpus(4).running_since(T0 - 90).on("n2"),
            job(13).high().gpus(6).running_since(T0 - 90).on("n3"),
            job(1).high().gpus(8),
            job(2).low().gpus(4).submitted(T0 - 500),
            job(3).low().gpus(2),
        ]),
        [
            Wait(1, "needs 8xV100 on one node; largest free block is 4; "
                    f"{NO_VICTIM}; nodes n2 are kept for it (starvation guard)", 1),
            Wait(2, "nodes n2 reserved for job 1 (starvation guard)", 2, 1),
            Admit(3, (wp("n3", 6, 7),), False, "starts on n3 GPUs 6-7"),
        ],
        id="starvation guard keeps the nearest node for the first high job",
    ),
    pytest.param(
        snapshot([node("n1", cpus=8, memory_gb=64)], [
            job(11).low().gpus(8).resources(6, 16).running_since(T0 - 900).on("n1"),
            job(1).high().cpu_only(6, 8),
        ]),
        [Wait(1, "needs 6 CPUs / 8 GB on one node; no node has that much CPU and memory free", 1)],
        id="a CPU job never suspends a GPU job, whatever its max_schedule says",
    ),
    pytest.param(
        snapshot([node("n1", cpus=16), node("n2", cpus=16)], [
            job(11).low().cpu_only(16, 8).running_since(T0 - 3000).on("n1"),
            job(12).low().gpus(8).resources(8, 64).running_since(T0 - 2000).on("n2"),
            job(1).high().gpus(8).resources(8, 64).workers(2),
        ]),
        [
            Suspend(11, 1, f"suspended so high-priority job 1 can run ({SET_RULE})"),
            Suspend(12, 1, f"suspended so high-priority job 1 can run ({SET_RULE})"),
            Reserve(1, (wp("n1", *ALL8, cpus=8, memory_gb=64), wp("n2", *ALL8, cpus=8, memory_gb=64)),
                    "GPUs freed by suspending jobs 11, 12 are held for job 1: n1 GPUs 0-7, n2 GPUs 0-7"),
            Wait(1, "waiting for jobs 11, 12 to suspend", 1, 11),
        ],
        id="a victim that frees only CPUs counts where GPUs are free: every resource is asked",
    ),
    pytest.param(
        snapshot([node("n1", cpus=16)], [
            job(11).low().cpu_only(16, 8).running_since(T0 - 3000).on("n1"),
            job(1).high().gpus(1).resources(4, 8).workers(2),
        ]),
        [
            Suspend(11, 1, f"suspended so high-priority job 1 can run ({LONGEST})"),
            Reserve(1, (wp("n1", 0, cpus=4, memory_gb=8), wp("n1", 1, cpus=4, memory_gb=8)),
                    "GPUs freed by suspending job 11 are held for job 1: n1 GPU 0, n1 GPU 1"),
            Wait(1, "waiting for job 11 to suspend", 1, 11),
        ],
        id="one victim freeing CPUs on one node can make room for a whole gang there",
    ),
]


@pytest.mark.parametrize(("snap", "expected"), CASES)
def test_plan(snap: Snapshot, expected: list[Decision]) -> None:
    assert plan(snap, T0) == expected


def policy_race(policy: str) -> Snapshot:
    """Three full nodes: 11 ran longest, 12 checkpointed just now, 13 started last."""
    return snapshot([node("n1"), node("n2"), node("n3")], [
        job(11).low().gpus(8).running_since(T0 - 3000).checkpoint_at(T0 - 1000).on("n1"),
        job(12).low().gpus(8).running_since(T0 - 2000).checkpoint_at(T0 - 5).on("n2"),
        job(13).low().gpus(8).running_since(T0 - 100).on("n3"),
        job(1).high().gpus(8),
    ], policy=policy)


@pytest.mark.parametrize(
    ("policy", "victim"),
    [
        pytest.param("seed", 11, id="seed suspends the longest-running job"),
        pytest.param("least-lost-work", 12, id="least-lost-work suspends the freshest checkpoint"),
        pytest.param("newest-first", 13, id="newest-first suspends the latest start"),
    ],
)
def test_policy_victim(policy: str, victim: int) -> None:
    node_of = {11: "n1", 12: "n2", 13: "n3"}
    rule = POLICIES[policy].victim_rule
    assert plan(policy_race(policy), T0) == [
        Suspend(victim, 1, f"suspended so high-priority job 1 can run ({rule})"),
        Reserve(1, (wp(node_of[victim], *ALL8),),
                f"GPUs freed by suspending job {victim} are held for job 1: {node_of[victim]} GPUs 0-7"),
        Wait(1, f"waiting for job {victim} to suspend", 1, victim),
    ]


def test_fifo_never_preempts_and_ignores_priority() -> None:
    snap = snapshot([node("n1"), node("n2")], [
        full_node(11, "n1", T0 - 3000),
        job(1).high().gpus(8).submitted(T0 - 10),
        job(2).low().gpus(8).submitted(T0 - 20),
    ], policy="fifo")
    assert plan(snap, T0) == [
        Admit(2, (wp("n2", *ALL8),), False, "starts on n2 GPUs 0-7"),
        Wait(1, f"{FULL}; nodes n1 are kept for it (starvation guard)", 1),
    ]


def test_unknown_policy_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown scheduling policy 'lottery'"):
        plan(snapshot([node("n1")], [], policy="lottery"), T0)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_snapshot_is_never_mutated(policy: str) -> None:
    snap = snapshot([node("n1"), node("n2"), node("a1", "A100")], [
        job(11).low().gpus(4).running_since(T0 - 900).on("n1"),
        job(12).low().gpus(8).running_since(T0 - 800).on("n2"),
        job(13).low().gpus(4).running_since(T0 - 700).on("n1", first=4).suspending(),
        job(1).high().gpus(8),
        job(2).high().gpus(8, "A100").workers(2),
        job(3).gpus(4).suspended(since=T0 - 30),
        job(4).cpu_only(2, 4),
    ], users={"alice": 64}, reservations=(Reservation(3, "n1", (4, 5, 6, 7)),), policy=policy)
    before = copy.deepcopy(snap)
    first = plan(snap, T0)
    assert snap == before
    assert plan(snap, T0) == first


def test_a_shape_that_failed_is_placed_later_in_the_cycle_once_unused_reserved_gpus_come_back() -> None:
    # fifo: job 3 comes first and finds no room (n1's GPUs are set aside for job 7, n2 is full);
    # job 7 starts on two of its four reserved GPUs and gives the other two back; job 4, of job 3's
    # shape, then fits there. A memo of job 3's failure must not outlive the capacity it was found on.
    snap = snapshot([node("n1", gpus=4), node("n2", gpus=4)], [
        job(9).gpus(4).running_since(T0 - 10).on("n2"),
        job(3).gpus(2).submitted(T0 - 300),
        job(7).high().gpus(2).submitted(T0 - 200),
        job(4).gpus(2).submitted(T0 - 100),
    ], reservations=(Reservation(7, "n1", (0, 1, 2, 3)),), policy="fifo")
    decisions = plan(snap, T0)
    assert decisions[1:] == [
        Admit(7, (wp("n1", 0, 1),), False, "starts on n1 GPUs 0-1 on its reserved GPUs"),
        Admit(4, (wp("n1", 2, 3),), False, "starts on n1 GPUs 2-3"),
    ]
    assert isinstance(decisions[0], Wait) and decisions[0].job_id == 3
