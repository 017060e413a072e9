"""The hai job follower: follow a job until it reaches a state, and what the end means.

The operators' blocking wait (:class:`JobFollower`, in a worker) and :class:`HaiJobTrigger`'s wait
(:class:`AsyncJobFollower`, in the triggerer) are this one follower, as Airflow's pod operator and
its trigger share one ``PodManager``. The decisions are pure functions here: which states end the
wait (:func:`look`), which status an end has (:func:`event_status`), what it means to a task
(:func:`verdict`) and the words a task log and a failure carry; the two followers differ only in
their I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hai_airflow.client import AsyncHaiClient, HaiError
from hai_airflow.hooks.hai import HaiAsyncHook, HaiHook
from hai_airflow.hooks.retry import aretry_transient, retry_transient
from hai_airflow.spec import TERMINAL_STATES, ForecastView, JobState, JobView, PriorityClass

LOG_TAIL_ATTEMPTS = 4
"""Tries to read the log tail for an event while the server is briefly away; then no tail."""
FORECAST_MOVE_SECONDS = 300.0
"""A waiting job's forecast start is logged again when it moved by this much, or its source changed."""
WAITING_FOR_GPUS: frozenset[JobState] = frozenset({JobState.PENDING, JobState.SUSPENDED})
"""States in which the follower logs the job's forecast start when it is news."""
SUSPENSION: frozenset[JobState] = frozenset({JobState.SUSPENDING, JobState.SUSPENDED})
"""States the task waits through: the job resumes when GPUs free up."""
JobEventStatus = Literal["success", "failed", "cancelled", "timeout", "reached", "error"]
_ENDED_STATUS: dict[str, JobEventStatus] = {
    JobState.SUCCEEDED: "success",
    JobState.FAILED: "failed",
    JobState.CANCELLED: "cancelled",
    JobState.TIMEOUT: "timeout",
}
Verdict = Literal["reached", "waiting", "failed"]


class HaiJobEvent(BaseModel):
    """What following a job ends with: :class:`HaiJobTrigger`'s event (dumped to a dict), and what
    the operators and sensors read back."""

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

    @classmethod
    def lost(cls, job_id: int, message: str) -> HaiJobEvent:
        """The follower could not follow the job (it is gone, or the server refused to tell)."""
        return cls(status="error", job_id=job_id, message=message)


# ---- the decisions ---------------------------------------------------------------------------------


def is_done(state: str, target_states: Iterable[str]) -> bool:
    """Following a job ends at a requested state or at any final one."""
    return state in TERMINAL_STATES or state in set(target_states)


def event_status(state: str, target_states: Iterable[str]) -> JobEventStatus:
    """A final state names its own status; any other requested state is `reached`."""
    if state in _ENDED_STATUS:
        return _ENDED_STATUS[state]
    if state in set(target_states):
        return "reached"
    raise ValueError(f"state {state} is neither final nor one of {sorted(target_states)}")


def verdict(event: HaiJobEvent, target_states: Iterable[str]) -> Verdict:
    """What an event means to a task waiting for `target_states` (an operator: SUCCEEDED):

    1. the job is in a target state: ``reached``, the task succeeds;
    2. it was lost, or ended in another state: ``failed``, the task raises :func:`failure_message`;
    3. otherwise (running, suspended): ``waiting``.
    """
    if event.state is not None and event.state in set(target_states):
        return "reached"
    if event.status == "error" or event.state in TERMINAL_STATES:
        return "failed"
    return "waiting"


def failure_message(event: HaiJobEvent) -> str:
    """The error a task raises: what ended how, the server's reason, the last log lines."""
    if event.status == "error":
        return f"lost track of hai job {event.job_id}: {event.message}"
    text = f"hai job {event.job_id} ended {event.state}"
    if event.reason:
        text += f": {event.reason}"
    if event.log_tail:
        text += "\nlast log lines:\n" + "\n".join(event.log_tail)
    return text


def describe_transition(job: JobView, previous: str | None) -> str:
    """One log line for a state change, in words that tell a DAG author what happens next."""
    text = f"hai job {job.id}: {previous} -> {job.state}" if previous else f"hai job {job.id} is {job.state}"
    if job.reason:
        text += f" ({job.reason})"
    if job.state in SUSPENSION:
        text += "; the task keeps waiting for it to resume and end"
    return text


@dataclass(frozen=True)
class Look:
    """What one answer of the long-poll means to the follower."""

    line: str | None
    """The state change to log; None when the state is the one already seen."""
    done: bool
    """The wait ends: the job is in a target state, or it ended."""
    ask_forecast: bool
    """The job waits for GPUs: log its expected start when that is news."""


