"""Property tests of `plan` over random clusters and queues: invariants that must always hold."""

from __future__ import annotations

import copy
from collections import Counter, defaultdict
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hai_airflow.scheduling import POLICIES, plan
from hai_airflow.scheduling.model import (
    PLACED,
    WAITING,
    Admit,
    Decision,
    Job,
    Node,
    Quota,
    Reject,
    Reservation,
    Reserve,
    Snapshot,
    Suspend,
    Wait,
    WorkerPlacement,
)

from .builders import T0

USERS = {"alice": "vision", "bob": "vision", "carol": "nlp"}
LIMITS = st.sampled_from([None, 0, 4, 8, 16, 32])


@st.composite
def shapes(draw: st.DrawFn) -> dict[str, Any]:
    gpus = draw(st.sampled_from([0, 1, 2, 4, 8]))
    return {
        "workers": draw(st.sampled_from([1, 1, 1, 2, 3])),
        "gpus_per_worker": gpus,
        "cpus_per_worker": draw(st.sampled_from([0, 1, 4, 12])),
        "memory_gb_per_worker": draw(st.sampled_from([0, 8, 64])),
        "gpu_type": None if gpus == 0 else draw(st.sampled_from([None, "V100", "A100", "A100", "T4"])),
        "max_schedule": draw(st.sampled_from([0, 0, 4, 24])),
        "user": draw(st.sampled_from(sorted(USERS))),
    }


def first_fit(
    nodes: list[Node], free: dict[str, list[Any]], shape: dict[str, Any]
) -> tuple[WorkerPlacement, ...] | None:
    """Place a running job the simple way, so generated holders never over-allocate a node."""
    placement = []
    for _ in range(shape["workers"]):
        for n in nodes:
            gpus, cpus, mem = free[n.name]
            if (shape["gpu_type"] in (None, n.gpu_type) or shape["gpus_per_worker"] == 0) and (
                len(gpus) >= shape["gpus_per_worker"] and cpus >= shape["cpus_per_worker"]
                and mem >= shape["memory_gb_per_worker"]
            ):
                taken = tuple(gpus[: shape["gpus_per_worker"]])
                free[n.name] = [gpus[len(taken):], cpus - shape["cpus_per_worker"],
                                mem - shape["memory_gb_per_worker"]]
                placement.append(WorkerPlacement(n.name, taken, shape["cpus_per_worker"],
                                                 shape["memory_gb_per_worker"]))
                break
        else:
            return None
    return tuple(placement)


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    nodes = [
        Node(f"n{i}", draw(st.sampled_from(["V100", "A100"])), draw(st.sampled_from([0, 2, 4, 8, 8])),
             draw(st.sampled_from([4, 16, 32])), draw(st.sampled_from([32, 128, 256])),
             draw(st.sampled_from([False, False, False, True])))
        for i in range(draw(st.integers(1, 5)))
    ]
    free = {n.name: [list(range(n.gpus)), n.cpus, n.memory_gb] for n in nodes}
    jobs: list[Job] = []
    for i in range(draw(st.integers(0, 7))):
        shape = draw(shapes())
        placement = first_fit(nodes, free, shape)
        if placement is None:
            continue
        user = shape.pop("user")
        jobs.append(Job(
            id=100 + i, user=user, group=USERS[user], submitted_at=T0 - 5000,
            state=draw(st.sampled_from(["RUNNING", "RUNNING", "STARTING", "SUSPENDING"])),
            started_at=T0 - draw(st.integers(1, 4000)), placement=placement,
            last_checkpoint_at=draw(st.none() | st.just(T0 - 50)), **shape,
        ))
    waiting_ids = []
    for i in range(draw(st.integers(0, 9))):
        shape = draw(shapes())
        user = shape.pop("user")
        suspended = draw(st.booleans())
        jobs.append(Job(
            id=1 + i, user=user, group=USERS[user], submitted_at=T0 - draw(st.integers(0, 3000)),
            state="SUSPENDED" if suspended else "PENDING",
            suspended_at=T0 - 10 if suspended else None, **shape,
        ))
        waiting_ids.append(1 + i)
    reservations: list[Reservation] = []
    claimed: set[tuple[str, int]] = set()
    reserving = draw(st.lists(st.sampled_from(waiting_ids), max_size=2, unique=True)) if waiting_ids else []
    for job_id in reserving:
        n = draw(st.sampled_from(nodes))
        gpus = tuple(g for g in draw(st.lists(st.integers(0, max(n.gpus - 1, 0)), max_size=8, unique=True))
                     if g < n.gpus and (n.name, g) not in claimed)
        claimed.update((n.name, g) for g in gpus)
        reservations.append(Reservation(job_id, n.name, tuple(sorted(gpus))))
    quota = Quota(groups={g: draw(LIMITS) for g in ("vision", "nlp")},
                  users={u: draw(LIMITS) for u in USERS})
    return Snapshot(tuple(nodes), tuple(jobs), quota, tuple(reservations),
                    draw(st.sampled_from(sorted(POLICIES))))


