"""The ledger's rules on hand-made histories: each finds what it must, and nothing in a sound one."""

from __future__ import annotations

from hai_airflow.scheduling.model import Quota
from hai_airflow.server.control import ledger
from hai_airflow.server.control.ledger import Event, JobRecord, Run
from hai_airflow.spec import JobState

P, S, R, D = JobState.PENDING, JobState.STARTING, JobState.RUNNING, JobState.SUCCEEDED
SOUND = (Event(1, "submitted", None, P), Event(2, "admitted", P, S), Event(3, "started", S, R),
         Event(9, "exited", R, D))  # fmt: skip


def job(id: int, runs: tuple[Run, ...] = (), events: tuple[Event, ...] = SOUND, state: JobState = D,
        user: str = "alice", group: str = "vision", high_from: float | None = None) -> JobRecord:  # fmt: skip
    return JobRecord(id, state, user, group, high_from, events, runs)


def run(job_id: int, instance_id: int, start: float, end: float | None, *gpus: int, node: str = "n1") -> Run:
    return Run(job_id, instance_id, start, end, tuple((node, g) for g in gpus))


NODES = {"n1": 4}
NO_QUOTA = Quota(groups={}, users={})


def whats(found: list[ledger.Problem]) -> list[str]:
    return [p.what for p in found]


def test_a_sound_history_has_no_problem() -> None:
    jobs = [job(1, (run(1, 1, 2, 9, 0, 1),)), job(2, (run(2, 2, 9, 12, 0, 1),), high_from=0)]
    assert ledger.problems(jobs, NODES, Quota(groups={"vision": 2}, users={"alice": 2})) == []


def test_a_move_from_elsewhere_an_illegal_move_and_a_state_its_events_do_not_lead_to_are_found() -> None:
    skipped = (Event(1, "submitted", None, P), Event(3, "started", S, R), Event(9, "exited", R, D))
    assert whats(ledger.history_problems(job(1, events=skipped))) == [
        "event started moves from STARTING, but the job was PENDING"
    ]
    illegal = (*SOUND[:3], Event(9, "requeued", R, P))
    assert "event requeued: RUNNING -> PENDING is not a legal move" in whats(
        ledger.history_problems(job(1, events=illegal, state=P))
    )
    assert whats(ledger.history_problems(job(1, state=R))) == [
        "the job is RUNNING, but its events lead to SUCCEEDED"
    ]
    backwards = (*SOUND[:3], Event(2.5, "exited", R, D))
    assert whats(ledger.history_problems(job(1, events=backwards))) == [
        "event exited at 2.500 is older than the one before it"
    ]


def test_two_runs_of_a_job_at_once_and_a_run_left_open_are_found() -> None:
    assert whats(ledger.run_problems(job(1, (run(1, 1, 0, 5), run(1, 2, 4, 8))))) == [
        "instances 1 and 2 overlap"
    ]
    assert (
        ledger.run_problems(job(1, (run(1, 1, 0, 5), run(1, 2, 5, 8)))) == []
    )  # released as the next claims
    assert whats(ledger.run_problems(job(1, (run(1, 1, 0, None),)))) == ["instance 1 never ended"]


def test_a_gpu_held_twice_or_beyond_its_node_is_found() -> None:
    twice = [job(1, (run(1, 1, 0, 10, 0, 1),)), job(2, (run(2, 2, 5, 8, 1, 2),))]
    assert whats(ledger.capacity_problems(twice, NODES)) == [
        "instance 2 took GPU 1 of n1 while instance 1 held it"
    ]
    handed_over = [job(1, (run(1, 1, 0, 5, 0, 1),)), job(2, (run(2, 2, 5, 8, 0, 1),))]
    assert ledger.capacity_problems(handed_over, NODES) == []
    beyond = [job(1, (run(1, 1, 0, 5, 4),))]
    assert whats(ledger.capacity_problems(beyond, NODES)) == ["instance 1 held GPU 4 of n1, which has 4"]


def test_high_gpus_over_a_quota_at_any_moment_are_found_low_ones_never() -> None:
    quota = Quota(groups={"vision": 3}, users={})
    together = [job(1, (run(1, 1, 0, 10, 0, 1),), high_from=0), job(2, (run(2, 2, 5, 8, 2, 3),), high_from=0)]
    assert whats(ledger.quota_problems(together, quota)) == [
        "instance 2 at 5.000: over group vision's high-priority quota (4/3 GPUs)"
    ]
    one_after_the_other = [
        job(1, (run(1, 1, 0, 5, 0, 1),), high_from=0),
        job(2, (run(2, 2, 5, 8, 2, 3),), high_from=0),
    ]
    assert ledger.quota_problems(one_after_the_other, quota) == []
    low = [job(1, (run(1, 1, 0, 10, 0, 1),), high_from=0), job(2, (run(2, 2, 5, 8, 2, 3),))]
    assert ledger.quota_problems(low, quota) == []
    promoted_later = [
        job(1, (run(1, 1, 0, 10, 0, 1),), high_from=0),
        job(2, (run(2, 2, 5, 8, 2, 3),), high_from=6),
    ]
    assert ledger.quota_problems(promoted_later, quota) == []


def test_when_a_job_became_high() -> None:
    assert ledger.high_from(1.0, True, []) == 1.0
    assert ledger.high_from(1.0, False, []) is None
    assert ledger.high_from(1.0, True, [(5.0, "promoted", "max_schedule 0 -> 8 (high priority)")]) == 5.0
    assert ledger.high_from(1.0, True, [(5.0, "promoted", "max_schedule 4 -> 8 (high priority)")]) == 1.0
