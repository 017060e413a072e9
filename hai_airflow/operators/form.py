"""The web submission form (`hai_submit_training`): its fields as Airflow Params, and its checks.

Airflow's trigger form treats a field whose schema type does not allow ``null`` as required and an
empty value as missing, so every optional field here allows ``null`` and defaults to ``None``; a
select's "default" choice is ``None`` too. Rules that depend on another field (workers only for a
distributed job, a git branch only with git) cannot be said in one field's schema: `spec_from_form`
checks them when the run starts and names the field and the fix in the task log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from airflow.sdk import Param
from pydantic import ValidationError

from hai_airflow import durations
from hai_airflow.client import HaiError
from hai_airflow.hooks.hai import DEFAULT_CONN_ID, HaiHook
from hai_airflow.spec import (
    MAX_GIT_BRANCH_CHARS,
    MAX_SCHEDULE_CHOICES,
    MAX_SHM_MB,
    PROCESSES_HELP,
    CpuJobSpec,
    DistributedJobSpec,
    JobSpec,
    ResourcePackageView,
    StandaloneJobSpec,
)

FORM_TIMEOUT_S = 2.0
"""How long building the form may wait for the hai server: the DAG file is parsed often."""
DISTRIBUTED = "分布式训练 Distributed (multi-machine)"
CPU = "CPU任务 CPU job"
STORAGE_PATTERN = r"^\s*(\d+\s*(,\s*\d+\s*)*)?$"
MODES = {
    "standalone": "单机训练 Standalone",
    "distributed": "分布式训练 Distributed",
    "cpu": "CPU任务 CPU job",
}
TITLES = {
    "task_name": "任务名称 Task name",
    "mode": "模式 Mode",
    "max_schedule": "期望排队时长 Expected queueing (max_schedule)",
    "image": "镜像 Image",
    "resource_pkg": "资源组 Resource package",
    "gpu_type": "GPU类型 GPU type",
    "code_src": "代码来源 Code source",
    "code_path": "代码地址 Code path",
    "git_branch": "git分支 Git branch",
    "cmd": "训练启动命令 Start command",
    "model_dir": "模型目录 Model dir",
    "project_storage": "项目存储 Project storages",
    "shm": "共享内存 Shared memory (MB)",
    "processes": "进程数 Processes",
    "workers": "worker数目 Workers",
    "min_workers": "最少worker数 Min workers (resizable)",
    "worker_image": "worker镜像 Worker image",
    "worker_resource_pkg": "worker资源组 Worker resource package",
    "cpus": "CPU核数 CPU cores",
    "time_limit": "运行时限 Time limit",
    "memory_gb": "内存 Memory (GB)",
}
"""Each field's label: the platform document's Chinese, then English; errors quote them."""


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


def optional(default: Any, kind: str, name: str, description: str, **schema: Any) -> Param:
    """A field the browser lets stay empty (None): its type allows null."""
    return Param(default, type=["null", kind], title=TITLES[name], description=description, **schema)


def package_param(choices: ServerChoices, name: str, largest: bool = False, **extra: Any) -> Param:
    """A dropdown of the server's GPU packages, or a plain id field saying why there is none."""
    use = "Ignored for a CPU job." if name == "resource_pkg" else "Only for a distributed job."
    if not choices.packages:
        return optional(
            None,
            "integer",
            name,
            f"The hai server could not be reached when this form was built ({choices.unreachable}), so "
            f"there is no list: type a package id from `hai res`. {use}",
            minimum=0,
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
        title=TITLES[name],
        description=f"Resource packages of the hai server (`hai res`). {use}",
        **extra,
    )


def gpu_type_param(packages: Sequence[ResourcePackageView]) -> Param:
    types = sorted({p.gpu_type for p in packages})
    if not types:
        return optional(None, "string", "gpu_type", "Empty = the package's type.")
    return optional(
        None,
        "string",
        "gpu_type",
        "Default: the package's type.",
        enum=[None, *types],
        values_display={None: "资源组的 The package's", **{t: t for t in types}},
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
        title=TITLES["max_schedule"],
        description=f"{description} {quota}" if quota else description,
    )


