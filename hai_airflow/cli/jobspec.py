"""Job flags `hai create` and the `hai submit` commands share, declared once; their conversion to a spec."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, get_args

import typer
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from hai_airflow.cli.flags import choice, completes
from hai_airflow.cli.output import usage_error
from hai_airflow.spec import (
    MAX_SCHEDULE_CHOICES,
    PROCESSES_HELP,
    CpuJobSpec,
    DistributedJobSpec,
    JobSpec,
    Mode,
    Processes,
    StandaloneJobSpec,
)

REQUIRED: Any = ...
"""Default of a required flag (typer reads `...` as required); lets `hai create --help` list flags in
the platform document's order, where required and optional flags alternate."""

MAX_SCHEDULE_METAVAR = "[" + "|".join(str(c) for c in MAX_SCHEDULE_CHOICES) + "]"

SPEC_MODELS: dict[str, type[BaseModel]] = {
    "cpu": CpuJobSpec,
    "standalone": StandaloneJobSpec,
    "distributed": DistributedJobSpec,
}

# The help texts pair an English explanation with the platform document's own words.
ModelIdOption = Annotated[
    int | None,
    typer.Option(
        "--model-id",
        metavar="INTEGER",
        help="Model id, shown under <模型训练> on the web page. 模型ID，请从页面上的<模型训练>下查看ID",
    ),
]
ProjectIdOption = Annotated[
    int | None,
    typer.Option(
        "--project-id",
        metavar="INTEGER",
        help="Project id, shown under <我的项目> on the web page. 项目ID，请从页面上的<我的项目>下查看",
    ),
]
CodeSrcOption = Annotated[
    str,
    typer.Option(
        "--code-src",
        metavar="[nas|git]",
        help="Where the code is: nas (a directory on shared storage) or git (a repository). 代码位置",
    ),
]
GitBranchOption = Annotated[
    str | None,
    typer.Option(
        "--git-branch",
        metavar="TEXT",
        help="[optional] Git branch to check out, with --code-src git. "
        "[可选] 代码git分支 (如果代码位置为git)",
    ),
]
ModelDirOption = Annotated[
    str | None,
    typer.Option(
        "--model-dir",
        metavar="TEXT",
        help="[optional] Where the job saves its model and checkpoints (the job sees it as HAI_MODEL_DIR). "
        "[可选] 模型保存路径",
    ),
]
ProjectStorageOption = Annotated[
    str | None,
    typer.Option(
        "--project-storage",
        metavar="TEXT",
        help="[optional] Project storage to mount: project ids, comma-separated. "
        "[可选] 待挂载项目存储，填写项目ID，多个请用逗号分割. eg: 10111,10222",
    ),
]
MaxScheduleOption = Annotated[
    int,
    typer.Option(
        "--max-schedule",
        metavar=MAX_SCHEDULE_METAVAR,
        help="Expected queueing time in hours: 0 = low priority (may be suspended), more than 0 = high "
        "priority (within your quota). 期望等待时长. 等于0为低优任务，大于0为高优任务，单位为h",
    ),
]
ShmOption = Annotated[
    int | None,
    typer.Option(
        "--shm", metavar="INTEGER", help="[optional] Shared memory in MB. [可选] 共享内存, 单位为MB"
    ),
]
GpuTypeOption = Annotated[
    str | None,
    typer.Option(
        "--gpu-type",
        metavar="TEXT",
        help="GPU type (V100, A100, P100, T4...). Default: the resource package's. GPU类型",
    ),
]
ElasticOption = Annotated[
    bool,
    typer.Option(
        "--elastic",
        help="Elastic job (EFDL style): on suspension it is told to save (HAI_PREEMPT_NOTICE) and exit, "
        "instead of being killed.",
    ),
]
GraceOption = Annotated[
    int | None,
    typer.Option(
        "--grace",
        metavar="SECONDS",
        help="Seconds between the save notice and the kill on suspension. "
        "Default: 60 with --elastic, else 0.",
    ),
]
PROCESSES_CHOICES: tuple[Processes, ...] = get_args(Processes)
ProcessesOption = Annotated[
    str | None,
    typer.Option(
        "--processes",
        metavar="[" + "|".join(PROCESSES_CHOICES) + "]",
        parser=choice(*PROCESSES_CHOICES),
        autocompletion=completes(*PROCESSES_CHOICES),
        help=f"{PROCESSES_HELP} Default: per-gpu for distributed jobs, per-worker for standalone ones.",
        show_default=False,
    ),
]
EnvOption = Annotated[
    list[str] | None,
    typer.Option("--env", metavar="KEY=VALUE", help="Extra environment variable for the job; repeatable."),
]
ClientKeyOption = Annotated[
    str | None,
    typer.Option(
        "--client-key",
        metavar="TEXT",
        help="Idempotency key: submitting again with the same key returns the first job instead of a "
        "second one (useful when the submitting stage itself may be retried).",
    ),
]


def parse_env(pairs: Sequence[str] | None) -> dict[str, str]:
    """`--env KEY=VALUE` flags as a mapping."""
    env: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            usage_error(f"--env {pair!r} is not KEY=VALUE. Write it like --env LR=0.1")
        env[key] = value
    return env


