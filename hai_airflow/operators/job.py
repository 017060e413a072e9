"""BaseHaiJobOperator: submit (or re-attach to) a hai job and wait for it, deferred or blocking."""

from __future__ import annotations

import hashlib
import time
from abc import abstractmethod
from collections.abc import Iterable, Sequence
from datetime import timedelta
from functools import partial
from itertools import count
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from airflow.sdk import BaseOperator, conf
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hai_airflow import durations
from hai_airflow.airflow_plugin.pools import pool_name
from hai_airflow.airflow_plugin.priority import HaiPriorityWeightStrategy
from hai_airflow.assets import model_asset
from hai_airflow.client import HaiClient, HaiError
from hai_airflow.dashboard.extra_link import JOB_ID_XCOM_KEY, HaiJobLink
from hai_airflow.hooks.acting import act_for_run
from hai_airflow.hooks.hai import DEFAULT_CONN_ID, HaiHook
from hai_airflow.hooks.identity import Acting
from hai_airflow.hooks.retry import retry_transient
from hai_airflow.operators.triggerer import no_triggerer
from hai_airflow.scheduling.packages import offered, smallest_package
from hai_airflow.spec import (
    TERMINAL_STATES,
    DistributedJobSpec,
    JobSpec,
    JobState,
    JobView,
    PriorityClass,
    ResourcePackageView,
    StandaloneJobSpec,
    is_high,
)
from hai_airflow.triggers.checkpoint import checkpoint_step
from hai_airflow.triggers.job import HaiJobEvent, HaiJobTrigger, describe_transition, is_done
from hai_airflow.triggers.quota import HaiQuotaEvent, HaiQuotaTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

OverQuota = Literal["wait", "fail", "downgrade"]
OVER_QUOTA_CHOICES: tuple[str, ...] = ("wait", "fail", "downgrade")
RETRYABLE_END_STATES = frozenset({JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT})
"""A job that ended so is not re-attached to: the Airflow retry submits a new one."""


def limit_seconds(value: timedelta | int | str | None) -> int | None:
    """A time limit as given to an operator: a timedelta, seconds, or a duration such as ``4h``."""
    if value in ("", None):
        return None
    if isinstance(value, timedelta):
        return int(value.total_seconds())
    text = str(value).strip()
    return int(text) if text.isdigit() else durations.parse(text)


def default_deferrable() -> bool:
    """``[operators] default_deferrable``, as for every provider's operators (Airflow's default: off)."""
    return conf.getboolean("operators", "default_deferrable", fallback=False)


def client_key(dag_id: str, task_id: str, run_id: str, map_index: int, attempt: int = 1) -> str:
    """The submit idempotency key of one Airflow task instance (and the `attempt`-th job it ran)."""
    key = f"airflow:{dag_id}:{task_id}:{run_id}:{map_index}"
    if len(key) > 200:
        key = "airflow:" + hashlib.sha256(key.encode()).hexdigest()
    return key if attempt == 1 else f"{key}#{attempt}"


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


def is_quota_refusal(error: HaiError) -> bool:
    """The server refused a high-priority submit because the quota does not cover it."""
    return error.status == 409 and error.field == "max_schedule"


def failure_message(event: HaiJobEvent) -> str:
    """The error an operator raises: what ended how, the server's reason, the last log lines."""
    if event.status == "error":
        return f"lost track of hai job {event.job_id}: {event.message}"
    text = f"hai job {event.job_id} ended {event.state}"
    if event.reason:
        text += f": {event.reason}"
    if event.log_tail:
        text += "\nlast log lines:\n" + "\n".join(event.log_tail)
    return text


def find_package(packages: Iterable[ResourcePackageView], package_id: int, field: str) -> ResourcePackageView:
    for package in packages:
        if package.id == package_id:
            return package
    raise AirflowFailException(
        f"`{field}`: resource package {package_id} does not exist; `hai res` lists them"
    )


def choose_package(
    packages: Sequence[ResourcePackageView],
    package_id: int | str | None,
    gpus: int | str | None,
    gpu_type: str | None,
    field: str,
) -> int:
    """The package to submit with: the one named, else the one `hai submit` would pick for `gpus`
    (:func:`~hai_airflow.scheduling.packages.smallest_package`: at least that many, of `gpu_type`)."""
    if package_id not in (None, ""):
        package = find_package(packages, int(package_id), field)
        if gpus not in (None, "") and package.gpus < int(gpus):
            raise AirflowFailException(
                f"`{field}`: package {package.id} ({package.name}) has {package.gpus} GPUs, "
                f"fewer than {gpus}; give only one of the two, or make them agree"
            )
        return package.id
    if gpus in (None, ""):
        raise AirflowFailException(f"`{field}` or a GPU count is required; `hai res` lists the packages")
    chosen = smallest_package(packages, int(gpus), str(gpu_type) if gpu_type else None)
    if chosen is None:
        raise AirflowFailException(
            f"no resource package has {gpus} x {gpu_type or 'any GPU'} (offered: {offered(packages)}); "
            "pick the GPU count and type from `hai res`"
        )
    return chosen.id