def form_params(choices: ServerChoices) -> dict[str, Param]:
    """The form's fields, in the platform document's order; only what every job needs is required."""
    return {
        "task_name": Param("hai-test", type="string", minLength=1, maxLength=200, title=TITLES["task_name"]),
        "mode": Param(
            "standalone", type="string", enum=list(MODES), values_display=MODES, title=TITLES["mode"]
        ),
        "max_schedule": max_schedule_param(choices.quota),
        "image": Param("local", type="string", minLength=1, title=TITLES["image"]),
        "resource_pkg": package_param(choices, "resource_pkg"),
        "gpu_type": gpu_type_param(choices.packages),
        "code_src": Param(
            "nas",
            type="string",
            enum=["nas", "git"],
            values_display={"nas": "个人存储 NAS", "git": "git仓库 Git"},
            title=TITLES["code_src"],
        ),
        "code_path": Param(
            "/workspace/nas-data",
            type="string",
            minLength=1,
            title=TITLES["code_path"],
            description="The job starts cd'd here (a NAS directory, or the git repository).",
        ),
        "git_branch": optional(
            None,
            "string",
            "git_branch",
            "Only with code source git; empty = the repository's default branch.",
            maxLength=MAX_GIT_BRANCH_CHARS,
        ),
        "cmd": Param("python3 train.py", type="string", minLength=1, title=TITLES["cmd"]),
        "model_dir": optional(
            None,
            "string",
            "model_dir",
            "Where the job saves checkpoints (HAI_MODEL_DIR); empty = a directory of its own.",
        ),
        "project_storage": optional(
            None,
            "string",
            "project_storage",
            "Project storage ids to mount, comma-separated, e.g. 10111,10222; empty = none.",
            pattern=STORAGE_PATTERN,
        ),
        "shm": optional(
            None, "integer", "shm", "Empty = the backend's default.", minimum=1, maximum=MAX_SHM_MB
        ),
        "time_limit": optional(
            None,
            "string",
            "time_limit",
            f"Empty = no limit. Run time allowed over all runs: {durations.FORMS}. At the limit the "
            "job gets the save notice and its grace, then ends TIMEOUT.",
        ),
        "processes": optional(
            None,
            "string",
            "processes",
            f"GPU jobs only. {PROCESSES_HELP}",
            enum=[None, "per-gpu", "per-worker"],
            values_display={
                None: "默认 Default for the mode (distributed: per-gpu, standalone: per-worker)",
                "per-gpu": "每个GPU一个进程 One per GPU (Horovod ranks, no launcher)",
                "per-worker": "每个worker一个进程 One per worker (torchrun, horovodrun, mpirun)",
            },
        ),
        "workers": optional(
            2,
            "integer",
            "workers",
            "Only for a distributed job.",
            minimum=1,
            maximum=1024,
            section=DISTRIBUTED,
        ),
        "min_workers": optional(
            None,
            "integer",
            "min_workers",
            "Only for a distributed job; empty = it never resizes. Rather than suspend it, a high-priority "
            "job may shrink it by whole workers down to this many; it grows back when GPUs free. Each "
            "resize is a save on the notice and a restart at the new size from that checkpoint.",
            minimum=1,
            maximum=1024,
            section=DISTRIBUTED,
        ),
        "worker_image": optional(
            None,
            "string",
            "worker_image",
            "Must support Horovod; empty = the image above. Only for a distributed job.",
            section=DISTRIBUTED,
        ),
        "worker_resource_pkg": package_param(
            choices, "worker_resource_pkg", largest=True, section=DISTRIBUTED
        ),
        "cpus": optional(
            None,
            "number",
            "cpus",
            f"Only for a CPU job; empty = {_default(CpuJobSpec, 'cpus')}.",
            exclusiveMinimum=0,
            maximum=1024,
            section=CPU,
        ),
        "memory_gb": optional(
            None,
            "number",
            "memory_gb",
            f"Only for a CPU job; empty = {_default(CpuJobSpec, 'memory_gb')} GB.",
            minimum=0,
            maximum=16384,
            section=CPU,
        ),
    }


def _default(model: type[CpuJobSpec], field: str) -> str:
    return f"{model.model_fields[field].default:g}"


class FormError(ValueError):
    """The form as filled in cannot make a job; the message names each field and its fix."""


def _needed(form: Mapping[str, Any], name: str, why: str) -> str | None:
    if form.get(name) not in (None, ""):
        return None
    return f"{name} ({TITLES[name]}): {why}"


def _distributed_only(form: Mapping[str, Any], name: str) -> str | None:
    """A field only a distributed job takes, filled in for another mode (a default left as it is, such
    as workers', is no mistake, so only fields that open empty are checked)."""
    if form.get(name) in (None, ""):
        return None
    return f"{name} ({TITLES[name]}): only a distributed job takes it; empty it, or pick mode distributed"


def _given(form: Mapping[str, Any], *names: str) -> dict[str, Any]:
    """The named fields the person filled in; an empty one is left to the spec's default."""
    return {n: form[n] for n in names if form.get(n) not in (None, "")}


def spec_from_form(form: Mapping[str, Any]) -> JobSpec:
    """The job the form describes, validated as the platform would.

    :raises FormError: a field is missing for the chosen mode or invalid; the message names it.
    """
    mode = form.get("mode") or "standalone"
    common = _given(
        form,
        "task_name",
        "max_schedule",
        "image",
        "code_src",
        "code_path",
        "git_branch",
        "cmd",
        "model_dir",
        "project_storage",
        "shm",
    )
    gpu = _given(form, "gpu_type", "processes")
    if mode == "distributed":
        missing = [
            _needed(form, "workers", "a distributed job needs its number of workers; fill it in"),
            _needed(form, "worker_resource_pkg", "a distributed job needs one worker's package; pick one"),
        ]
        model: type[JobSpec] = DistributedJobSpec
        fields = {
            **common,
            **gpu,
            **_given(form, "workers", "min_workers", "worker_image", "worker_resource_pkg"),
        }
    elif mode == "cpu":
        missing = [_distributed_only(form, "min_workers")]
        model = CpuJobSpec
        fields = {**common, **_given(form, "cpus", "memory_gb")}
    else:
        missing = [
            _needed(form, "resource_pkg", "a standalone job needs a resource package; pick one"),
            _distributed_only(form, "min_workers"),
        ]
        model = StandaloneJobSpec
        fields = {**common, **gpu, **_given(form, "resource_pkg")}
    problems = [m for m in missing if m]
    limit = form.get("time_limit")
    if limit not in (None, ""):
        try:
            fields["time_limit_seconds"] = durations.parse(str(limit))
        except ValueError as e:
            problems.append(f"time_limit ({TITLES['time_limit']}): {e}")
    if problems:
        raise FormError("the form is not valid: " + "; ".join(problems))
    try:
        return model.model_validate({**fields, "mode": mode})
    except ValidationError as e:
        raise FormError(
            "the form is not valid: " + "; ".join(_described(err) for err in e.errors())
        ) from None


def _described(err: Any) -> str:
    name = ".".join(map(str, err["loc"])) or "form"
    label = f" ({TITLES[name]})" if name in TITLES else ""
    fix = (err.get("ctx") or {}).get("fix")
    then = f" ({fix})" if isinstance(fix, str) else ""
    return f"{name}{label}: {str(err['msg']).removeprefix('Value error, ')}{then}"
