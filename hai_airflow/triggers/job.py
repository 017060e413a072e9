"""HaiJobTrigger: follows a hai job with the server's long-poll until it reaches a target state.

The following itself, and what its end means, is :mod:`hai_airflow.hooks.follower`, shared with the
operators' blocking wait; its event is :class:`~hai_airflow.hooks.follower.HaiJobEvent`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from hai_airflow.hooks.follower import AsyncJobFollower
from hai_airflow.hooks.hai import DEFAULT_CONN_ID, HaiAsyncHook
from hai_airflow.triggers.serialized import serialized


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
            follower = AsyncJobFollower(
                job_id=self.job_id,
                log=self.log,
                target_states=tuple(self.target_states),
                poll_timeout=self.poll_timeout,
                log_tail_lines=self.log_tail_lines,
                max_backoff=self.max_backoff,
                hook=hook,
                client=client,
            )
            event = await follower.follow()
        yield TriggerEvent(event.model_dump(mode="json"))

    async def on_kill(self) -> None:
        """The user killed the deferred task: cancel the job unless `cancel_on_kill` is off."""
        if not self.cancel_on_kill:
            return
        hook = HaiAsyncHook(self.hai_conn_id, on_behalf_of=self.on_behalf_of)
        async with await hook.get_conn() as client:
            job = await client.cancel(self.job_id)
        self.log.info("cancelled hai job %s (now %s) because the task was killed", job.id, job.state)
