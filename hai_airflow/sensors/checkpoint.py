"""HaiCheckpointSensor: waits for a checkpoint newer than a time or a step, of a job or in a path."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowSkipException

from hai_airflow.hooks.hai import DEFAULT_CONN_ID, HaiHook
from hai_airflow.operators.job import default_deferrable
from hai_airflow.spec import TERMINAL_STATES
from hai_airflow.triggers.checkpoint import (
    DEFAULT_PATTERN,
    HaiCheckpointEvent,
    HaiCheckpointTrigger,
    is_newer,
    job_checkpoint,
    newest_in_path,
    parse_time,
)

if TYPE_CHECKING:
    from airflow.sdk import Context


def optional_int(value: Any) -> int | None:
    """A rendered template's number: '' and 'None' (an empty XCom) mean no value."""
    if value is None or (isinstance(value, str) and value.strip() in ("", "None")):
        return None
    return int(value)


class HaiCheckpointSensor(BaseSensorOperator):
    """Succeeds when there is a checkpoint newer than `newer_than` and past `after_step`.

    Watches the checkpoints the server records for `job_id`, or the files at `path` (a
    checkpoint file or a directory on storage this machine mounts), or the files at `path`
    while `job_id` runs. Returns ``{"checkpoint", "step", "saved_at", "job_id", "job_state"}``.
    To act on every new checkpoint instead of waiting for one, schedule a DAG on
    :func:`hai_airflow.assets.watched_model_asset`.

    :param job_id: the hai job whose checkpoints count; templated.
    :param path: a checkpoint file or directory; templated.
    :param pattern: file-name glob of checkpoints in a directory `path`.
    :param newer_than: the checkpoint must be written after this time (datetime or ISO 8601); templated.
    :param after_step: the checkpoint's step (the last number in its name) must be past this; templated.
    :param on_job_end: when the job ends without such a checkpoint: ``skip`` (default) or ``fail``.
    :param hai_conn_id: the Airflow connection to the hai server.
    :param deferrable: wait in the triggerer (default) instead of poking from a worker.
    """

    template_fields: Sequence[str] = ("job_id", "path", "newer_than", "after_step")
    ui_color = "#e8f4ff"

    def __init__(
        self,
        *,
        job_id: int | str | None = None,
        path: str | None = None,
        pattern: str = DEFAULT_PATTERN,
        newer_than: datetime | str | None = None,
        after_step: int | str | None = None,
        on_job_end: Literal["skip", "fail"] = "skip",
        hai_conn_id: str = DEFAULT_CONN_ID,
        deferrable: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if job_id is None and not path:
            raise ValueError("HaiCheckpointSensor needs `job_id` or `path`")
        self.job_id = job_id
        self.path = path
        self.pattern = pattern
        self.newer_than = newer_than
        self.after_step = after_step
        self.on_job_end = on_job_end
        self.hai_conn_id = hai_conn_id
        self.deferrable = default_deferrable() if deferrable is None else deferrable

    def _marks(self) -> tuple[datetime | None, int | None]:
        newer_than = None if self.newer_than in ("", "None") else self.newer_than
        return parse_time(newer_than), optional_int(self.after_step)

    def _look(self) -> HaiCheckpointEvent | None:
        """One look: the event when a wanted checkpoint exists or the job ended, else None."""
        newer_than, after_step = self._marks()
        job = None
        if optional_int(self.job_id) is not None:
            hook = HaiHook(self.hai_conn_id)
            try:
                job = hook.get_conn().job(int(str(self.job_id)))
            finally:
                hook.close()
        seen = newest_in_path(self.path, self.pattern) if self.path else job_checkpoint(job) if job else None
        if seen is not None and is_newer(seen, newer_than, after_step):
            return HaiCheckpointEvent.found(seen, job)
        if job is not None and job.state in TERMINAL_STATES:
            return HaiCheckpointEvent(status="job_ended", job_id=job.id, job_state=job.state)
        return None

    def _decide(self, event: HaiCheckpointEvent) -> dict[str, Any]:
        if event.status == "found":
            self.log.info("checkpoint %s (step %s, written %s)", event.checkpoint, event.step, event.saved_at)
            return event.model_dump(
                mode="json", include={"checkpoint", "step", "saved_at", "job_id", "job_state"}
            )
        if event.status == "job_ended":
            message = f"hai job {event.job_id} ended {event.job_state} without a newer checkpoint"
            if self.on_job_end == "skip":
                raise AirflowSkipException(message)
            raise AirflowException(message)
        raise AirflowException(f"lost track of hai job {event.job_id}: {event.message}")

    def poke(self, context: Context) -> bool | PokeReturnValue:
        event = self._look()
        if event is None:
            return False
        return PokeReturnValue(is_done=True, xcom_value=self._decide(event))

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        event = self._look()
        if event is not None:
            return self._decide(event)
        newer_than, after_step = self._marks()
        self.defer(
            trigger=HaiCheckpointTrigger(
                job_id=optional_int(self.job_id),
                path=self.path or None,
                pattern=self.pattern,
                newer_than=newer_than.isoformat() if newer_than else None,
                after_step=after_step,
                hai_conn_id=self.hai_conn_id,
                poll_interval=self.poke_interval,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout) if self.timeout else None,
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        return self._decide(HaiCheckpointEvent.model_validate(event))
