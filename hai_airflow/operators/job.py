"""BaseHaiJobOperator: submit (or re-attach to) a hai job and wait for it, deferred or blocking.

Its parts are named modules: :mod:`.spec_building` (arguments to spec fields), :mod:`.package_choice`
(the package and its GPUs), :mod:`.submission` (re-attach, quota, submit), the job follower shared
with the trigger (:mod:`hai_airflow.hooks.follower`) and :mod:`.result` (what the end means).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import conf
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from pydantic import ValidationError

from hai_airflow.airflow_plugin.pools import pool_name
from hai_airflow.client import HaiClient, HaiError
from hai_airflow.dashboard.extra_link import JOB_ID_XCOM_KEY, HaiJobLink
from hai_airflow.hooks.acting import act_for_run
from hai_airflow.hooks.follower import HaiJobEvent, JobFollower, is_done
from hai_airflow.hooks.hai import DEFAULT_CONN_ID, HaiHook
from hai_airflow.hooks.identity import Acting
from hai_airflow.operators.package_choice import job_gpus, packages_when_parsed
from hai_airflow.operators.quota import quota_pool_gpus, wait_here, warn_other_group
from hai_airflow.operators.result import announce_model, job_result
from hai_airflow.operators.spec_building import HaiJobSpecBuilder, spec_error
from hai_airflow.operators.submission import OVER_QUOTA_CHOICES, OverQuota, Submission
from hai_airflow.operators.triggerer import check_triggerer
from hai_airflow.spec import JobView
from hai_airflow.triggers.job import HaiJobTrigger
from hai_airflow.triggers.quota import HaiQuotaEvent, HaiQuotaTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context


def default_deferrable() -> bool:
    """``[operators] default_deferrable``, as for every provider's operators (Airflow's default: off)."""
    return conf.getboolean("operators", "default_deferrable", fallback=False)


class BaseHaiJobOperator(HaiJobSpecBuilder):
    """Submits one hai job and succeeds when it succeeds; subclasses say what job.

    Takes every argument of :class:`~hai_airflow.operators.spec_building.HaiJobSpecBuilder` (the
    job's spec fields, the platform's: ``hai create --help``); the rest says how Airflow waits. A
    task that is retried re-attaches to the job its earlier try submitted while that job is alive
    or has succeeded (the key is dag, task, run and map index); after a failed or cancelled job it
    submits a new one. Suspension and resume happen inside the wait.

    :param metrics_path: a metrics file the job writes; returned with the result for downstream tasks.
    :param on_over_quota: when a high-priority job does not fit the quota: ``wait`` (defer until
        it does, then submit as high), ``fail``, or ``downgrade`` (submit as low priority).
    :param resource_group: the acting user's resource group, only to hold the Airflow pool
        ``hai_<group>``: a high-priority task that waits for quota takes ``pool_slots`` = the GPUs
        of the package its job will take (times the workers), asked of the server when the DAG file
        is parsed (the GPUs asked for, if it cannot be reached). Needs ``max_schedule`` and the
        package or GPU count as literal numbers. ``None`` (default): no pool; the group the job
        counts against is always the acting user's, from the server.
    :param hai_user: the hai user a run nobody triggered acts for (templated; else the DAG param
        ``hai_user``, else the DAG's ``owner``). A run someone triggered acts for them.
    :param cancel_on_kill: cancel the job when the task is killed, marked failed or cleared.
    :param hai_conn_id: the Airflow connection to the hai server.
    :param deferrable: wait in the triggerer instead of holding a worker slot; default
        ``[operators] default_deferrable``. Recommended for long GPU jobs.
    :param poll_timeout: seconds one long-poll may wait on the server.
    :param quota_poll_interval: seconds between quota checks while waiting for quota.
    :param log_tail_lines: job log lines copied into the task log at the end.
    """

    template_fields: Sequence[str] = (*HaiJobSpecBuilder.template_fields, "metrics_path", "hai_user")
    ui_color = "#d9ecff"
    operator_extra_links = (HaiJobLink(),)

    def __init__(
        self,
        *,
        metrics_path: str | None = None,
        on_over_quota: OverQuota = "wait",
        resource_group: str | None = None,
        hai_user: str | None = None,
        cancel_on_kill: bool = True,
        hai_conn_id: str = DEFAULT_CONN_ID,
        deferrable: bool | None = None,
        poll_timeout: float = 30.0,
        quota_poll_interval: float = 15.0,
        log_tail_lines: int = 20,
        **kwargs: Any,
    ) -> None:
        if on_over_quota not in OVER_QUOTA_CHOICES:
            raise ValueError(f"on_over_quota={on_over_quota!r}: use one of {', '.join(OVER_QUOTA_CHOICES)}")
        self._pool_given = "pool" in kwargs
        super().__init__(**kwargs)
        self.metrics_path = metrics_path
        self.on_over_quota = on_over_quota
        self.resource_group = resource_group
        self.hai_user = hai_user
        self.cancel_on_kill = cancel_on_kill
        self.hai_conn_id = hai_conn_id
        self.deferrable = default_deferrable() if deferrable is None else deferrable
        self.poll_timeout = poll_timeout
        self.quota_poll_interval = quota_poll_interval
        self.log_tail_lines = log_tail_lines
        self._job_id: int | None = None
        self._on_behalf_of: str | None = None

    def _take_quota_pool(self) -> None:
        """High priority, waiting for quota, GPUs known: hold that many slots of the group's pool."""
        if self._pool_given or self.resource_group is None:
            return
        gpus = quota_pool_gpus(
            max_schedule=self.max_schedule,
            on_over_quota=self.on_over_quota,
            gpus=lambda: self.pool_gpus(packages_when_parsed(self.hai_conn_id)),
        )
        if gpus:
            self.pool = pool_name(self.resource_group)
            self.pool_slots = gpus

    # ---- running ------------------------------------------------------------------------------

    def hook(self) -> HaiHook:
        return HaiHook(self.hai_conn_id, on_behalf_of=self._on_behalf_of)

    def execute(self, context: Context) -> dict[str, Any]:
        hook = self.hook()
        try:
            check_triggerer(self.deferrable)
            acting = self._act_for_the_person(hook, context)
            warn_other_group(self.resource_group, acting, self.log)
            job = self._submit_or_reattach(hook.get_conn(), context)
            return self._follow(hook, job, context)
        finally:
            hook.close()

    def _act_for_the_person(self, hook: HaiHook, context: Context) -> Acting:
        """Make `hook` act for the person behind this run; never the connection's own identity by default."""
        acting = act_for_run(hook, context, hai_user=self.hai_user, owner=self.owner, log=self.log)
        self._on_behalf_of = acting.on_behalf_of
        return acting

    def _submit_or_reattach(self, client: HaiClient, context: Context) -> JobView:
        """The job an earlier try left alive, else a new one; its id and page shown at once."""
        packages = client.resource_packages() if self.needs_packages else []
        try:
            spec = self.build_spec(packages)
        except ValidationError as e:
            raise AirflowFailException(spec_error(e)) from None
        except ValueError as e:  # a time limit that is not a duration
            raise AirflowFailException(f"invalid hai job: `time_limit`: {e}") from None
        submission = Submission(
            client=client,
            on_over_quota=self.on_over_quota,
            wait_for_quota=lambda gpus: self._wait_for_quota(client, gpus),
            log=self.log,
        )
        job, key = submission.earlier_job(context["ti"])
        if job is None:
            job = submission.submit(spec, key, job_gpus(spec, packages))
        self._job_id = job.id
        # the Logs view has no Details tab beside it: give the job's page here too
        self.log.info("hai job %s: %s", job.id, HaiJobLink.page_for(job.id))
        context["ti"].xcom_push(key=JOB_ID_XCOM_KEY, value=job.id)
        # The link would otherwise appear only when the task ends, i.e. after the whole deferral.
        HaiJobLink.persist(context, job.id)
        return job

    def _wait_for_quota(self, client: HaiClient, gpus: int) -> None:
        """Wait until the quota covers `gpus`: deferred (resuming in `execute_after_quota`), or here."""
        if self.deferrable:
            self.defer(
                trigger=HaiQuotaTrigger(
                    gpus,
                    self.hai_conn_id,
                    poll_interval=self.quota_poll_interval,
                    on_behalf_of=self._on_behalf_of,
                ),
                method_name="execute_after_quota",
            )
        wait_here(client, gpus, self.quota_poll_interval)

    def execute_after_quota(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Quota freed up: submit now (re-checked, since another job may have taken it first)."""
        quota = HaiQuotaEvent.model_validate(event)
        if quota.status != "allowed":
            raise AirflowException(f"waiting for quota failed: {quota.reason}")
        return self.execute(context)

    def _follow(self, hook: HaiHook, job: JobView, context: Context) -> dict[str, Any]:
        """Wait for the job's end: in the triggerer (deferred), or here with the same follower."""
        if self.deferrable and not is_done(job.state, ()):
            self.defer(
                trigger=HaiJobTrigger(
                    job.id,
                    self.hai_conn_id,
                    poll_timeout=self.poll_timeout,
                    log_tail_lines=self.log_tail_lines,
                    cancel_on_kill=self.cancel_on_kill,
                    on_behalf_of=self._on_behalf_of,
                ),
                method_name="execute_complete",
            )
        follower = JobFollower(
            job_id=job.id,
            log=self.log,
            poll_timeout=self.poll_timeout,
            log_tail_lines=self.log_tail_lines,
            hook=hook,
        )
        return self._finish(follower.follow(first=job), context)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """The trigger says the job ended: return its result or raise with its reason and log tail."""
        return self._finish(HaiJobEvent.model_validate(event), context)

    def _finish(self, event: HaiJobEvent, context: Context) -> dict[str, Any]:
        self._job_id = event.job_id
        result = job_result(event, self.metrics_path, self.log)
        announce_model(self.model_dir, self.outlets, event, context)
        return result.model_dump(mode="json")

    def on_kill(self) -> None:
        """The task was killed while it waited here: cancel the job unless `cancel_on_kill` is off."""
        if self._job_id is None or not self.cancel_on_kill:
            return
        hook = self.hook()
        try:
            job = hook.get_conn().cancel(self._job_id)
            self.log.info("cancelled hai job %s (now %s) because the task was killed", job.id, job.state)
        except HaiError as e:
            self.log.warning("could not cancel hai job %s: %s", self._job_id, e.message)
        finally:
            hook.close()
