"""What job a hai operator submits: the platform's spec fields as its (templated) arguments, and the
spec they build once rendered, or the error a refused spec raises."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, ClassVar

from airflow.sdk import BaseOperator
from pydantic import ValidationError

from hai_airflow import durations
from hai_airflow.airflow_plugin.priority import HaiPriorityWeightStrategy
from hai_airflow.assets import model_asset
from hai_airflow.spec import JobSpec, ResourcePackageView


def given(value: Any) -> Any:
    """The value, or None when it was not given (None, or an empty rendered template or form field)."""
    return None if value in ("", None) else value


def limit_seconds(value: timedelta | int | str | None) -> int | None:
    """A time limit as given to an operator: a timedelta, seconds, or a duration such as ``4h``."""
    if value in ("", None):
        return None
    if isinstance(value, timedelta):
        return int(value.total_seconds())
    text = str(value).strip()
    return int(text) if text.isdigit() else durations.parse(text)


def is_on(flag: bool | str | None) -> bool:
    """A flag as rendered: a bool, or a template's text (``"false"``, ``"0"`` and empty are off)."""
    return flag not in (False, "", "false", "False", "0", 0, None)


def text_mapping(mapping: dict[Any, Any] | None) -> dict[str, str]:
    """A mapping (``env``, ``labels``) with its keys and values as text."""
    return {str(k): str(v) for k, v in (mapping or {}).items()}


def processes_field(processes: str | None) -> dict[str, str]:
    """The ``processes`` spec field when one was chosen; None or an empty form field leaves the mode's
    default (per-worker for standalone jobs, per-gpu for distributed ones)."""
    return {"processes": processes} if processes else {}


def spec_error(e: ValidationError) -> str:
    """The refusal of a spec in the operator's words: each field, its problem and its fix."""
    parts = []
    for err in e.errors():
        where = ".".join(str(p) for p in err["loc"]) or "spec"
        fix = (err.get("ctx") or {}).get("fix")
        then = f" ({fix})" if isinstance(fix, str) else ""
        parts.append(f"`{where}`: {str(err['msg']).removeprefix('Value error, ')}{then}")
    return "invalid hai job: " + "; ".join(parts)


class HaiJobSpecBuilder(BaseOperator):
    """What job every hai job operator submits: the job's spec fields are the platform's
    (``hai create --help``), templated; subclasses add their mode's fields and build the spec.

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
        "elastic",
        "grace_seconds",
        "time_limit",
        "after",
        "after_any",
        "labels",
    )
    template_fields_renderers: ClassVar[dict[str, str]] = {"env": "json", "cmd": "bash"}

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
        **kwargs: Any,
    ) -> None:
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
        if model_dir and "{{" not in model_dir:
            # a templated model dir is known only at run time, too late to declare
            self.outlets = [*self.outlets, model_asset(model_dir)]

    @classmethod
    def get_serialized_fields(cls) -> frozenset[str]:
        # the scheduler's copy of the task needs the declared priority for HaiPriorityWeightStrategy
        return frozenset(super().get_serialized_fields() | {"hai_max_schedule"})

    needs_packages: bool = True
    """Whether building the spec needs the server's resource packages."""

    @abstractmethod
    def build_spec(self, packages: Sequence[ResourcePackageView]) -> JobSpec:
        """The job to submit, from the rendered arguments (pydantic validates it)."""

    def pool_gpus(self, packages: Sequence[ResourcePackageView] | None) -> int | None:
        """GPUs of the package the job will take, times its workers, from literal arguments: the
        pool slots. `packages` None (the server not reached): the GPUs declared, if any."""
        return None

    def common_fields(self) -> dict[str, Any]:
        """The spec fields every mode shares, from the rendered arguments."""
        return {
            "task_name": self.task_name or f"{self.dag_id}.{self.task_id}",
            "model_id": given(self.model_id),
            "project_id": given(self.project_id),
            "code_src": self.code_src,
            "code_path": self.code_path,
            "git_branch": self.git_branch or None,
            "model_dir": self.model_dir or None,
            "project_storage": self.project_storage,
            "max_schedule": self.max_schedule,
            "image": self.image,
            "shm": given(self.shm),
            "cmd": self.cmd,
            "env": text_mapping(self.env),
            "elastic": is_on(self.elastic),
            "grace_seconds": given(self.grace_seconds),
            "time_limit_seconds": limit_seconds(self.time_limit),
            "after": self.after or (),
            "after_any": self.after_any or (),
            "labels": text_mapping(self.labels),
        }