def join_command(words: Sequence[str]) -> str:
    """One quoted string stays as written; several words are joined as the shell would read them."""
    if len(words) == 1:
        return words[0]
    return shlex.join(words)


def build_spec(mode: Mode, fields: Mapping[str, Any], flags: Mapping[str, str], command: str) -> JobSpec:
    """Validate the flags once; the first problem becomes one line naming the flag as the user typed it.

    :param mode: cpu, standalone or distributed.
    :param fields: spec field -> value; None means "not given", so the spec's default applies.
    :param flags: spec field -> flag name where it is not `--field-name` (e.g. `task_name` -> `--name`).
    :param command: the command, for the help hint (`create`, `submit standalone`).
    """
    data = {key: value for key, value in fields.items() if value is not None}
    data = absolute_code_path(data)
    try:
        spec: JobSpec = SPEC_MODELS[mode].model_validate({**data, "mode": mode})  # type: ignore[assignment]
    except ValidationError as error:
        problem = describe_error(error.errors()[0], flags, mode)
        usage_error(f"{problem}. See `hai {command} --help`")
    return spec


def absolute_code_path(data: dict[str, Any]) -> dict[str, Any]:
    """A relative NAS code path means the directory as seen from here, as `cd` would read it.

    The server accepts only absolute paths; a git URL is not a path and stays as written.
    """
    path = data.get("code_path")
    if data.get("code_src", "nas") != "nas" or not isinstance(path, str) or not path or os.path.isabs(path):
        return data
    return {**data, "code_path": os.path.abspath(os.path.expanduser(path))}


def flag_for(field: str, flags: Mapping[str, str]) -> str:
    """The flag a user types for a spec field."""
    return flags.get(field, "--" + field.replace("_", "-"))


def describe_error(error: ErrorDetails, flags: Mapping[str, str], mode: str) -> str:
    """One pydantic error in the user's words: flags instead of field names."""
    field = str(error["loc"][0]) if error["loc"] else None
    if field is not None and error["type"] == "missing":
        return f"{flag_for(field, flags)} is required for a {mode} task"
    if field is not None and error["type"] == "extra_forbidden":
        return f"{flag_for(field, flags)} is not valid for a {mode} task"
    message = _name_flags(error["msg"].removeprefix("Value error, "), flags, mode)
    if field is None:
        return message
    flag = flag_for(field, flags)
    if flag in message:
        return message
    return f"{flag}: {message[:1].lower()}{message[1:]}"


def _name_flags(message: str, flags: Mapping[str, str], mode: str) -> str:
    # The spec's own messages name fields (`max_schedule must be...`, "`git_branch` is only valid...").
    for field in SPEC_MODELS[mode].model_fields:
        flag = flag_for(field, flags)
        message = message.replace(f"`{field}`", flag)
        if "_" in field:
            message = re.sub(rf"\b{field}\b", flag, message)
    return message


@dataclass(frozen=True)
class JobFlags:
    """The job flags `hai create` and every `hai submit` command share."""

    model_id: ModelIdOption = None
    project_id: ProjectIdOption = None
    code_src: CodeSrcOption = "nas"
    git_branch: GitBranchOption = None
    model_dir: ModelDirOption = None
    project_storage: ProjectStorageOption = None
    max_schedule: MaxScheduleOption = 0
    shm: ShmOption = None
    env: EnvOption = None

    def fields(self) -> dict[str, Any]:
        """These flags as spec fields (None = not given, so the spec's default applies)."""
        return {
            "model_id": self.model_id,
            "project_id": self.project_id,
            "code_src": self.code_src,
            "git_branch": self.git_branch,
            "model_dir": self.model_dir,
            "project_storage": self.project_storage,
            "max_schedule": self.max_schedule,
            "shm": self.shm,
            "env": parse_env(self.env),
        }


@dataclass(frozen=True)
class GpuJobFlags:
    """The flags only GPU jobs take (a CPU stage has no such option): how many processes run the
    command, and how the job is suspended (`--elastic`, `--grace`)."""

    processes: ProcessesOption = None
    elastic: ElasticOption = False
    grace: GraceOption = None

    def fields(self) -> dict[str, Any]:
        """These flags as spec fields (None = not given, so the spec's default for the mode applies)."""
        return {"processes": self.processes, "elastic": self.elastic, "grace_seconds": self.grace}


@dataclass(frozen=True)
class SubmitFlags:
    """What every submitting command does after validating the job: idempotency and waiting."""

    client_key: ClientKeyOption = None
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="After submitting, wait for the task to end; the exit code is its outcome, as with "
            "`hai wait` (0 succeeded, 1 failed or cancelled, 124 --wait-timeout passed).",
        ),
    ] = False
    wait_timeout: Annotated[
        float | None,
        typer.Option(
            "--wait-timeout",
            metavar="SECONDS",
            min=0,
            help="With --wait: give up waiting after this many seconds (the task keeps running).",
            show_default=False,
        ),
    ] = None
