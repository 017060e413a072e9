"""Job flags `hai create` and the `hai submit` commands share, as typer options made from `flagtable`;
their conversion to a spec.

The flags are built from the table alone; the spec's models and the job-file reader load when a job
is first converted."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from hai_airflow import durations
from hai_airflow.cli import flagtable, jobfields
from hai_airflow.cli.flags import option
from hai_airflow.cli.output import error_line, note, usage_error

if TYPE_CHECKING:
    from pydantic import BaseModel
    from pydantic_core import ErrorDetails

    from hai_airflow.cli.jobkeys import FileValues
    from hai_airflow.jobfile import Document
    from hai_airflow.spec import JobSpec, Mode

MAX_SCHEDULE_METAVAR = flagtable.MAX_SCHEDULE_METAVAR
T = TypeVar("T")


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


FLAG_SPELLINGS = flagtable.FLAG_SPELLINGS


def _accepting(spellings: Mapping[str, str]) -> dict[str, Any]:
    """A command's context settings that read each spelling on the left as the flag on the right."""
    return {"token_normalize_func": lambda name: spellings.get(name, name)}


JOB_COMMAND = _accepting(FLAG_SPELLINGS)
"""`hai create` and `hai submit distributed`, where --worker-image is a flag of its own."""
ONE_WORKER_COMMAND = _accepting(flagtable.ONE_WORKER_SPELLINGS)
"""`hai submit standalone` and `hai submit cpu`: a task of one worker, whose image is --image."""

if TYPE_CHECKING:
    TaskNameOption = Any
    CodePathOption = Any
    ImageOption = Any
    WorkerImageOption = Any
    ModelIdOption = Any
    ProjectIdOption = Any
    CodeSrcOption = Any
    GitBranchOption = Any
    ModelDirOption = Any
    ProjectStorageOption = Any
    AfterOption = Any
    AfterAnyOption = Any
    MaxScheduleOption = Any
    ShmOption = Any
    GpuTypeOption = Any
    ElasticOption = Any
    MinWorkersOption = Any
    GraceOption = Any
    TimeLimitOption = Any
    ProcessesOption = Any
    EnvOption = Any
    LabelOption = Any
    ClientKeyOption = Any
    CpusOption = Any
    MemoryOption = Any
else:
    TaskNameOption = option(flagtable.TASK_NAME)
    CodePathOption = option(flagtable.CODE_PATH)
    ImageOption = option(flagtable.IMAGE)
    WorkerImageOption = option(flagtable.WORKER_IMAGE)
    ModelIdOption = option(flagtable.MODEL_ID)
    ProjectIdOption = option(flagtable.PROJECT_ID)
    CodeSrcOption = option(flagtable.CODE_SRC)
    GitBranchOption = option(flagtable.GIT_BRANCH)
    ModelDirOption = option(flagtable.MODEL_DIR)
    ProjectStorageOption = option(flagtable.PROJECT_STORAGE)
    AfterOption = option(flagtable.AFTER)
    AfterAnyOption = option(flagtable.AFTER_ANY)
    MaxScheduleOption = option(flagtable.MAX_SCHEDULE)
    ShmOption = option(flagtable.SHM)
    GpuTypeOption = option(flagtable.GPU_TYPE)
    ElasticOption = option(flagtable.ELASTIC)
    MinWorkersOption = option(flagtable.MIN_WORKERS)
    GraceOption = option(flagtable.GRACE)
    TimeLimitOption = option(flagtable.TIME_LIMIT)
    ProcessesOption = option(flagtable.PROCESSES)
    EnvOption = option(flagtable.ENV)
    LabelOption = option(flagtable.LABEL)
    ClientKeyOption = option(flagtable.CLIENT_KEY)
    CpusOption = option(flagtable.CPUS)
    MemoryOption = option(flagtable.MEMORY)
PROCESSES_CHOICES = flagtable.PROCESSES_CHOICES


