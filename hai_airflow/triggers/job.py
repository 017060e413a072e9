"""HaiJobTrigger: follows a hai job with the server's long-poll until it reaches a target state."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime
from functools import partial
from typing import Any, Literal

from airflow.triggers.base import BaseTrigger, TriggerEvent
from pydantic import BaseModel, ConfigDict, Field

from hai_airflow.client import AsyncHaiClient, HaiError
from hai_airflow.hooks.hai import DEFAULT_CONN_ID, HaiAsyncHook
from hai_airflow.hooks.retry import aretry_transient
from hai_airflow.spec import TERMINAL_STATES, ForecastView, JobState, JobView, PriorityClass
from hai_airflow.triggers.serialized import serialized

LOG_TAIL_ATTEMPTS = 4
FORECAST_MOVE_SECONDS = 300.0
"""A waiting job's forecast start is logged again when it moved by this much, or its source changed."""
JobEventStatus = Literal["success", "failed", "cancelled", "timeout", "reached", "error"]


class HaiJobEvent(BaseModel):
    """What :class:`HaiJobTrigger` emits (dumped to a dict) and operators and sensors read back."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: JobEventStatus = Field(
        description="success/failed/cancelled/timeout: the job ended so; reached: it is in a requested "
        "non-final state; error: the trigger could not follow it (see message)."
    )
    job_id: int = Field(description="The hai job id.")
    state: JobState | None = Field(default=None, description="The job's state when the event fired.")
    reason: str | None = Field(default=None, description="The server's reason for that state.")
    priority: PriorityClass | None = Field(default=None, description="high or low, as the job runs.")
    instances: int = Field(default=0, description="How many times the job was started.")
    preemptions: int = Field(default=0, description="How many times it was suspended for others.")
    latest_checkpoint: str | None = Field(default=None, description="Newest checkpoint the server saw.")
    log_tail: tuple[str, ...] = Field(default=(), description="Last lines of the newest instance's log.")
    message: str = Field(default="", description="Why the trigger gave up (status error).")

    @classmethod
    def from_job(
        cls, job: JobView, target_states: Iterable[str], log_tail: Iterable[str] = ()
    ) -> HaiJobEvent:
        return cls(
            status=event_status(job.state, target_states),
            job_id=job.id,
            state=job.state,
            reason=job.reason,
            priority=job.priority,
            instances=job.instances,
            preemptions=job.preemptions,
            latest_checkpoint=job.latest_checkpoint,
            log_tail=tuple(log_tail),
        )


def event_status(state: str, target_states: Iterable[str]) -> JobEventStatus:
    """A final state names its own status; any other requested state is `reached`."""
    if state == JobState.SUCCEEDED:
        return "success"
    if state == JobState.FAILED:
        return "failed"
    if state == JobState.CANCELLED:
        return "cancelled"
    if state == JobState.TIMEOUT:
        return "timeout"
    if state in set(target_states):
        return "reached"
    raise ValueError(f"state {state} is neither final nor one of {sorted(target_states)}")


def is_done(state: str, target_states: Iterable[str]) -> bool:
    """Following a job ends at a requested state or at any final one."""
    return state in TERMINAL_STATES or state in set(target_states)


def describe_transition(job: JobView, previous: str | None) -> str:
    """One log line for a state change, in words that tell a DAG author what happens next."""
    text = f"hai job {job.id}: {previous} -> {job.state}" if previous else f"hai job {job.id} is {job.state}"
    if job.reason:
        text += f" ({job.reason})"
    if job.state in (JobState.SUSPENDING, JobState.SUSPENDED):
        text += "; the task keeps waiting for it to resume and end"
    return text


Said = tuple[float | None, str | None]
"""The forecast last logged: its start (epoch seconds) and source."""


def describe_forecast(
    job_id: int, forecast: ForecastView | None, said: Said | None
) -> tuple[str, Said] | None:
    """A log line for a waiting job's forecast start, when there is one and it is news against `said`
    (first, moved by FORECAST_MOVE_SECONDS, or from another source); with what to remember."""
    if forecast is None:
        return None
    start = forecast.start_at.timestamp() if forecast.start_at is not None else None
    now: Said = (start, forecast.source)
    if said is not None and said[1] == now[1]:
        if start is None and said[0] is None:
            return None
        if start is not None and said[0] is not None and abs(start - said[0]) < FORECAST_MOVE_SECONDS:
            return None
    if forecast.start_at is None:
        ahead = f" (the forecast looked ahead to {_utc(forecast.horizon)})" if forecast.horizon else ""
        return f"hai job {job_id}: no start expected yet from the jobs running and queued now{ahead}", now
    at = _utc(forecast.start_at)
    source = f", estimated from {forecast.source}" if forecast.source and forecast.source != "now" else ""
    return f"hai job {job_id}: expected to start around {at}{source}", now


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


class HaiJobTrigger(BaseTrigger):
    """Waits, without tight polling, until a hai job reaches one of `target_states` or ends.

    It long-polls ``GET /jobs/{id}/wait``, so it wakes on every state change and otherwise asks
    once per `poll_timeout`. A suspension and the later resume are logged and waited through.
    When the server cannot be reached (restart, network) it reconnects with a growing delay.

    :param job_id: the hai job to follow.
    :param hai_conn_id: the Airflow connection to the hai server.
    :param target_states: states that end the wait besides the final ones (e.g. ``["RUNNING"]``).
    :param poll_timeout: seconds one long-poll may wait on the server.
    :param log_tail_lines: how many of the newest instance's last log lines the event carries.
    :param cancel_on_kill: cancel the job when a user marks the deferred task failed or clears it.
    :param max_backoff: longest delay in seconds between reconnect attempts.
    :param on_behalf_of: the hai user the operator acted for (kept in the serialized trigger, so a
        resumed wait acts for the same person).
    """

    def __init__(
        self,
        job_id: int,
        hai_conn_id: str = DEFAULT_CONN_ID,
        target_states: Iterable[str] = (),
        poll_timeout: float = 30.0,
        log_tail_lines: int = 20,
        cancel_on_kill: bool = True,
        max_backoff: float = 30.0,
        on_behalf_of: str | None = None,
    ) -> None:
        super().__init__()
        self.job_id = int(job_id)
        self.hai_conn_id = hai_conn_id
        self.target_states = sorted(set(target_states))
        self.poll_timeout = poll_timeout
        self.log_tail_lines = log_tail_lines
        self.cancel_on_kill = cancel_on_kill
        self.max_backoff = max_backoff
        self.on_behalf_of = on_behalf_of

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return serialized(self)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = HaiAsyncHook(self.hai_conn_id, on_behalf_of=self.on_behalf_of)
        async with await hook.get_conn() as client:
            event = await self._follow(client, hook)
        yield TriggerEvent(event.model_dump(mode="json"))

    async def _follow(self, client: AsyncHaiClient, hook: HaiAsyncHook) -> HaiJobEvent:
        state: str | None = None
        said: Said | None = None
        while True:
            try:
                job = await aretry_transient(
                    partial(client.wait, self.job_id, since_state=state, timeout=self.poll_timeout),
                    what=f"following hai job {self.job_id}",
                    log=self.log,
                    max_backoff=self.max_backoff,
                )
            except HaiError as e:
                return HaiJobEvent(status="error", job_id=self.job_id, message=e.message)
            if job.state != state:
                self.log.info(describe_transition(job, state))
                state = job.state
            if is_done(job.state, self.target_states):
                return HaiJobEvent.from_job(job, self.target_states, await self._log_tail(client, hook))
            if job.state in (JobState.PENDING, JobState.SUSPENDED):
                said = await self._say_forecast(client, said)

    async def _say_forecast(self, client: AsyncHaiClient, said: Said | None) -> Said | None:
        """Log the waiting job's forecast start when it is news; a forecast that cannot be read is
        only missed (the wait goes on)."""
        try:
            detail = await client.job(self.job_id)
        except HaiError as e:
            self.log.debug("no forecast for hai job %s: %s", self.job_id, e.message)
            return said
        news = describe_forecast(self.job_id, detail.forecast, said)
        if news is None:
            return said
        self.log.info(news[0])
        return news[1]

    async def _log_tail(self, client: AsyncHaiClient, hook: HaiAsyncHook) -> list[str]:
        """The log tail for the event; a few retries when the server is briefly away, then none."""
        try:
            return await aretry_transient(
                lambda: hook.log_tail(client, self.job_id, self.log_tail_lines),
                what=f"reading the log of hai job {self.job_id}",
                log=self.log,
                max_backoff=self.max_backoff,
                attempts=LOG_TAIL_ATTEMPTS,
            )
        except HaiError as e:
            self.log.warning("could not read the log of hai job %s: %s", self.job_id, e.message)
            return []

    async def on_kill(self) -> None:
        """The user killed the deferred task: cancel the job unless `cancel_on_kill` is off."""
        if not self.cancel_on_kill:
            return
        hook = HaiAsyncHook(self.hai_conn_id, on_behalf_of=self.on_behalf_of)
        async with await hook.get_conn() as client:
            job = await client.cancel(self.job_id)
        self.log.info("cancelled hai job %s (now %s) because the task was killed", job.id, job.state)
