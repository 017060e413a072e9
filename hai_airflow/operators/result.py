"""What a hai operator makes of its job's end: the result it returns, or the error it raises."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException
from pydantic import BaseModel, ConfigDict, Field

from hai_airflow.assets import model_asset
from hai_airflow.hooks.follower import HaiJobEvent, failure_message, verdict
from hai_airflow.spec import JobState, PriorityClass
from hai_airflow.triggers.checkpoint import checkpoint_step

if TYPE_CHECKING:
    from airflow.sdk import Context

SUCCEEDED = (JobState.SUCCEEDED,)
"""What an operator's job must reach for its task to succeed."""


class HaiJobResult(BaseModel):
    """What a hai operator returns (its XCom ``return_value``), dumped to a dict."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: int = Field(description="The hai job id (`hai task`, `hai instance --task-id`).")
    state: str = Field(description="Its final state.")
    priority: PriorityClass | None = Field(default=None, description="high or low, as it ran.")
    instances: int = Field(description="How many times it was started (1 + resumes).")
    preemptions: int = Field(description="How many times it was suspended for a high-priority job.")
    latest_checkpoint: str | None = Field(description="Newest checkpoint it wrote.")
    metrics_path: str | None = Field(description="The metrics file the operator was told about.")


def job_result(event: HaiJobEvent, metrics_path: str | None, log: Any) -> HaiJobResult:
    """The result of a job that succeeded; raises with the end, its reason and log tail otherwise."""
    if event.log_tail:
        log.info(
            "last %d lines of hai job %s's log:\n%s",
            len(event.log_tail),
            event.job_id,
            "\n".join(event.log_tail),
        )
    if verdict(event, SUCCEEDED) != "reached":
        raise AirflowException(failure_message(event))
    log.info(
        "hai job %s succeeded after %d run(s) and %d preemption(s)",
        event.job_id,
        event.instances,
        event.preemptions,
    )
    return HaiJobResult(
        job_id=event.job_id,
        state=event.state or JobState.SUCCEEDED,
        priority=event.priority,
        instances=event.instances,
        preemptions=event.preemptions,
        latest_checkpoint=event.latest_checkpoint,
        metrics_path=metrics_path or None,
    )


def announce_model(model_dir: str | None, outlets: list[Any], event: HaiJobEvent, context: Context) -> None:
    """An event of the model dir's asset, when the task declares it: the newest checkpoint (or the
    dir) and its step."""
    if not model_dir:
        return
    asset = model_asset(model_dir)
    if asset not in outlets:
        return
    path = event.latest_checkpoint or model_dir
    step = checkpoint_step(event.latest_checkpoint) if event.latest_checkpoint else None
    context["outlet_events"][asset].extra = {"path": path, "step": step}
