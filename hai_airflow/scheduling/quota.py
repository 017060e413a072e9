"""The high-priority quota rule: may a job be (or become) high priority now?"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hai_airflow.scheduling.model import Job, Quota


@dataclass(frozen=True, slots=True)
class QuotaVerdict:
    """Outcome of the quota check; `*_used` include the job being judged, limits None = unlimited."""

    allowed: bool
    reason: str
    user_used: int
    user_limit: int | None
    group_used: int
    group_limit: int | None


def count_high(per_user: dict[str, int], per_group: dict[str, int], job: Job, sign: int = 1) -> None:
    """Add (sign -1: take away) the job's GPUs to its user's and group's usage if it is high priority."""
    if job.high:
        per_user[job.user] = per_user.get(job.user, 0) + sign * job.total_gpus
        per_group[job.group] = per_group.get(job.group, 0) + sign * job.total_gpus


def high_gpus(jobs: Iterable[Job]) -> tuple[dict[str, int], dict[str, int]]:
    """Usage counts the GPUs of high-priority jobs, per user and per group."""
    per_user: dict[str, int] = {}
    per_group: dict[str, int] = {}
    for job in jobs:
        count_high(per_user, per_group, job)
    return per_user, per_group


def over_quota(user: str, group: str, gpus: int, user_used: int, group_used: int, quota: Quota) -> str | None:
    """High priority is allowed while usage plus `gpus` stays within the user's and the group's limit;
    says which limit it would break, else None."""
    user_limit = quota.users.get(user)
    if user_limit is not None and user_used + gpus > user_limit:
        return f"over your high-priority quota ({user_used + gpus}/{user_limit} GPUs in group {group})"
    group_limit = quota.groups.get(group)
    if group_limit is not None and group_used + gpus > group_limit:
        return f"over group {group}'s high-priority quota ({group_used + gpus}/{group_limit} GPUs)"
    return None


def headroom(user: str, group: str, user_used: int, group_used: int, quota: Quota) -> int | None:
    """High-priority GPUs the user may still take within both limits; None when neither limits them."""
    rooms = [limit - used for limit, used in ((quota.users.get(user), user_used),
                                              (quota.groups.get(group), group_used)) if limit is not None]
    return max(0, min(rooms)) if rooms else None


def judge(user: str, group: str, gpus: int, user_used: int, group_used: int, quota: Quota) -> QuotaVerdict:
    """The quota rule (`over_quota`) with the usage and limits it was judged on."""
    user_limit = quota.users.get(user)
    group_limit = quota.groups.get(group)
    user_total, group_total = user_used + gpus, group_used + gpus
    over = over_quota(user, group, gpus, user_used, group_used, quota)
    if over is not None:
        return QuotaVerdict(False, over, user_total, user_limit, group_total, group_limit)
    yours = f"yours {user_total}/{user_limit} GPUs" if user_limit is not None else "no personal limit"
    theirs = f"group {group} {group_total}/{group_limit} GPUs" if group_limit is not None else (
        f"group {group} unlimited")
    return QuotaVerdict(True, f"within quota ({yours}, {theirs})", user_total, user_limit,
                        group_total, group_limit)


def high_priority_allowed(
    user: str,
    group: str,
    gpus: int,
    jobs: Iterable[Job],
    quota: Quota,
    exclude_job: int | None = None,
) -> QuotaVerdict:
    """May a job of `gpus` GPUs be high priority, given every unfinished job in `jobs`?

    :param jobs: every unfinished job (waiting and placed); only high-priority ones count.
    :param exclude_job: the job being promoted or re-checked, so it is not counted twice.
    """
    per_user, per_group = high_gpus(j for j in jobs if j.id != exclude_job)
    return judge(user, group, gpus, per_user.get(user, 0), per_group.get(group, 0), quota)
