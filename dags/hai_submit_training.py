"""The web submission page: trigger this DAG from the Airflow UI; its form has the platform's fields."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import pendulum
from airflow.sdk import DAG, Param, task
from pydantic import ValidationError

from hai_airflow.client import HaiError
from hai_airflow.hooks.hai import DEFAULT_CONN_ID, HaiHook
from hai_airflow.operators.distributed import HaiDistributedTrainingOperator
from hai_airflow.operators.job import processes_field
from hai_airflow.operators.standalone import HaiStandaloneTrainingOperator
from hai_airflow.spec import (
    MAX_GIT_BRANCH_CHARS,
    MAX_SCHEDULE_CHOICES,
    MAX_SHM_MB,
    PROCESSES_HELP,
    DistributedJobSpec,
    ResourcePackageView,
    StandaloneJobSpec,
)

FORM_TIMEOUT_S = 2.0
"""How long building the form may wait for the hai server: the DAG file is parsed often."""
DISTRIBUTED = "分布式训练 Distributed (multi-machine)"
STORAGE_PATTERN = r"^\s*(\d+\s*(,\s*\d+\s*)*)?$"


class ServerChoices(NamedTuple):
    """What the form offers from the hai server, or why it could not ask."""

    packages: tuple[ResourcePackageView, ...] = ()
    quota: str | None = None
    unreachable: str | None = None


def _left(used: int, limit: int | None) -> str:
    return "unlimited" if limit is None else f"{max(limit - used, 0)} of {limit} GPUs"


def quota_text(check: dict[str, Any], who: dict[str, Any]) -> str:
    """The remaining high-priority quota of the connection's user, from the server's check of 0 GPUs."""
    mine = _left(check["user_used"], check["user_limit"])
    group = _left(check["group_used"], check["group_limit"])
    return (
        f"High-priority quota left when this form was built: {who['user']} {mine}, group {who['group']} "
        f"{group}. A submission counts against the quota of whoever triggers it."
    )


def server_choices(conn_id: str = DEFAULT_CONN_ID, timeout: float = FORM_TIMEOUT_S) -> ServerChoices:
    """The packages and quota the connection's server offers now; never raises, never waits long."""
    hook = HaiHook(conn_id, timeout=timeout)
    try:
        client = hook.get_conn()
        packages = tuple(p for p in client.resource_packages() if p.gpus > 0)
        try:
            quota = quota_text(client.check_high_priority(0), client.whoami())
        except HaiError:
            quota = None
        return ServerChoices(packages=packages, quota=quota)
    # At parse time any failure (no connection, server down, a refusal) must leave a usable form.
    except Exception as e:
        return ServerChoices(unreachable=e.message if isinstance(e, HaiError) else f"{type(e).__name__}: {e}")
    finally:
        hook.close()


def package_param(choices: ServerChoices, title: str, largest: bool = False, **extra: Any) -> Param:
    """A dropdown of the server's GPU packages, or a plain id field saying why there is none."""
    if not choices.packages:
        return Param(
            type="integer",
            minimum=0,
            title=title,
            description=f"The hai server could not be reached when this form was built "
            f"({choices.unreachable}), so there is no list: type a package id from `hai res`.",
            **extra,
        )
    packages = sorted(choices.packages, key=lambda p: (p.gpus, p.id))
    return Param(
        (packages[-1] if largest else packages[0]).id,
        type="integer",
        enum=[p.id for p in packages],
        values_display={
            str(p.id): f"{p.name}: {p.gpus} x {p.gpu_type}, {p.cpus:g} CPUs, {p.memory_gb:g} GB ({p.id})"
            for p in packages
        },
        title=title,
        description="Resource packages of the hai server (`hai res`).",
        **extra,
    )


def gpu_type_param(packages: Sequence[ResourcePackageView]) -> Param:
    types = sorted({p.gpu_type for p in packages})
    if not types:
        return Param("", type="string", title="GPU类型 GPU type", description="Empty = the package's type.")
    return Param(
        "",
        type="string",
        enum=["", *types],
        values_display={"": "资源组的 The package's", **{t: t for t in types}},
        title="GPU类型 GPU type",
    )


def max_schedule_param(quota: str | None) -> Param:
    description = (
        "0 = low priority (may be suspended for high-priority jobs); more = high priority, "
        "allowed only within your and your group's quota, else the submission is refused."
    )
    return Param(
        0,
        type="integer",
        enum=list(MAX_SCHEDULE_CHOICES),
        values_display={
            str(h): "0: 低优先级 Low priority" if h == 0 else f"{h} h: 高优先级 High priority"
            for h in MAX_SCHEDULE_CHOICES
        },
        title="期望排队时长 Expected queueing (max_schedule)",
        description=f"{description} {quota}" if quota else description,
    )


choices = server_choices()

