"""HaiJobSensor: waits until a hai job (submitted anywhere) reaches a state."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException

from hai_airflow.hooks.acting import act_for_run
from hai_airflow.hooks.follower import HaiJobEvent, failure_message, is_done, verdict
from hai_airflow.hooks.hai import DEFAULT_CONN_ID, HaiHook
from hai_airflow.operators.job import default_deferrable
from hai_airflow.spec import TERMINAL_STATES, JobState
from hai_airflow.triggers.job import HaiJobTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context


class HaiJobSensor(BaseSensorOperator):
    """Succeeds when the job reaches one of `target_states`; fails if it ends in another state.

    It never cancels the job it watches.

    :param job_id: the hai job (``hai task`` lists them); templated.
    :param target_states: states that count, e.g. ``["RUNNING"]``; default ``["SUCCEEDED"]``.
    :param hai_conn_id: the Airflow connection to the hai server.
    :param deferrable: wait in the triggerer with the server's long-poll (default) instead of poking.
    :param poll_timeout: seconds one long-poll may wait on the server (deferred mode).
    :param hai_user: whose job it is, for a run nobody triggered (as on the operators); templated.
        The sensor acts for the person behind the run, so a service identity's connection sees
        exactly that user's jobs.
    """

    template_fields: Sequence[str] = ("job_id", "hai_user")
    ui_color = "#e8f4ff"

    def __init__(
        self,
        *,
        job_id: int | str,
        target_states: Iterable[JobState] = (JobState.SUCCEEDED,),
        hai_conn_id: str = DEFAULT_CONN_ID,
        deferrable: bool | None = None,
        poll_timeout: float = 30.0,
        hai_user: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job_id = job_id
        self.hai_user = hai_user
        self._on_behalf_of: str | None = None
        self.target_states = sorted(set(target_states))
        self.hai_conn_id = hai_conn_id
        self.deferrable = default_deferrable() if deferrable is None else deferrable
        self.poll_timeout = poll_timeout

    def _decide(self, event: HaiJobEvent) -> dict[str, Any] | None:
        """The result when the job is in a target state, None while it is not, raise when it ended."""
        outcome = verdict(event, self.target_states)
        if outcome == "failed":
            raise AirflowException(failure_message(event))
        if outcome == "waiting":
            return None
        return event.model_dump(mode="json", exclude={"log_tail", "message"})

    def poke(self, context: Context) -> bool | PokeReturnValue:
        hook = HaiHook(self.hai_conn_id)
        try:
            # The job is the person's: a service identity sees it only when acting for them.
            acting = act_for_run(hook, context, hai_user=self.hai_user, owner=self.owner, log=self.log)
            self._on_behalf_of = acting.on_behalf_of
            job = hook.get_conn().job(int(self.job_id))
            tail = hook.log_tail(job.id, 20) if job.state in TERMINAL_STATES else []
        finally:
            hook.close()
        self.log.info("hai job %s is %s%s", job.id, job.state, f" ({job.reason})" if job.reason else "")
        if not is_done(job.state, self.target_states):
            return False
        result = self._decide(HaiJobEvent.from_job(job, self.target_states, tail))
        return PokeReturnValue(is_done=True, xcom_value=result)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        first = self.poke(context)
        if isinstance(first, PokeReturnValue) and first.is_done:
            return first.xcom_value
        self.defer(
            trigger=HaiJobTrigger(
                int(self.job_id),
                self.hai_conn_id,
                target_states=self.target_states,
                poll_timeout=self.poll_timeout,
                cancel_on_kill=False,
                on_behalf_of=self._on_behalf_of,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout) if self.timeout else None,
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        result = self._decide(HaiJobEvent.model_validate(event))
        if result is None:
            raise AirflowException(f"hai job {self.job_id}: the trigger fired before a target state")
        return result