def usage(snapshot: Snapshot, placements: list[tuple[int, tuple[WorkerPlacement, ...]]]) -> None:
    """Assert the placements never share a GPU nor exceed any node's GPUs, CPUs or memory."""
    nodes = {n.name: n for n in snapshot.nodes}
    owner: dict[tuple[str, int], int] = {}
    cpus: defaultdict[str, float] = defaultdict(float)
    memory: defaultdict[str, float] = defaultdict(float)
    for job_id, placement in placements:
        for w in placement:
            n = nodes[w.node]
            for g in w.gpus:
                assert 0 <= g < n.gpus, f"job {job_id} got GPU {g} of {w.node}"
                assert owner.setdefault((w.node, g), job_id) == job_id, f"GPU {w.node}:{g} given twice"
            cpus[w.node] += w.cpus
            memory[w.node] += w.memory_gb
    for name, n in nodes.items():
        assert cpus[name] <= n.cpus + 1e-6 and memory[name] <= n.memory_gb + 1e-6, f"{name} over-allocated"


def check(snapshot: Snapshot, decisions: list[Decision]) -> None:
    jobs = {j.id: j for j in snapshot.jobs}
    waiting = {j.id for j in snapshot.jobs if j.state in WAITING}
    holding = [j for j in snapshot.jobs if j.state in PLACED]
    verdicts = Counter(d.job_id for d in decisions if isinstance(d, Admit | Wait | Reject))
    assert verdicts == Counter(waiting), "every waiting job gets exactly one Admit, Wait or Reject"
    admits = [d for d in decisions if isinstance(d, Admit)]
    suspends = [d for d in decisions if isinstance(d, Suspend)]
    reserves = [d for d in decisions if isinstance(d, Reserve)]
    # Now: what runs plus what is admitted fits. Later: without the victims, plus the reserved, fits.
    usage(snapshot, [(j.id, j.placement) for j in holding] + [(d.job_id, d.placement) for d in admits])
    victims = {d.job_id for d in suspends}
    usage(snapshot, [(j.id, j.placement) for j in holding if j.id not in victims]
          + [(d.job_id, d.placement) for d in admits + reserves])
    for s in suspends:
        preemptor = jobs[s.preemptor_id]
        assert preemptor.max_schedule > 0, "low priority never causes a suspension"
        assert preemptor.total_gpus > 0, "a CPU job never suspends another job"
        victim = jobs[s.job_id]
        # a CPU job is low priority whatever its max_schedule says
        assert victim.state == "RUNNING" and (victim.max_schedule == 0 or victim.total_gpus == 0)
        assert any(r.job_id == s.preemptor_id for r in reserves)
    assert len(victims) == len(suspends), "a job is suspended for one preemptor only"
    drained = {n.name for n in snapshot.nodes if n.drained}
    for d in admits + reserves:
        assert not drained & {w.node for w in d.placement}, f"job {d.job_id} placed on a drained node"
    for v in victims:
        assert {w.node for w in jobs[v].placement} - drained, f"victim {v} frees only drained nodes"
    reserved_for = {(r.node, g): r.job_id for r in snapshot.reservations if r.job_id in waiting
                    for g in r.gpus}
    admitted_at = {d.job_id: i for i, d in enumerate(decisions) if isinstance(d, Admit)}
    for i, d in enumerate(decisions):
        if not isinstance(d, Admit):
            continue
        j = jobs[d.job_id]
        assert len(d.placement) == j.workers and d.resume == (j.state == "SUSPENDED")
        types = {next(n.gpu_type for n in snapshot.nodes if n.name == w.node) for w in d.placement}
        if j.gpus_per_worker:
            assert len(types) == 1 and j.gpu_type in (None, *types), "one GPU type, the requested one"
        for w in d.placement:
            assert len(w.gpus) == j.gpus_per_worker
            assert w.cpus == j.cpus_per_worker and w.memory_gb == j.memory_gb_per_worker
            for g in w.gpus:
                # Reserved GPUs are the reserving job's until it is admitted (on them or elsewhere).
                other = reserved_for.get((w.node, g), j.id)
                assert other == j.id or admitted_at.get(other, i) < i, "took another job's reserved GPU"
    started = [jobs[d.job_id] for d in admits + reserves]
    for key, limits in (("user", snapshot.quota.users), ("group", snapshot.quota.groups)):
        used: defaultdict[str, int] = defaultdict(int)
        for j in holding + started:
            if j.max_schedule > 0:
                used[getattr(j, key)] += j.total_gpus
        for j in started:
            limit = limits.get(getattr(j, key))
            if j.max_schedule > 0 and j.total_gpus > 0 and limit is not None:
                assert used[getattr(j, key)] <= limit, f"high job {j.id} admitted over {key} quota"
    positions = [d.position for d in decisions if isinstance(d, Wait)]
    assert positions == list(range(1, len(positions) + 1))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_plan_invariants(snapshot: Snapshot) -> None:
    before = copy.deepcopy(snapshot)
    decisions = plan(snapshot, T0)
    assert snapshot == before, "plan must not mutate its input"
    check(snapshot, decisions)
    assert plan(snapshot, T0) == decisions, "plan is deterministic"