with DAG(
    dag_id="hai_submit_training",
    description="Submit a standalone or distributed training job to HAI (托管训练: Web页面提交).",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["hai", "submit"],
    params={
        "task_name": Param("hai-test", type="string", minLength=1, maxLength=200, title="任务名称 Task name"),
        "mode": Param(
            "standalone",
            type="string",
            enum=["standalone", "distributed"],
            values_display={"standalone": "单机训练 Standalone", "distributed": "分布式训练 Distributed"},
            title="模式 Mode",
        ),
        "max_schedule": max_schedule_param(choices.quota),
        "image": Param("local", type="string", minLength=1, title="镜像 Image"),
        "resource_pkg": package_param(choices, "资源组 Resource package"),
        "gpu_type": gpu_type_param(choices.packages),
        "code_src": Param(
            "nas",
            type="string",
            enum=["nas", "git"],
            values_display={"nas": "个人存储 NAS", "git": "git仓库 Git"},
            title="代码来源 Code source",
        ),
        "code_path": Param(
            "/workspace/nas-data",
            type="string",
            minLength=1,
            title="代码地址 Code path",
            description="The job starts cd'd here (a NAS directory, or the git repository).",
        ),
        "git_branch": Param(
            "",
            type="string",
            maxLength=MAX_GIT_BRANCH_CHARS,
            title="git分支 Git branch",
            description="Only with code source git; empty = the repository's default branch.",
        ),
        "cmd": Param("python3 train.py", type="string", minLength=1, title="训练启动命令 Start command"),
        "model_dir": Param(
            "",
            type="string",
            title="模型目录 Model dir",
            description="Where the job saves checkpoints (HAI_MODEL_DIR); empty = a directory of its own.",
        ),
        "project_storage": Param(
            "",
            type="string",
            pattern=STORAGE_PATTERN,
            title="项目存储 Project storages",
            description="Project storage ids to mount, comma-separated, e.g. 10111,10222.",
        ),
        "shm": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            maximum=MAX_SHM_MB,
            title="共享内存 Shared memory (MB)",
            description="Empty = the backend's default.",
        ),
        "processes": Param(
            None,
            type=["null", "string"],
            enum=[None, "per-gpu", "per-worker"],
            values_display={
                None: "默认 Default for the mode (distributed: per-gpu, standalone: per-worker)",
                "per-gpu": "每个GPU一个进程 One per GPU (Horovod ranks, no launcher)",
                "per-worker": "每个worker一个进程 One per worker (torchrun, horovodrun, mpirun)",
            },
            title="进程数 Processes",
            description=PROCESSES_HELP,
        ),
        "workers": Param(
            2, type="integer", minimum=1, maximum=1024, title="worker数目 Workers", section=DISTRIBUTED
        ),
        "worker_image": Param(
            "",
            type="string",
            title="worker镜像 Worker image",
            description="Must support Horovod; empty = the image above.",
            section=DISTRIBUTED,
        ),
        "worker_resource_pkg": package_param(
            choices, "worker资源组 Worker resource package", largest=True, section=DISTRIBUTED
        ),
    },
) as dag:

    @task.branch
    def check_form(params: dict[str, Any] | None = None) -> str:
        """Validate the form as the platform would, naming the field to fix; pick the submit task."""
        form = dict(params or {})
        common = {
            "task_name": form["task_name"],
            "max_schedule": form["max_schedule"],
            "image": form["image"],
            "code_src": form["code_src"],
            "code_path": form["code_path"],
            "git_branch": form["git_branch"] or None,
            "cmd": form["cmd"],
            "model_dir": form["model_dir"] or None,
            "project_storage": form["project_storage"],
            "shm": form["shm"],
            "gpu_type": form["gpu_type"] or None,
            **processes_field(form.get("processes")),
        }
        try:
            if form["mode"] == "distributed":
                DistributedJobSpec(
                    **common,
                    workers=form["workers"],
                    worker_image=form["worker_image"] or None,
                    worker_resource_pkg=form["worker_resource_pkg"],
                )
                return "submit_distributed"
            StandaloneJobSpec(**common, resource_pkg=form["resource_pkg"])
            return "submit_standalone"
        except ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(map(str, err['loc'])) or 'form'}: {str(err['msg']).removeprefix('Value error, ')}"
                for err in e.errors()
            )
            raise ValueError(f"the form is not valid: {problems}") from None

    common_args: dict[str, Any] = {
        "task_name": "{{ params.task_name }}",
        "max_schedule": "{{ params.max_schedule }}",
        "image": "{{ params.image }}",
        "code_src": "{{ params.code_src }}",
        "code_path": "{{ params.code_path }}",
        "git_branch": "{{ params.git_branch }}",
        "cmd": "{{ params.cmd }}",
        "model_dir": "{{ params.model_dir }}",
        "project_storage": "{{ params.project_storage }}",
        # None (an empty optional field) would render as the text "None".
        "shm": "{{ params.shm or '' }}",
        "gpu_type": "{{ params.gpu_type }}",
        "processes": "{{ params.processes or '' }}",
        # A web submission beyond quota is refused in the task log, never queued or downgraded silently.
        "on_over_quota": "fail",
    }
    submit_standalone = HaiStandaloneTrainingOperator(
        task_id="submit_standalone", resource_pkg="{{ params.resource_pkg }}", **common_args
    )
    submit_distributed = HaiDistributedTrainingOperator(
        task_id="submit_distributed",
        workers="{{ params.workers }}",
        worker_image="{{ params.worker_image }}",
        worker_resource_pkg="{{ params.worker_resource_pkg }}",
        **common_args,
    )
    check_form() >> [submit_standalone, submit_distributed]