def look(job: JobView, previous: str | None, target_states: Iterable[str]) -> Look:
    """What the follower does with `job`, last seen in state `previous` (None: not seen yet)."""
    done = is_done(job.state, target_states)
    return Look(
        line=describe_transition(job, previous) if job.state != previous else None,
        done=done,
        ask_forecast=not done and job.state in WAITING_FOR_GPUS,
    )


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


# ---- the two followers: the same steps, blocking or awaited ----------------------------------------


@dataclass(kw_only=True)
class _Following:
    """One job to follow and how; what both followers keep."""

    job_id: int
    log: Any
    target_states: tuple[str, ...] = ()
    poll_timeout: float = 30.0
    log_tail_lines: int = 20
    max_backoff: float = 30.0
    state: str | None = field(default=None, init=False)
    """The state last seen (None: not seen yet)."""
    said: Said | None = field(default=None, init=False)
    """The forecast last logged."""

    def _since(self) -> dict[str, Any]:
        """The long-poll's arguments: answer when the job leaves the state last seen, or in a while."""
        return {"job_id": self.job_id, "since_state": self.state, "timeout": self.poll_timeout}

    def _retrying(self, what: str, attempts: int | None = None) -> dict[str, Any]:
        """How a call is retried while the server is briefly away, and what it is for the log."""
        return {
            "what": f"{what} hai job {self.job_id}",
            "log": self.log,
            "max_backoff": self.max_backoff,
            "attempts": attempts,
        }

    def _seen(self, job: JobView) -> Look:
        """Take in one answer of the long-poll: log the change, remember the state."""
        seen = look(job, self.state, self.target_states)
        if seen.line is not None:
            self.log.info(seen.line)
        self.state = job.state
        return seen

    def _forecast_read(self, forecast: ForecastView | None) -> None:
        news = describe_forecast(self.job_id, forecast, self.said)
        if news is not None:
            self.log.info(news[0])
            self.said = news[1]

    def _no_forecast(self, error: HaiError) -> None:
        """A forecast that cannot be read is only missed: the wait goes on."""
        self.log.debug("no forecast for hai job %s: %s", self.job_id, error.message)

    def _no_log(self, error: HaiError) -> list[str]:
        self.log.warning("could not read the log of hai job %s: %s", self.job_id, error.message)
        return []


@dataclass(kw_only=True)
class JobFollower(_Following):
    """Follows a job in this process with the server's long-poll, for an operator that does not defer.

    :param hook: the hook whose client asks the server.
    """

    hook: HaiHook

    def follow(self, first: JobView | None = None) -> HaiJobEvent:
        """Wait until the job is done (:func:`look`); `first` is the job as already read, if it was."""
        client = self.hook.get_conn()
        job = first
        while True:
            try:
                wait = partial(client.wait, **self._since())
                job = job or retry_transient(wait, **self._retrying("following"))
            except HaiError as e:
                return HaiJobEvent.lost(self.job_id, e.message)
            seen = self._seen(job)
            if seen.done:
                return HaiJobEvent.from_job(job, self.target_states, self._log_tail())
            if seen.ask_forecast:
                try:
                    self._forecast_read(client.job(self.job_id).forecast)
                except HaiError as e:
                    self._no_forecast(e)
            job = None

    def _log_tail(self) -> list[str]:
        read = partial(self.hook.log_tail, self.job_id, self.log_tail_lines)
        try:
            return retry_transient(read, **self._retrying("reading the log of", LOG_TAIL_ATTEMPTS))
        except HaiError as e:
            return self._no_log(e)


@dataclass(kw_only=True)
class AsyncJobFollower(_Following):
    """Follows a job with the server's long-poll in an event loop, for :class:`HaiJobTrigger`.

    :param hook: the async hook that reads the log tail.
    :param client: its open client (the caller closes it).
    """

    hook: HaiAsyncHook
    client: AsyncHaiClient

    async def follow(self) -> HaiJobEvent:
        """Wait until the job is done (:func:`look`)."""
        while True:
            try:
                wait = partial(self.client.wait, **self._since())
                job = await aretry_transient(wait, **self._retrying("following"))
            except HaiError as e:
                return HaiJobEvent.lost(self.job_id, e.message)
            seen = self._seen(job)
            if seen.done:
                return HaiJobEvent.from_job(job, self.target_states, await self._log_tail())
            if seen.ask_forecast:
                try:
                    self._forecast_read((await self.client.job(self.job_id)).forecast)
                except HaiError as e:
                    self._no_forecast(e)

    async def _log_tail(self) -> list[str]:
        read = partial(self.hook.log_tail, self.client, self.job_id, self.log_tail_lines)
        try:
            return await aretry_transient(read, **self._retrying("reading the log of", LOG_TAIL_ATTEMPTS))
        except HaiError as e:
            return self._no_log(e)
