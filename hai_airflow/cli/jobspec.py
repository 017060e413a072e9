"""Job flags `hai create` and the `hai submit` commands share, declared once; their conversion to a spec.

The flags are built from `vocabulary` alone; the spec's models and the job-file reader load when a job
is first converted."""

from __future__ import annotations

import functools
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, get_args

import typer

from hai_airflow import arrays, durations
from hai_airflow import labels as label_rules
from hai_airflow.cli.flags import choice, completes
from hai_airflow.cli.output import error_line, note, usage_error
from hai_airflow.vocabulary import MAX_SCHEDULE_CHOICES, PROCESSES_HELP, Processes

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError
    from pydantic_core import ErrorDetails

    from hai_airflow.jobfile import Document
    from hai_airflow.spec import JobSpec, Mode

MAX_SCHEDULE_METAVAR = "[" + "|".join(str(c) for c in MAX_SCHEDULE_CHOICES) + "]"


@functools.cache
def spec_models() -> dict[str, type[BaseModel]]:
    """The spec's model of each mode, imported when a command first checks a job."""
    from hai_airflow.spec import CpuJobSpec, DistributedJobSpec, StandaloneJobSpec

    return {"cpu": CpuJobSpec, "standalone": StandaloneJobSpec, "distributed": DistributedJobSpec}


def __getattr__(name: str) -> Any:
    # `SPEC_MODELS` reads as a constant, yet the models load only when first read.
    if name == "SPEC_MODELS":
        return spec_models()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


FLAG_SPELLINGS = {"name": "task-name", "code-dir": "code-path"}
"""The platform document spells these flags twice: `hai create --task-name --code-path --image` and
`hai submit standalone --name --code-dir --worker-image`. The first spelling, the spec's field names,
is the one every job command lists; the second (left) is accepted by every job command unlisted."""


def _accepting(spellings: Mapping[str, str]) -> dict[str, Any]:
    """A command's context settings that read each spelling on the left as the flag on the right."""
    return {"token_normalize_func": lambda name: spellings.get(name, name)}


JOB_COMMAND = _accepting(FLAG_SPELLINGS)
"""`hai create` and `hai submit distributed`, where --worker-image is a flag of its own."""
ONE_WORKER_COMMAND = _accepting({**FLAG_SPELLINGS, "worker-image": "image"})
"""`hai submit standalone` and `hai submit cpu`: a task of one worker, whose image is --image."""