def duration_seconds(value: str) -> int:
    """A duration flag's value in seconds (`4h`, `90m`, `1:30:00`); a refusal that shows the forms."""
    try:
        return durations.parse(value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


def checked(rule: Callable[..., T], *args: Any) -> T:
    """A rule of `jobfields`; its refusal is a usage error (exit 2) naming the flag."""
    try:
        return rule(*args)
    except ValueError as error:
        usage_error(str(error))


def parse_env(pairs: Sequence[str] | None) -> dict[str, str]:
    """`--env KEY=VALUE` flags as a mapping."""
    return checked(jobfields.parse_env, pairs)


def parse_labels(pairs: Sequence[str] | None) -> dict[str, str] | None:
    """`--label KEY=VALUE` flags as labels (None: none given)."""
    return checked(jobfields.parse_labels, pairs)


join_command = jobfields.join_command


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
    """--image and --worker-image as spec fields (`jobfields.image_fields`)."""
    return checked(jobfields.image_fields, mode, image, worker_image)


@dataclass(frozen=True)
class JobFile:
    """A job file's task, and the array it asks for (`array: 0-3%2`; None: one task)."""

    spec: JobSpec
    array: str | None


def spec_from_file(text: str, source: str) -> JobFile:
    """A job file's task: its keys are `hai create`'s flags (`jobkeys`), checked by the models the
    server uses; each problem is an `Error:` line naming the key and its line in the file (exit 2),
    and nothing is submitted.

    :param text: the file: YAML, or JSON, which YAML reads too.
    :param source: its name in messages (the path, or `<stdin>`).
    """
    from hai_airflow.cli import jobkeys

    document = _document(text, source)
    found = jobkeys.file_values(document.data)
    problems = [(document.line_of((key,)), message) for key, message in found.problems]
    mode = found.values["mode"]
    if mode is None and "mode" not in found.written:
        usage_error(_at(source, None, f"mode is required; it must be one of {', '.join(spec_models())}"))
    spec = None
    if mode is not None:
        try:
            fields = jobfields.create_fields(found.values)
        except ValueError as error:
            problems.append((None, str(error)))
        else:
            spec, refused = _checked_spec(mode, fields, document, _file_names(found))
            problems += refused
    if problems or spec is None:
        problems.sort(key=lambda problem: problem[0] or 0)
        *first, last = [_at(source, line, message) for line, message in problems]
        for problem in first:
            note(error_line(problem))
        usage_error(last)
    return JobFile(spec, found.values["array"])


def _document(text: str, source: str) -> Document:
    """The file read as YAML, holding a mapping; else exit 2 saying what it holds."""
    from hai_airflow.jobfile import YamlProblem, read_yaml

    try:
        document = read_yaml(text)
    except YamlProblem as unreadable:
        usage_error(_at(source, unreadable.line, unreadable.message))
    if not isinstance(document.data, dict):
        data = document.data
        found = "nothing" if data is None else f"a {type(data).__name__}"
        usage_error(
            f"{source} holds {found}; a job file maps `hai create`'s flags to values (task_name: train, "
            "mode: standalone, ...). `hai task N -o yaml` prints one to start from"
        )
    return document


def _file_names(found: FileValues) -> dict[str, str]:
    """Each spec field by the key that sets it, as the file wrote it."""
    from hai_airflow.cli import jobkeys

    names = {}
    for spec_field in {name for model in spec_models().values() for name in model.model_fields}:
        key = jobkeys.field_key(spec_field)
        names[spec_field] = found.written.get(key, key)
    if "worker_resource_pkg" not in found.written and "resource_pkg" in found.written:
        names["worker_resource_pkg"] = found.written["resource_pkg"]
    return names


def _checked_spec(
    mode: str, fields: Mapping[str, Any], document: Document, names: Mapping[str, str]
) -> tuple[JobSpec | None, list[tuple[int | None, str]]]:
    """The spec of the file's values, or the problems the mode's model finds, at their lines."""
    from pydantic import ValidationError

    data = absolute_code_path({key: value for key, value in fields.items() if value is not None})
    try:
        spec: JobSpec = spec_models()[mode].model_validate({**data, "mode": mode})  # type: ignore[assignment]
    except ValidationError as error:
        found = [(_line(document, e["loc"], names), describe_error(e, names, mode)) for e in error.errors()]
        return None, found
    return spec, []


def _line(document: Document, loc: Sequence[Any], names: Mapping[str, str]) -> int | None:
    """The line of an error's field in the file: the key that set it, then the rest of its path."""
    if not loc:
        return None
    return document.line_of((names.get(str(loc[0]), loc[0]), *loc[1:]))


def _at(source: str, line: int | None, message: str) -> str:
    return f"{source} line {line}: {message}" if line is not None else f"{source}: {message}"


absolute_code_path = jobfields.absolute_code_path


flag_for = jobfields.flag_for


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
    takers = [other for other, model in spec_models().items() if field in model.model_fields]
    if not takers:
        return f"{flag} is not valid for a {mode} task"
    return (
        f"{flag} is not valid for a {mode} task: only a {' or '.join(takers)} task takes it. Leave out "
        f"{flag}, or make the task {takers[0]} ({flag_for('mode', flags)} {takers[0]})"
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
        return checked(jobfields.job_fields, dataclasses.asdict(self))


@dataclass(frozen=True)
class GpuJobFlags:
    """The flags only GPU jobs take (a CPU stage has no such option): how many processes run the
    command, and how the job is suspended (`--elastic`, `--grace`)."""

    processes: ProcessesOption = None
    elastic: ElasticOption = False
    grace: GraceOption = None

    def fields(self) -> dict[str, Any]:
        """These flags as spec fields (`jobfields.gpu_job_fields`)."""
        return jobfields.gpu_job_fields(dataclasses.asdict(self))


if TYPE_CHECKING:
    WaitOption = Any
    WaitTimeoutOption = Any
    ArrayOption = Any
else:
    WaitOption = option(flagtable.WAIT)
    WaitTimeoutOption = option(flagtable.WAIT_TIMEOUT)
    ArrayOption = option(flagtable.ARRAY)


@dataclass(frozen=True)
class SubmitFlags:
    """What every submitting command does after validating the job: idempotency and waiting."""

    client_key: ClientKeyOption = None
    wait: WaitOption = False
    wait_timeout: WaitTimeoutOption = None
    array: ArrayOption = None