PACKAGES_TTL_S = 60.0
"""How long the packages asked while a DAG file is parsed are reused: files are parsed often."""
_packages_seen: dict[str, tuple[float, tuple[ResourcePackageView, ...] | None]] = {}


def packages_when_parsed(conn_id: str, timeout: float = 2.0) -> tuple[ResourcePackageView, ...] | None:
    """The server's packages for sizing a task's pool slots as its DAG file is parsed; one short
    request a minute per connection; None when the server cannot be reached."""
    asked = _packages_seen.get(conn_id)
    if asked is not None and time.monotonic() - asked[0] < PACKAGES_TTL_S:
        return asked[1]
    hook = HaiHook(conn_id, timeout=timeout)
    packages: tuple[ResourcePackageView, ...] | None
    try:
        packages = tuple(hook.get_conn().resource_packages())
    # parsing must go on whatever the failure (no connection, server down, a refusal)
    except Exception:
        packages = None
    finally:
        hook.close()
    _packages_seen[conn_id] = (time.monotonic(), packages)
    return packages


def chosen_gpus(
    packages: Sequence[ResourcePackageView] | None,
    package_id: int | str | None,
    gpus: int | str | None,
    gpu_type: str | None,
) -> int | None:
    """GPUs of the package `choose_package` would take, from literal arguments only; without the
    server's packages, the GPUs asked for; None when templated or not choosable."""
    package_id = package_id if isinstance(package_id, int) else None
    gpus = gpus if isinstance(gpus, int) else None
    if packages is None or (package_id is None and gpus is None):
        return gpus
    if gpu_type is not None and "{{" in gpu_type:
        return gpus
    try:
        chosen = choose_package(packages, package_id, gpus, gpu_type, "package")
        return find_package(packages, chosen, "package").gpus
    except AirflowFailException:
        return None


def processes_field(processes: str | None) -> dict[str, str]:
    """The ``processes`` spec field when one was chosen; None or an empty form field leaves the mode's
    default (per-worker for standalone jobs, per-gpu for distributed ones)."""
    return {"processes": processes} if processes else {}


def job_gpus(spec: JobSpec, packages: Sequence[ResourcePackageView]) -> int:
    """GPUs the job holds: the package's GPUs, times the workers of a distributed job."""
    if isinstance(spec, StandaloneJobSpec):
        return find_package(packages, spec.resource_pkg, "resource_pkg").gpus
    if isinstance(spec, DistributedJobSpec):
        return spec.workers * find_package(packages, spec.worker_resource_pkg, "worker_resource_pkg").gpus
    return 0