# The help texts pair an English explanation with the platform document's own words.
TaskNameOption = Annotated[
    str | None,
    typer.Option(
        "--task-name", metavar="TEXT", help="Task name; Chinese and English both work. 任务名称，支持中英文"
    ),
]
CodePathOption = Annotated[
    str | None,
    typer.Option(
        "--code-path",
        metavar="TEXT",
        help="Code directory (the job starts cd'd there) or git repository. 代码路径",
    ),
]
ImageOption = Annotated[
    str | None,
    typer.Option(
        "--image",
        metavar="TEXT",
        help="Docker image of the job. Default: local (run without a container). docker镜像地址",
    ),
]
WorkerImageOption = Annotated[
    str | None,
    typer.Option(
        "--worker-image",
        metavar="TEXT",
        help="Distributed: the image of each worker (it must have Horovod); default: --image. Standalone: "
        "another name for --image. worker镜像",
    ),
]
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
AfterOption = Annotated[
    str | None,
    typer.Option(
        "--after",
        metavar="IDS",
        help="[optional] Start only after these tasks succeeded (comma-separated ids, like Slurm's "
        "--dependency=afterok); cancelled if one of them ends otherwise.",
    ),
]
AfterAnyOption = Annotated[
    str | None,
    typer.Option(
        "--after-any",
        metavar="IDS",
        help="[optional] Start only after these tasks ended, however they ended (afterany).",
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
MinWorkersOption = Annotated[
    int | None,
    typer.Option(
        "--min-workers",
        metavar="INTEGER",
        help="[optional] Distributed only: makes the task resizable. Rather than suspend it, a "
        "high-priority task may shrink it by whole workers down to this many; it grows back to --workers "
        "when GPUs free. Each resize is a save on the notice and a restart at the new size from that "
        "checkpoint (implies --elastic).",
        show_default=False,
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


def duration_seconds(value: str) -> int:
    """A duration flag's value in seconds (`4h`, `90m`, `1:30:00`); a refusal that shows the forms."""
    try:
        return durations.parse(value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


TimeLimitOption = Annotated[
    int | None,
    typer.Option(
        "--time-limit",
        metavar="DURATION",
        parser=duration_seconds,
        help="[optional] Run time allowed over all runs (4h, 90m, 2d, 1:30:00); suspended time does "
        "not count. At the limit the task gets the save notice and its grace, then ends TIMEOUT.",
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
LabelOption = Annotated[
    list[str] | None,
    typer.Option(
        "--label",
        metavar="KEY=VALUE",
        help="A label to find the task by (`hai task -l team=vision`); repeatable.",
    ),
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


def parse_labels(pairs: Sequence[str] | None) -> dict[str, str] | None:
    """`--label KEY=VALUE` flags as labels (None: none given)."""
    if not pairs:
        return None
    try:
        return label_rules.parse_pairs(list(pairs))
    except ValueError as error:
        usage_error(f"--label: {error}. Write it like --label team=vision")


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
    from pydantic import ValidationError

    data = {key: value for key, value in fields.items() if value is not None}
    data = absolute_code_path(data)
    try:
        spec: JobSpec = spec_models()[mode].model_validate({**data, "mode": mode})  # type: ignore[assignment]
    except ValidationError as error:
        problem = describe_error(error.errors()[0], flags, mode)
        usage_error(f"{problem}. See `hai {command} --help`")
    return spec


def image_fields(mode: Mode, image: str | None, worker_image: str | None) -> dict[str, Any]:
    """--image and --worker-image as spec fields: a distributed task's workers run --worker-image, else
    --image; a CPU or standalone task has one worker, so there --worker-image is its --image."""
    if mode == "distributed":
        return {"image": image or worker_image, "worker_image": worker_image}
    if image and worker_image and image != worker_image:
        usage_error(
            f"--image {image} and --worker-image {worker_image} name two images for a {mode} task, which "
            "runs one. Give only one of them"
        )
    return {"image": image or worker_image}


def spec_from_file(text: str, source: str) -> JobSpec:
    """A job file's spec, checked by the models the server uses; each problem is an `Error:` line
    naming the field and its line in the file (exit 2), and nothing is submitted.

    :param text: the file: YAML, or JSON, which YAML reads too.
    :param source: its name in messages (the path, or `<stdin>`).
    """
    from pydantic import ValidationError

    from hai_airflow.jobfile import YamlProblem, read_yaml

    models = spec_models()
    try:
        document = read_yaml(text)
    except YamlProblem as unreadable:
        usage_error(_at(source, unreadable.line, unreadable.message))
    data = document.data
    if not isinstance(data, dict):
        found = "nothing" if data is None else f"a {type(data).__name__}"
        usage_error(
            f"{source} holds {found}; a job file maps the spec's fields to values (task_name: train, "
            "mode: standalone, ...). `hai task N -o yaml` prints one to start from"
        )
    mode = data.get("mode")
    if not (isinstance(mode, str) and mode in models):
        given = "is required" if mode is None else f"is {mode!r}"
        where = document.line_of(("mode",))
        usage_error(_at(source, where, f"mode {given}; it must be one of {', '.join(models)}"))
    try:
        spec: JobSpec = models[mode].model_validate(absolute_code_path(data))  # type: ignore[assignment]
    except ValidationError as error:
        *first, last = _file_problems(error, document, source, mode)
        for problem in first:
            note(error_line(problem))
        usage_error(last)
    return spec


def _file_problems(error: ValidationError, document: Document, source: str, mode: str) -> list[str]:
    """Each problem in the file's words (its field names), in the order of the file's lines."""
    names = {str(name): str(name) for name in (*spec_models()[mode].model_fields, *document.data)}
    found = [(document.line_of(e["loc"]), describe_error(e, names, mode)) for e in error.errors()]
    found.sort(key=lambda problem: problem[0] or 0)
    return [_at(source, line, message) for line, message in found]


def _at(source: str, line: int | None, message: str) -> str:
    return f"{source} line {line}: {message}" if line is not None else f"{source}: {message}"


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
        return _not_for_mode(field, flags, mode)
    message = _name_flags(error["msg"].removeprefix("Value error, "), flags, mode)
    fix = (error.get("ctx") or {}).get("fix")
    if isinstance(fix, str):
        message = f"{message}. {_name_flags(fix, flags, mode)}"
    if field is None:
        return message
    flag = flag_for(field, flags)
    if flag in message:
        return message
    return f"{flag}: {message[:1].lower()}{message[1:]}"


def _not_for_mode(field: str, flags: Mapping[str, str], mode: str) -> str:
    """A field the mode does not take; a distributed task's own fields say how to get one."""
    flag = flag_for(field, flags)
    if field not in spec_models()["distributed"].model_fields:
        return f"{flag} is not valid for a {mode} task"
    return (
        f"{flag} is not valid for a {mode} task: only a distributed task takes it. Leave out {flag}, "
        f"or make the task distributed ({flag_for('mode', flags)} distributed)"
    )


def _name_flags(message: str, flags: Mapping[str, str], mode: str) -> str:
    # The spec's own messages name fields (`max_schedule must be...`, "`git_branch` is only valid...").
    for field in spec_models()[mode].model_fields:
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
    time_limit: TimeLimitOption = None
    after: AfterOption = None
    after_any: AfterAnyOption = None
    label: LabelOption = None

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
            "time_limit_seconds": self.time_limit,
            "after": self.after,
            "after_any": self.after_any,
            "labels": parse_labels(self.label),
        }


@dataclass(frozen=True)
class GpuJobFlags:
    """The flags only GPU jobs take (a CPU stage has no such option): how many processes run the
    command, and how the job is suspended (`--elastic`, `--grace`)."""

    processes: ProcessesOption = None
    elastic: ElasticOption = False
    grace: GraceOption = None

    def fields(self) -> dict[str, Any]:
        """These flags as spec fields (None = not given, so the spec's default for the mode applies:
        without --elastic, a task with --min-workers is elastic, any other is not)."""
        return {"processes": self.processes, "elastic": self.elastic or None, "grace_seconds": self.grace}


def array_text(value: str) -> str:
    """An --array value, checked here so that a bad one is a usage error before anything is sent."""
    try:
        arrays.parse(value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    return value


@dataclass(frozen=True)
class SubmitFlags:
    """What every submitting command does after validating the job: idempotency and waiting."""

    client_key: ClientKeyOption = None
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="After submitting, wait for the task to end; the exit code is its outcome, as with "
            "`hai wait` (0 succeeded, 1 failed, cancelled or TIMEOUT, 124 --wait-timeout passed).",
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
    array: Annotated[
        str | None,
        typer.Option(
            "--array",
            metavar="INDICES",
            parser=array_text,
            help="One task per index, like Slurm's --array: 0-9, 0-15:4 or 1,3,5; %K runs at most K at "
            "once (0-9%2). Each task sees HAI_ARRAY_INDEX; `hai cancel` of the array's id (its first "
            "task's) cancels them all.",
        ),
    ] = None
