"""Table tests of `high_priority_allowed`: submission and promotion within user and group quota."""

from __future__ import annotations

import pytest

from hai_airflow.scheduling import QuotaVerdict, high_priority_allowed
from hai_airflow.scheduling.model import Job, Quota

from .builders import T0, job

RUNNING_HIGH = job(11).high().gpus(8).by("alice").running_since(T0 - 60).on("n1").build()
WAITING_HIGH = job(12).high().gpus(4).by("bob").build()
LOW = job(13).low().gpus(8).by("alice").running_since(T0 - 60).on("n2").build()
PROMOTED = job(14).high().gpus(4).by("alice").build()


@pytest.mark.parametrize(
    ("gpus", "jobs", "quota", "exclude", "expected"),
    [
        pytest.param(
            4, [RUNNING_HIGH, LOW], Quota(users={"alice": 8}), None,
            QuotaVerdict(False, "over your high-priority quota (12/8 GPUs in group vision)", 12, 8, 12, None),
            id="refused over the personal quota; low jobs do not count",
        ),
        pytest.param(
            8, [RUNNING_HIGH, WAITING_HIGH], Quota(groups={"vision": 16}), None,
            QuotaVerdict(False, "over group vision's high-priority quota (20/16 GPUs)", 16, None, 20, 16),
            id="refused over the group quota; waiting high jobs of others in the group count",
        ),
        pytest.param(
            8, [RUNNING_HIGH], Quota(groups={"vision": 16}, users={"alice": None}), None,
            QuotaVerdict(True, "within quota (no personal limit, group vision 16/16 GPUs)", 16, None, 16, 16),
            id="no personal limit: only the group's applies, and reaching it exactly is allowed",
        ),
        pytest.param(
            800, [RUNNING_HIGH], Quota(), None,
            QuotaVerdict(True, "within quota (no personal limit, group vision unlimited)",
                         808, None, 808, None),
            id="no quota configured means unlimited",
        ),
        pytest.param(
            4, [RUNNING_HIGH, PROMOTED], Quota(users={"alice": 12}), 14,
            QuotaVerdict(True, "within quota (yours 12/12 GPUs, group vision unlimited)", 12, 12, 12, None),
            id="promotion excludes the promoted job so it is not counted twice",
        ),
        pytest.param(
            4, [RUNNING_HIGH, PROMOTED], Quota(users={"alice": 12}), None,
            QuotaVerdict(
                False, "over your high-priority quota (16/12 GPUs in group vision)", 16, 12, 16, None
            ),
            id="without exclude_job the same job would be counted twice",
        ),
        pytest.param(
            12, [RUNNING_HIGH], Quota(groups={"vision": 16}, users={"alice": 32}), None,
            QuotaVerdict(False, "over group vision's high-priority quota (20/16 GPUs)", 20, 32, 20, 16),
            id="a generous personal quota does not lift the group's",
        ),
    ],
)
def test_high_priority_allowed(
    gpus: int, jobs: list[Job], quota: Quota, exclude: int | None, expected: QuotaVerdict
) -> None:
    assert high_priority_allowed("alice", "vision", gpus, jobs, quota, exclude_job=exclude) == expected