def _spec_error(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        where = ".".join(str(p) for p in err["loc"]) or "spec"
        fix = (err.get("ctx") or {}).get("fix")
        then = f" ({fix})" if isinstance(fix, str) else ""
        parts.append(f"`{where}`: {str(err['msg']).removeprefix('Value error, ')}{then}")
    return "invalid hai job: " + "; ".join(parts)


class BaseHaiJobOperator(BaseOperator):
    """Submits one hai job and succeeds when it succeeds; subclasses say what job.

    The job's spec fields are the platform's (``hai create --help``); the rest says how Airflow
    waits. A task that is retried re-attaches to the job its earlier try submitted while that
    job is alive or has succeeded (the key is dag, task, run and map index); after a failed or
    cancelled job it submits a new one. Suspension and resume happen inside the wait.

    :param code_path: NAS directory the job starts in (or git repository with ``code_src="git"``).
    :param cmd: start command, usually ``python3 xxx.py``.
    :param task_name: the job's name in ``hai task``; default ``<dag_id>.<task_id>``.
    :param model_id: model id from the model page.
    :param project_id: project id from *My projects*.
    :param code_src: ``nas`` or ``git``.
    :param git_branch: branch to check out (git only).
    :param model_dir: where the job saves checkpoints (``HAI_MODEL_DIR``).
    :param project_storage: project storage ids to mount, e.g. ``"10111,10222"``.
    :param max_schedule: expected queueing hours, one of 0, 4, 6, 8, 24, 48; 0 = low priority.
    :param image: docker image of the job.
    :param shm: shared memory in MB.
    :param env: extra environment variables of the job.
    :param elastic: told to save and exit on suspension (EFDL-style) instead of killed (templated).
    :param grace_seconds: seconds between the save notice and the kill (templated).
    :param time_limit: run time allowed over all the job's runs, as a ``timedelta``, seconds, or a
        duration such as ``"4h"`` (templated); at the limit the job gets the save notice and its
        grace, then ends TIMEOUT and the task fails (a retry submits a new job).
    :param after: hai job ids (comma-separated or a list, templated) that must succeed before this job
        starts, for dependencies outside this DAG's edges (e.g. another DAG's job id from XCom).
    :param after_any: hai job ids that must end first, in any state.
    :param labels: labels to find the job by (``hai task -l team=vision``), templated.
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

    template_fields: Sequence[str] = (
        "task_name",
        "model_id",
        "project_id",
        "code_src",
        "code_path",
        "git_branch",
        "model_dir",
        "project_storage",
        "max_schedule",
        "image",
        "shm",
        "cmd",
        "env",
        "metrics_path",
        "elastic",
        "grace_seconds",
        "time_limit",
        "after",
        "after_any",
        "labels",
        "hai_user",
    )
    template_fields_renderers: ClassVar[dict[str, str]] = {"env": "json", "cmd": "bash"}
    ui_color = "#d9ecff"
    operator_extra_links = (HaiJobLink(),)

    def __init__(
        self,
        *,
        code_path: str,
        cmd: str,
        task_name: str | None = None,
        model_id: int | str | None = None,
        project_id: int | str | None = None,
        code_src: str = "nas",
        git_branch: str | None = None,
        model_dir: str | None = None,
        project_storage: str | Sequence[int] = (),
        max_schedule: int | str = 0,
        image: str = "local",
        shm: int | str | None = None,
        env: dict[str, str] | None = None,
        elastic: bool | str = False,
        grace_seconds: int | str | None = None,
        time_limit: timedelta | int | str | None = None,
        after: str | Sequence[int] = (),
        after_any: str | Sequence[int] = (),
        labels: dict[str, str] | None = None,
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
        kwargs.setdefault("weight_rule", HaiPriorityWeightStrategy())
        super().__init__(**kwargs)
        self.code_path = code_path
        self.cmd = cmd
        self.task_name = task_name
        self.model_id = model_id
        self.project_id = project_id
        self.code_src = code_src
        self.git_branch = git_branch
        self.model_dir = model_dir
        self.project_storage = project_storage
        self.max_schedule = max_schedule
        self.hai_max_schedule = max_schedule
        self.image = image
        self.shm = shm
        self.env = env or {}
        self.elastic = elastic
        self.grace_seconds = grace_seconds
        self.time_limit = time_limit
        self.after = after
        self.after_any = after_any
        self.labels = labels or {}
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
        if model_dir and "{{" not in model_dir:
            # a templated model dir is known only at run time, too late to declare
            self.outlets = [*self.outlets, model_asset(model_dir)]

    @classmethod
    def get_serialized_fields(cls) -> frozenset[str]:
        # the scheduler's copy of the task needs the declared priority for HaiPriorityWeightStrategy
        return frozenset(super().get_serialized_fields() | {"hai_max_schedule"})

    # ---- what subclasses provide ---------------------------------------------------------------

    needs_packages: bool = True
    """Whether building the spec needs the server's resource packages."""

    @abstractmethod
    def build_spec(self, packages: Sequence[ResourcePackageView]) -> JobSpec:
        """The job to submit, from the rendered arguments (pydantic validates it)."""

    def pool_gpus(self, packages: Sequence[ResourcePackageView] | None) -> int | None:
        """GPUs of the package the job will take, times its workers, from literal arguments: the
        pool slots. `packages` None (the server not reached): the GPUs declared, if any."""
        return None

    def _take_quota_pool(self) -> None:
        """High priority, waiting for quota, GPUs known: hold that many slots of the group's pool."""
        if self._pool_given or self.resource_group is None or self.on_over_quota != "wait":
            return
        if not isinstance(self.max_schedule, int) or not is_high(self.max_schedule):
            return
        gpus = self.pool_gpus(packages_when_parsed(self.hai_conn_id))
        if gpus:
            self.pool = pool_name(self.resource_group)
            self.pool_slots = gpus

    def common_fields(self) -> dict[str, Any]:
        """The spec fields every mode shares, from the rendered arguments."""
        return {
            "task_name": self.task_name or f"{self.dag_id}.{self.task_id}",
            "model_id": self.model_id if self.model_id not in ("", None) else None,
            "project_id": self.project_id if self.project_id not in ("", None) else None,
            "code_src": self.code_src,
            "code_path": self.code_path,
            "git_branch": self.git_branch or None,
            "model_dir": self.model_dir or None,
            "project_storage": self.project_storage,
            "max_schedule": self.max_schedule,
            "image": self.image,
            "shm": self.shm if self.shm not in ("", None) else None,
            "cmd": self.cmd,
            "env": {str(k): str(v) for k, v in (self.env or {}).items()},
            "elastic": self.elastic not in (False, "", "false", "False", "0", 0, None),
            "grace_seconds": self.grace_seconds if self.grace_seconds not in ("", None) else None,
            "time_limit_seconds": limit_seconds(self.time_limit),
            "after": self.after or (),
            "after_any": self.after_any or (),
            "labels": {str(k): str(v) for k, v in (self.labels or {}).items()},
        }

    # ---- running ------------------------------------------------------------------------------

    def hook(self) -> HaiHook:
        return HaiHook(self.hai_conn_id, on_behalf_of=self._on_behalf_of)

    def execute(self, context: Context) -> dict[str, Any]:
        hook = self.hook()
        try:
            self._check_triggerer()
            acting = self._act_for_the_person(hook, context)
            self._check_group(acting)
            return self._start(hook, context)
        finally:
            hook.close()

    def _act_for_the_person(self, hook: HaiHook, context: Context) -> Acting:
        """Make `hook` act for the person behind this run; never the connection's own identity by default."""
        acting = act_for_run(hook, context, hai_user=self.hai_user, owner=self.owner, log=self.log)
        self._on_behalf_of = acting.on_behalf_of
        return acting

    def _check_group(self, acting: Acting) -> None:
        """A pool named for another group than the acting user's would count against the wrong quota."""
        if self.resource_group is not None and acting.group and acting.group != self.resource_group:
            self.log.warning(
                "resource_group=%r, but %s is in group %r: the task holds pool %s while the job counts "
                "against %s's quota; set resource_group=%r or leave it None",
                self.resource_group,
                acting.user,
                acting.group,
                pool_name(self.resource_group),
                acting.group,
                acting.group,
            )

    def _start(self, hook: HaiHook, context: Context) -> dict[str, Any]:
        """Submit (or re-attach), then wait: deferred, or here with the long-poll."""
        client = hook.get_conn()
        packages = client.resource_packages() if self.needs_packages else []
        try:
            spec = self.build_spec(packages)
        except ValidationError as e:
            raise AirflowFailException(_spec_error(e)) from None
        except ValueError as e:  # a time limit that is not a duration
            raise AirflowFailException(f"invalid hai job: `time_limit`: {e}") from None
        job, key = self._earlier_job(client, context)
        if job is None:
            gpus = job_gpus(spec, packages)
            spec = self._within_quota(client, spec, gpus)
            job = self._submit(client, spec, key, gpus)
            self.log.info(
                "submitted hai job %s (%s, %s priority, %s GPUs); follow it with `hai task` or "
                "`hai instance --task-id %s`",
                job.id,
                job.task_name,
                job.priority,
                job.gpus,
                job.id,
            )
        self._job_id = job.id
        # the Logs view has no Details tab beside it: give the job's page here too
        self.log.info("hai job %s: %s", job.id, HaiJobLink.page_for(job.id))
        context["ti"].xcom_push(key=JOB_ID_XCOM_KEY, value=job.id)
        # The link would otherwise appear only when the task ends, i.e. after the whole deferral.
        HaiJobLink.persist(context, job.id)
        return self._follow(hook, job, context)

    def _submit(self, client: HaiClient, spec: JobSpec, key: str, gpus: int) -> JobView:
        try:
            return client.submit(spec, client_key=key)
        except HaiError as e:
            if is_quota_refusal(e) and spec.priority == "high":
                # the quota was taken between the check and the submit: apply on_over_quota again
                return client.submit(self._over_quota(client, spec, gpus, e.error), client_key=key)
            if 400 <= e.status < 500:
                raise AirflowFailException(f"hai refused the job: {e.message}") from None
            raise AirflowException(f"hai refused the job: {e.message}") from None

    def _earlier_job(self, client: HaiClient, context: Context) -> tuple[JobView | None, str]:
        """The job an earlier try of this task instance left alive (or succeeded), and the key to use."""
        ti = context["ti"]
        map_index = getattr(ti, "map_index", -1)
        for attempt in count(1):
            key = client_key(
                ti.dag_id, ti.task_id, ti.run_id, -1 if map_index is None else map_index, attempt
            )
            job = client.job_by_key(key)
            if job is None:
                return None, key
            if job.state not in RETRYABLE_END_STATES:
                self.log.info(
                    "re-attaching to hai job %s (%s), submitted by an earlier try", job.id, job.state
                )
                return job, key
        raise AssertionError("unreachable")

    def _within_quota(self, client: HaiClient, spec: JobSpec, gpus: int) -> JobSpec:
        """The spec to submit: as given when it is low priority or the quota covers it."""
        if spec.priority == "low" or gpus == 0:
            return spec
        check = client.check_high_priority(gpus)
        if check.get("allowed"):
            return spec
        return self._over_quota(client, spec, gpus, str(check.get("reason") or "over quota"))

    def _over_quota(self, client: HaiClient, spec: JobSpec, gpus: int, reason: str) -> JobSpec:
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
        while not client.check_high_priority(gpus).get("allowed"):
            time.sleep(self.quota_poll_interval)
        return spec

    def _check_triggerer(self) -> None:
        """Fail before submitting when a deferred wait could never resume: Airflow reports no triggerer."""
        if self.deferrable and no_triggerer(conf.get("api", "base_url", fallback="")):
            raise AirflowException(
                "deferrable, but Airflow reports no running triggerer, so the deferred wait would never "
                "resume. Start `airflow triggerer`, or set deferrable=False ([operators] "
                "default_deferrable = False) to wait in the worker"
            )

    def execute_after_quota(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Quota freed up: submit now (re-checked, since another job may have taken it first)."""
        quota = HaiQuotaEvent.model_validate(event)
        if quota.status != "allowed":
            raise AirflowException(f"waiting for quota failed: {quota.reason}")
        return self.execute(context)

    def _follow(self, hook: HaiHook, job: JobView, context: Context) -> dict[str, Any]:
        if job.state in TERMINAL_STATES:
            return self._finish(HaiJobEvent.from_job(job, (), self._log_tail(hook, job.id)), context)
        if self.deferrable:
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
        return self._finish(self._wait_blocking(hook, job), context)

    def _wait_blocking(self, hook: HaiHook, job: JobView) -> HaiJobEvent:
        """Non-deferrable mode: the same long-poll as the trigger, in this worker."""
        client = hook.get_conn()
        state: str = job.state
        self.log.info(describe_transition(job, None))
        while not is_done(state, ()):
            try:
                job = retry_transient(
                    partial(client.wait, job.id, since_state=state, timeout=self.poll_timeout),
                    what=f"following hai job {job.id}",
                    log=self.log,
                )
            except HaiError as e:
                raise AirflowException(f"lost track of hai job {job.id}: {e.message}") from None
            if job.state != state:
                self.log.info(describe_transition(job, state))
                state = job.state
        return HaiJobEvent.from_job(job, (), self._log_tail(hook, job.id))

    def _log_tail(self, hook: HaiHook, job_id: int) -> list[str]:
        try:
            return hook.log_tail(job_id, self.log_tail_lines)
        except HaiError as e:
            self.log.warning("could not read the log of hai job %s: %s", job_id, e.message)
            return []

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """The trigger says the job ended: return its result or raise with its reason and log tail."""
        return self._finish(HaiJobEvent.model_validate(event), context)

    def _finish(self, event: HaiJobEvent, context: Context) -> dict[str, Any]:
        self._job_id = event.job_id
        if event.log_tail:
            self.log.info(
                "last %d lines of hai job %s's log:\n%s",
                len(event.log_tail),
                event.job_id,
                "\n".join(event.log_tail),
            )
        if event.status != "success":
            raise AirflowException(failure_message(event))
        self.log.info(
            "hai job %s succeeded after %d run(s) and %d preemption(s)",
            event.job_id,
            event.instances,
            event.preemptions,
        )
        self._announce_model(event, context)
        return HaiJobResult(
            job_id=event.job_id,
            state=event.state or JobState.SUCCEEDED,
            priority=event.priority,
            instances=event.instances,
            preemptions=event.preemptions,
            latest_checkpoint=event.latest_checkpoint,
            metrics_path=self.metrics_path or None,
        ).model_dump(mode="json")

    def _announce_model(self, event: HaiJobEvent, context: Context) -> None:
        """An event of the model dir's asset: the newest checkpoint (or the dir) and its step."""
        if not self.model_dir:
            return
        asset = model_asset(self.model_dir)
        if asset not in self.outlets:
            return
        path = event.latest_checkpoint or self.model_dir
        step = checkpoint_step(event.latest_checkpoint) if event.latest_checkpoint else None
        context["outlet_events"][asset].extra = {"path": path, "step": step}

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
