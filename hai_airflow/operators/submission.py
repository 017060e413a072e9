"""Submitting a task's job: re-attach to the one an earlier try left, keep within the quota, submit."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count
from typing import Any, Literal

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from hai_airflow.client import HaiClient, HaiError
from hai_airflow.spec import JobSpec, JobState, JobView

OverQuota = Literal["wait", "fail", "downgrade"]
OVER_QUOTA_CHOICES: tuple[str, ...] = ("wait", "fail", "downgrade")
RETRYABLE_END_STATES = frozenset({JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT})
"""A job that ended so is not re-attached to: the Airflow retry submits a new one."""


def client_key(dag_id: str, task_id: str, run_id: str, map_index: int, attempt: int = 1) -> str:
    """The submit idempotency key of one Airflow task instance (and the `attempt`-th job it ran)."""
    key = f"airflow:{dag_id}:{task_id}:{run_id}:{map_index}"
    if len(key) > 200:
        key = "airflow:" + hashlib.sha256(key.encode()).hexdigest()
    return key if attempt == 1 else f"{key}#{attempt}"


def is_quota_refusal(error: HaiError) -> bool:
    """The server refused a high-priority submit because the quota does not cover it."""
    return error.status == 409 and error.field == "max_schedule"


@dataclass(frozen=True, kw_only=True)
class Submission:
    """How one task instance submits its job.

    :param client: the hai client, acting for the run's person.
    :param on_over_quota: ``wait``, ``fail`` or ``downgrade`` (see the operator).
    :param wait_for_quota: returns once the quota covers that many GPUs (or defers the task).
    :param log: the task's logger.
    """

    client: HaiClient
    on_over_quota: OverQuota
    wait_for_quota: Callable[[int], None]
    log: Any

    def earlier_job(self, ti: Any) -> tuple[JobView | None, str]:
        """The job an earlier try of this task instance left alive (or succeeded), and the key to use."""
        map_index = getattr(ti, "map_index", -1)
        for attempt in count(1):
            key = client_key(
                ti.dag_id, ti.task_id, ti.run_id, -1 if map_index is None else map_index, attempt
            )
            job = self.client.job_by_key(key)
            if job is None:
                return None, key
            if job.state not in RETRYABLE_END_STATES:
                self.log.info(
                    "re-attaching to hai job %s (%s), submitted by an earlier try", job.id, job.state
                )
                return job, key
        raise AssertionError("unreachable")

    def submit(self, spec: JobSpec, key: str, gpus: int) -> JobView:
        """Submit `spec` within the quota (`on_over_quota` applied); a refusal fails the task."""
        spec = self._within_quota(spec, gpus)
        try:
            job = self.client.submit(spec, client_key=key)
        except HaiError as e:
            if is_quota_refusal(e) and spec.priority == "high":
                # the quota was taken between the check and the submit: apply on_over_quota again
                job = self.client.submit(self._over_quota(spec, gpus, e.error), client_key=key)
            elif 400 <= e.status < 500:
                raise AirflowFailException(f"hai refused the job: {e.message}") from None
            else:
                raise AirflowException(f"hai refused the job: {e.message}") from None
        self.log.info(
            "submitted hai job %s (%s, %s priority, %s GPUs); follow it with `hai task` or "
            "`hai instance --task-id %s`",
            job.id,
            job.task_name,
            job.priority,
            job.gpus,
            job.id,
        )
        return job

    def _within_quota(self, spec: JobSpec, gpus: int) -> JobSpec:
        """The spec to submit: as given when it is low priority or the quota covers it."""
        if spec.priority == "low" or gpus == 0:
            return spec
        check = self.client.check_high_priority(gpus)
        if check.get("allowed"):
            return spec
        return self._over_quota(spec, gpus, str(check.get("reason") or "over quota"))

    def _over_quota(self, spec: JobSpec, gpus: int, reason: str) -> JobSpec:
        """Apply `on_over_quota`: raise, submit as low priority, or wait (deferred or here)."""
        if self.on_over_quota == "fail":
            raise AirflowException(
                f"high-priority quota does not cover {gpus} GPUs: {reason}. Use on_over_quota='wait' or "
                "'downgrade', or ask your group admin to raise the quota"
            )
        if self.on_over_quota == "downgrade":
            self.log.warning(
                "high-priority quota does not cover %s GPUs (%s): submitting as low priority", gpus, reason
            )
            return spec.model_copy(update={"max_schedule": 0})
        self.log.info("waiting for high-priority quota for %s GPUs: %s", gpus, reason)
        self.wait_for_quota(gpus)
        return spec
