"""What users submit and what the API returns: pydantic models, strict, parsed once at the boundary."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Final, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    JsonValue,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from hai_airflow import labels as label_rules
from hai_airflow.vocabulary import LIVE as LIVE
from hai_airflow.vocabulary import MAX_SCHEDULE_CHOICES, PROCESSES_HELP, JobState, MaxScheduleHours, Processes
from hai_airflow.vocabulary import PLACED as PLACED
from hai_airflow.vocabulary import TERMINAL_STATES as TERMINAL_STATES
from hai_airflow.vocabulary import UNFINISHED as UNFINISHED
from hai_airflow.vocabulary import UNSUCCESSFUL as UNSUCCESSFUL
from hai_airflow.vocabulary import WAITING as WAITING

HighMaxScheduleHours = Literal[4, 6, 8, 24, 48]
"""The `max_schedule` values of high priority, what a promotion asks for."""

Mode = Literal["cpu", "standalone", "distributed"]
CodeSource = Literal["nas", "git"]
Role = Literal["user", "group_admin", "platform_admin"]

MOVES: dict[tuple[JobState, JobState], str] = {
    (JobState.PENDING, JobState.STARTING): "the scheduler admits it; a new instance is claimed",
    (JobState.SUSPENDED, JobState.STARTING): (
        "the scheduler admits it again (a resized job at its new size); a new instance resumes it"
    ),
    (JobState.PENDING, JobState.FAILED): "rejected: it cannot run on this cluster",
    (JobState.SUSPENDED, JobState.FAILED): "rejected: it can no longer run on this cluster",
    (JobState.PENDING, JobState.CANCELLED): "cancelled while waiting",
    (JobState.SUSPENDED, JobState.CANCELLED): "cancelled while suspended",
    (JobState.STARTING, JobState.RUNNING): "the backend started the instance",
    (JobState.STARTING, JobState.FAILED): "the start failed (a missing image, a path that went bad)",
    (JobState.STARTING, JobState.SUSPENDED): "the instance was lost before it ran (a server restart)",
    (JobState.STARTING, JobState.CANCELLED): "the instance was lost before it ran, and a cancel was asked",
    (JobState.RUNNING, JobState.SUSPENDING): (
        "preempted for a high-priority job, suspended by an admin, or resized (told to save, to restart "
        "at another number of workers)"
    ),
    (JobState.RUNNING, JobState.SUCCEEDED): "exit code 0",
    (JobState.RUNNING, JobState.FAILED): "any other exit code, or killed by a signal",
    (JobState.RUNNING, JobState.CANCELLED): "cancelled while running (the instance is stopped first)",
    (JobState.RUNNING, JobState.SUSPENDED): "exit code 75 unasked (saved, resume me), or a lost instance",
    (JobState.SUSPENDING, JobState.SUSPENDED): (
        "the instance ended, whatever its exit code (a resized job waits on the GPUs held for its new size)"
    ),
    (JobState.SUSPENDING, JobState.CANCELLED): "cancelled while being suspended",
    (JobState.RUNNING, JobState.TIMEOUT): "it reached its time limit (stopped as a preemption stops it)",
    (JobState.SUSPENDED, JobState.TIMEOUT): "it reached its time limit while being suspended",
}
"""Every legal move of a job's state (from, to) and when it happens; `checked_move` refuses any other,
for the server (`transitions.move`) and the simulator alike. A job is stored PENDING; SUCCEEDED,
FAILED, CANCELLED and TIMEOUT are final."""


class IllegalMove(RuntimeError):
    """A state change that `MOVES` does not list: a bug in its caller, never made."""


def checked_move(job_id: int, from_state: JobState, to_state: JobState, kind: str) -> JobState:
    """`to_state`, when `MOVES` lists the move from `from_state`; IllegalMove otherwise."""
    if (from_state, to_state) not in MOVES:
        raise IllegalMove(f"job {job_id}: {from_state} -> {to_state} ({kind}) is not a legal move")
    return to_state

EndReason = Literal[
    "completed", "failed", "preempted", "resized", "cancelled", "lost", "suspended", "timeout"
]
PriorityClass = Literal["high", "low"]


class StopKind(StrEnum):
    """Why the controller asked an instance to stop; stored as its value on the instance."""

    PREEMPT = "preempt"
    """Suspended for a high-priority job."""
    RESIZE = "resize"
    """Restarted at another number of workers."""
    HOLD = "hold"
    """Suspended by an admin."""
    TIMEOUT = "timeout"
    """Its time limit is used up."""
    CANCEL = "cancel"
    """Cancelled: it is not coming back."""


@dataclass(frozen=True)
class StopOrder:
    """What the backend is told when an instance is stopped."""

    grace_seconds: int
    """Seconds from now until the kill."""
    notice: bool
    """Whether the notice file is written (before SIGTERM) so the job saves and exits."""


def stop_order(
    kind: StopKind, elastic: bool, grace_seconds: int, asked_at: float | None, now: float
) -> StopOrder:
    """The one rule for a stop, the same when it is asked and when a restarted server asks again:
    only an elastic job gets the notice (a job that is not elastic is killed, with SIGTERM first when
    it has a grace), never on a cancel; the grace is the one granted at `asked_at`, less what has
    passed since (none when the time it was asked is unknown)."""
    left = 0.0 if asked_at is None else grace_seconds - (now - asked_at)
    return StopOrder(max(0, int(left)), elastic and kind is not StopKind.CANCEL)


def canonical_gpu_type(name: str) -> str:
    """The one spelling of a GPU type everywhere (specs, nodes, packages, node labels): upper case."""
    return name.strip().upper()


GpuType = Annotated[str, AfterValidator(canonical_gpu_type), Field(min_length=1, max_length=63)]
"""A GPU type name as given (v100, V100); stored and compared as `canonical_gpu_type` makes it."""


# --------------------------------------------------------------------------------------------
# Input limits: what one request may carry. Each is stated once here, enforced by the models and
# shown in the OpenAPI schema (lengths, ranges, patterns), so clients and fuzzers agree with us.
# --------------------------------------------------------------------------------------------

STORE_INT_MAX = 2**31 - 1
"""The largest id or number the store can hold: PostgreSQL INTEGER columns are 32-bit."""
MAX_ARG_STRLEN = 131072
"""Linux's limit on one exec argument or environment string, its terminating NUL byte included."""
MAX_CMD_BYTES = MAX_ARG_STRLEN - 1
"""`cmd` runs as `sh -c cmd`, one exec argument: at most this many UTF-8 bytes."""
MAX_NAME_CHARS = 200
"""task_name (the store's column width)."""
MAX_PATH_CHARS = 4096
"""code_path, model_dir (Linux PATH_MAX)."""
MAX_DRAIN_REASON_CHARS = 500
"""Why a node was drained: a line for `hai nodes`, not a report."""
MAX_IMAGE_CHARS = 512
"""image, worker_image: a registry host, a 255-character repository name and a tag or digest."""
MAX_GIT_BRANCH_CHARS = 255
"""git_branch (a ref name is one file name in .git/refs)."""
MAX_CLIENT_KEY_CHARS = 250
"""client_key (the store's column width)."""
MAX_ENV_VARS = 256
"""Extra environment variables one job may set."""
MAX_ENV_NAME_CHARS = 255
"""Length of one environment variable name."""
MAX_ENV_BYTES = MAX_ARG_STRLEN
"""All extra variables together, as `NAME=value` strings with their NUL bytes: bounded well below
what exec accepts in total, and so that each string also fits `MAX_ARG_STRLEN`."""
MAX_SHM_MB = 1 << 20
"""Shared memory of a job, MB (1 TiB)."""
MAX_PROJECT_STORAGES = 64
"""Project storages one job may mount."""
MAX_DEPENDENCIES = 64
"""Tasks one job may wait for (`after` and `after_any` together)."""
ARRAY_PATTERN = r"^\d+(-\d+(:\d+)?)?(,\d+(-\d+(:\d+)?)?)*(%\d+)?$"
"""What `array` may hold (its ranges and limit are checked beside the schema: `arrays.parse`)."""
MAX_TIME_LIMIT_SECONDS = 365 * 24 * 3600
"""A job's time limit (a year: beyond it, leave the limit out)."""

NUL = r"\x00"
"""Forbidden in all text: exec arguments, environment strings and C paths end at the first NUL."""
NUL_OR_BLANK = r"\x00|^[\x09-\x0d\x20]*$"
"""Forbidden in names, paths and commands: a NUL, or nothing but white space. White space is
spelled out because `\\s` means different characters to Python, JSON Schema and Rust regexes."""
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
"""A POSIX environment variable name; anything else cannot be exported to the job."""
_ENV_NAME_RULE = (
    "env names must be letters, digits and _ and not start with a digit",
    "Rename the variable, e.g. MY_VAR",
)


REFUSED, REFUSED_ACROSS_FIELDS = "hai_refused", "hai_refused_across_fields"
"""Error types of a refusal: of one value, or of two fields compared (`min_workers` above `workers`),
which JSON Schema cannot state, so a schema-valid request may meet it."""


def refusal(problem: str, fix: str, kind: str = REFUSED) -> PydanticCustomError:
    """A validation error that carries its fix; the API's error body shows both."""
    return PydanticCustomError(kind, "{problem}", {"problem": problem, "fix": fix})


def text_refusal(value: str, forbidden: str = NUL) -> PydanticCustomError | None:
    """Why `value` cannot reach a job as text (a NUL byte, a lone surrogate, only white space),
    or None if it can."""
    if "\x00" in value:
        return refusal("must not contain a NUL byte (\\0)", "Remove the NUL byte")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return refusal("must be valid Unicode text (it holds a lone surrogate)", "Send it as UTF-8 text")
    if re.search(forbidden, value):
        return refusal("must not be blank", "Give a value that is not only spaces")
    return None


class _StatedCheck:
    """A check of our own on a string, with the JSON schema keyword that states it to clients."""

    keyword: str
    value: Any

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> Any:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler(schema)
        out[self.keyword] = self.value
        return out

    def _check(self, value: str) -> str:
        raise NotImplementedError


class _Text(_StatedCheck):
    """Text refused when it holds `forbidden` (a NUL, blank); the schema says `not: {pattern}`.

    As a negation rather than a pattern of what is allowed: schema tools fold a pattern into its
    length bounds, and `[^\\x00]{0,131071}` is costly for every regex engine to compile.
    """

    keyword = "not"

    def __init__(self, forbidden: str = NUL):
        self.forbidden = forbidden
        self.value = {"pattern": forbidden}

    def _check(self, value: str) -> str:
        error = text_refusal(value, self.forbidden)
        if error is not None:
            raise error
        return value


class _EnvName(_StatedCheck):
    """An environment variable name, stated as a pattern."""

    keyword = "pattern"
    value = ENV_NAME_PATTERN

    def _check(self, value: str) -> str:
        if re.fullmatch(ENV_NAME_PATTERN, value) is None:
            raise refusal(*_ENV_NAME_RULE)
        return value


class _Utf8Within(_StatedCheck):
    """Text of at most `limit` UTF-8 bytes. A JSON schema counts characters, so it states `limit`
    as maxLength: every accepted string meets it, since a character is at least one byte."""

    keyword = "maxLength"

    def __init__(self, limit: int, what: str, fix: str):
        self.limit, self.what, self.fix = limit, what, fix
        self.value = limit

    def _check(self, value: str) -> str:
        size = len(value.encode("utf-8"))
        if size > self.limit:
            raise refusal(
                f"is {size:,} bytes; {self.what} holds at most {self.limit:,} bytes (UTF-8)", self.fix
            )
        return value


def _choice(message: str, fix: str) -> WrapValidator:
    """A Literal of ints that says `message` when refused, and, as an `int` field would, takes
    digits as text from Python callers (a rendered Airflow template); JSON must send a number."""

    def check(value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        if info.mode == "python" and isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]{1,9}\s*", value):
            value = int(value)
        try:
            return handler(value)
        except ValidationError:
            raise refusal(message, fix) from None

    return WrapValidator(check)


StoreId = Annotated[int, Field(ge=1, le=STORE_INT_MAX)]
"""A job or instance id: what the store can hold, so a larger one is a 422, never a 500."""
StoreNumber = Annotated[int, Field(ge=0, le=STORE_INT_MAX)]
"""A model, project, storage or package id given by the user."""
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS), _Text(NUL_OR_BLANK)]
"""A task name."""
PrincipalName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS), _Text(NUL)]
"""A user or group name as a request names it (the store's column width)."""
NodeName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS), _Text(NUL)]
"""A node name as a request names it (the store's column width)."""
DrainReason = Annotated[str, Field(min_length=1, max_length=MAX_DRAIN_REASON_CHARS), _Text(NUL_OR_BLANK)]
"""Why an admin drains a node, in a few words."""
FilterText = Annotated[str, Field(max_length=MAX_NAME_CHARS), _Text(NUL)]
"""A filter in a query, e.g. job states: short, and no NUL (PostgreSQL refuses it in text)."""
PathText = Annotated[str, Field(min_length=1, max_length=MAX_PATH_CHARS), _Text(NUL_OR_BLANK)]
ImageRef = Annotated[str, Field(min_length=1, max_length=MAX_IMAGE_CHARS), _Text(NUL_OR_BLANK)]
GitBranch = Annotated[str, Field(min_length=1, max_length=MAX_GIT_BRANCH_CHARS), _Text(NUL_OR_BLANK)]
Command = Annotated[
    str,
    Field(min_length=1),
    _Text(NUL_OR_BLANK),
    _Utf8Within(
        MAX_CMD_BYTES,
        "one exec argument (Linux MAX_ARG_STRLEN, `sh -c cmd`)",
        "Put the long part in a script under code_path and run that script",
    ),
]
ExecArg = Annotated[str, Field(max_length=MAX_CMD_BYTES), _Text(NUL)]
"""One argument of a command `hai exec` runs (no shell: any text but NUL)."""
EnvName = Annotated[str, Field(min_length=1, max_length=MAX_ENV_NAME_CHARS), _EnvName()]
EnvValue = Annotated[str, Field(max_length=MAX_ENV_BYTES - 3), _Text(NUL)]
"""One value; `MAX_ENV_BYTES` bounds all of them together with their names."""
ENV_NAMES_SCHEMA: dict[str, JsonValue] = {
    "minLength": 1,
    "maxLength": MAX_ENV_NAME_CHARS,
    "pattern": ENV_NAME_PATTERN,
}
"""`propertyNames` of `env` (pydantic would only state the pattern as `patternProperties`)."""
ClientKey = Annotated[str, Field(min_length=1, max_length=MAX_CLIENT_KEY_CHARS), _Text(NUL)]
MaxSchedule = Annotated[
    MaxScheduleHours,
    _choice(
        "max_schedule must be one of "
        + "|".join(str(c) for c in MAX_SCHEDULE_CHOICES)
        + " (hours; 0 = low priority)",
        "Use 0 for low priority, or 4, 6, 8, 24 or 48 hours for high priority",
    ),
]
HighMaxSchedule = Annotated[
    HighMaxScheduleHours,
    _choice(
        "promotion needs a high-priority max_schedule: one of "
        + ", ".join(str(c) for c in get_args(HighMaxScheduleHours)),
        "Use 4, 6, 8, 24 or 48 hours",
    ),
]


def env_size(env: dict[str, str]) -> int:
    """Bytes the variables take in a process's environment: `NAME=value` and a NUL byte each."""
    return sum(len(k.encode("utf-8")) + len(v.encode("utf-8")) + 2 for k, v in env.items())


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def is_high(max_schedule: int) -> bool:
    """`max_schedule > 0` is high priority, `0` is low (the platform document's rule)."""
    return max_schedule > 0


def holds_high_priority(max_schedule: int, gpus: int) -> bool:
    """Only a job that holds GPUs is high priority: the quota counts GPUs, so it could not bound a
    CPU job's, and a CPU job never suspends a GPU job."""
    return is_high(max_schedule) and gpus > 0


CPU_NEVER_HIGH = (
    "a CPU job is always low priority: the high-priority quota counts GPUs, so it cannot cover one",
    "Submit it with max_schedule 0; it holds no GPU, so no high-priority job suspends it for GPUs",
)
"""The refusal of a high-priority CPU job (error, fix), at submission and promotion alike."""


def priority_class(max_schedule: int) -> PriorityClass:
    return "high" if is_high(max_schedule) else "low"


# --------------------------------------------------------------------------------------------
# Job specs (what `hai create`, `hai submit`, the web form and the operators send)
# --------------------------------------------------------------------------------------------


_GIT_BRANCH_NEEDS_GIT = {
    "if": {"properties": {"git_branch": {"type": "string"}}, "required": ["git_branch"]},
    "then": {"properties": {"code_src": {"const": "git"}}, "required": ["code_src"]},
}
"""`_git_branch_only_with_git` as JSON Schema, so generated clients and fuzzers know it too."""


def _spec_schema_rules(schema: dict[str, Any]) -> None:
    """The rules across fields, in the JSON schema. `mode` tells the kinds of spec apart, so a
    request must send it (Python callers may omit it)."""
    schema["required"] = sorted({*schema.get("required", []), "mode"})
    schema.update(_GIT_BRANCH_NEEDS_GIT)


_RESIZABLE_IS_ELASTIC = {
    "if": {"properties": {"min_workers": {"type": "integer"}}, "required": ["min_workers", "elastic"]},
    "then": {"properties": {"elastic": {"const": True}}},
}
"""`DistributedJobSpec._resizable`'s rule on `elastic` as JSON Schema (the one on `workers` compares
two values, which it cannot state)."""


def _distributed_schema_rules(schema: dict[str, Any]) -> None:
    _spec_schema_rules(schema)
    schema["allOf"] = [*schema.get("allOf", []), _RESIZABLE_IS_ELASTIC]


class _JobSpecBase(_Strict):
    model_config = ConfigDict(json_schema_extra=_spec_schema_rules)

    task_name: Name = Field(description="Task name; Chinese and English both work.")
    model_id: StoreNumber | None = Field(default=None, description="Model id from the model page.")
    project_id: StoreNumber | None = Field(default=None, description="Project id from My projects.")
    code_src: CodeSource = Field(default="nas", description="Where the code comes from: nas or git.")
    code_path: PathText = Field(
        description="NAS directory (the job starts cd'd there) or git repository URL/path.",
    )
    git_branch: GitBranch | None = Field(
        default=None, description="Git branch to check out; only with code_src=git."
    )
    model_dir: PathText | None = Field(
        default=None, description="Where the job saves checkpoints (HAI_MODEL_DIR)."
    )
    project_storage: tuple[StoreNumber, ...] = Field(
        default=(),
        max_length=MAX_PROJECT_STORAGES,
        description="Project storage ids to mount, e.g. (10111, 10222).",
    )
    max_schedule: MaxSchedule = Field(
        default=0,
        description="Expected queueing time in hours, one of 0,4,6,8,24,48; 0 = low priority.",
    )
    image: ImageRef = Field(default="local", description="Docker image of the job.")
    shm: int | None = Field(default=None, gt=0, le=MAX_SHM_MB, description="Shared memory in MB.")
    cmd: Command = Field(
        description="Start command, usually `python3 xxx.py`; run as `sh -c cmd`, so at most "
        f"{MAX_CMD_BYTES} UTF-8 bytes."
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict,
        max_length=MAX_ENV_VARS,
        json_schema_extra={"propertyNames": ENV_NAMES_SCHEMA},
        description=f"Extra environment variables: at most {MAX_ENV_VARS}, together at most "
        f"{MAX_ENV_BYTES} bytes as NAME=value strings.",
    )
    elastic: bool = Field(
        default=False,
        description="Elastic (EFDL-style): told to save and exit on suspension instead of killed.",
    )
    grace_seconds: int | None = Field(
        default=None,
        ge=0,
        le=3600,
        description="Seconds between the save notice and the kill; default 60 if elastic, else 0.",
    )
    time_limit_seconds: int | None = Field(
        default=None,
        gt=0,
        le=MAX_TIME_LIMIT_SECONDS,
        description="Seconds the job may run, over all its runs (suspended time does not count); then "
        "it gets the save notice and its grace, and ends TIMEOUT. None: no limit.",
    )
    labels: dict[str, Annotated[str, Field(pattern=label_rules.VALUE_PATTERN)]] = Field(
        default_factory=dict,
        max_length=label_rules.MAX_LABELS,
        json_schema_extra={"propertyNames": {"pattern": label_rules.KEY_PATTERN}},
        description="Labels to find the job by (`hai task -l key=value`): keys and values of letters, "
        "digits, '.', '_' and '-', at most 63 characters each.",
    )
    after: tuple[StoreNumber, ...] = Field(
        default=(),
        max_length=MAX_DEPENDENCIES,
        description="Job ids that must succeed first (Slurm's afterok): this job waits until all of them "
        "SUCCEEDED, and is cancelled if one of them ends otherwise.",
    )
    after_any: tuple[StoreNumber, ...] = Field(
        default=(),
        max_length=MAX_DEPENDENCIES,
        description="Job ids that must end first, in any state (Slurm's afterany).",
    )

    @field_validator("project_storage", "after", "after_any", mode="before")
    @classmethod
    def _split_ids(cls, v: Any, info: ValidationInfo) -> Any:
        # The CLI flags and operator arguments are text; a JSON body must send an array.
        if isinstance(v, str) and info.mode == "python":
            parts = [p.strip() for p in v.split(",") if p.strip()]
            try:
                return tuple(int(p) for p in parts)
            except ValueError:
                example = "10111,10222" if info.field_name == "project_storage" else "12,13"
                raise ValueError(f"`{info.field_name}` must be comma-separated ids, e.g. {example}") from None
        # A JSON array reaches this as a list, which strict validation of a tuple refuses.
        return tuple(v) if isinstance(v, list) else v

    @field_validator("labels")
    @classmethod
    def _labels_are_words(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            label_rules.check_value(label_rules.check_key(key), value)
        return v

    @field_validator("env")
    @classmethod
    def _env_fits(cls, v: dict[str, str]) -> dict[str, str]:
        size = env_size(v)
        if size > MAX_ENV_BYTES:
            raise refusal(
                f"env takes {size:,} bytes as NAME=value strings; at most {MAX_ENV_BYTES:,} are allowed",
                "Pass large values in a file under code_path instead of env",
            )
        return v

    @model_validator(mode="after")
    def _git_branch_only_with_git(self) -> _JobSpecBase:
        if self.git_branch and self.code_src != "git":
            raise refusal(
                "`git_branch` is only valid when `code_src` is git",
                "Set code_src to git, or leave out git_branch",
            )
        return self

    @property
    def priority(self) -> PriorityClass:
        return priority_class(self.max_schedule)

    @property
    def effective_grace_seconds(self) -> int:
        if self.grace_seconds is not None:
            return self.grace_seconds
        return 60 if self.elastic else 0


class CpuJobSpec(_JobSpecBase):
    """A CPU stage (e.g. preprocessing): holds no GPU."""

    mode: Literal["cpu"] = Field(default="cpu", description="Training mode.")
    cpus: float = Field(default=1, gt=0, le=1024, description="CPU cores the job needs.")
    memory_gb: float = Field(default=1, ge=0, le=16384, description="Memory the job needs, GB.")


class StandaloneJobSpec(_JobSpecBase):
    """Single-machine (multi-)GPU training."""

    mode: Literal["standalone"] = Field(default="standalone", description="Training mode.")
    resource_pkg: StoreNumber = Field(description="Resource package id (see `hai res`).")
    gpu_type: GpuType | None = Field(
        default=None, description="GPU type (V100, A100, P100, T4...); default: the package's."
    )
    processes: Processes = Field(
        default="per-worker",
        description=f"{PROCESSES_HELP} Default per-worker: the command runs once and sees every GPU.",
    )


class DistributedJobSpec(_JobSpecBase):
    """Multi-machine Horovod / torch.distributed training: workers x GPUs per worker."""

    model_config = ConfigDict(json_schema_extra=_distributed_schema_rules)

    mode: Literal["distributed"] = Field(default="distributed", description="Training mode.")
    workers: int = Field(ge=1, le=1024, description="Number of workers (usually whole machines).")
    worker_image: ImageRef | None = Field(default=None, description="Image of each worker; default: `image`.")
    worker_resource_pkg: StoreNumber = Field(description="Resource package of one worker (see `hai res`).")
    gpu_type: GpuType | None = Field(default=None, description="GPU type; default: the worker package's.")
    processes: Processes = Field(
        default="per-gpu",
        description=f"{PROCESSES_HELP} Default per-gpu: hvd.size() is workers x GPUs per worker.",
    )
    min_workers: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="Resizable: a high-priority job may shrink it down to this many workers instead of "
        "suspending it, and it grows back to `workers` when GPUs free. Each resize is a save on the "
        "notice and a restart at the new size from that checkpoint (implies elastic).",
    )

    @model_validator(mode="before")
    @classmethod
    def _resizable_is_elastic(cls, data: Any) -> Any:
        """`min_workers` implies `elastic`: a resize is a save on the notice and a restart."""
        if isinstance(data, dict) and data.get("min_workers") is not None and "elastic" not in data:
            return {**data, "elastic": True}
        return data

    @model_validator(mode="after")
    def _resizable(self) -> DistributedJobSpec:
        if self.min_workers is None:
            return self
        if self.min_workers > self.workers:
            raise refusal(
                f"`min_workers` ({self.min_workers}) is more than `workers` ({self.workers})",
                "Set min_workers between 1 and workers, or leave it out for a job that never resizes",
                REFUSED_ACROSS_FIELDS,
            )
        if not self.elastic:
            raise refusal(
                "a resizable job (`min_workers`) must save on the notice, but `elastic` is false",
                "Leave out elastic (min_workers implies it), or leave out min_workers",
            )
        return self

    def runs_at(self, workers: int) -> bool:
        """Whether it may run at this many workers: all it asks for, or down to `min_workers`."""
        return (self.min_workers or self.workers) <= workers <= self.workers

    @property
    def resizable(self) -> bool:
        """It may run at fewer workers than it asks for (`min_workers` below `workers`)."""
        return self.min_workers is not None and self.min_workers < self.workers


JobSpec = Annotated[CpuJobSpec | StandaloneJobSpec | DistributedJobSpec, Field(discriminator="mode")]


class SubmitRequest(_Strict):
    """Body of `POST /api/v1/jobs`."""

    spec: JobSpec = Field(description="The job to run.")
    client_key: ClientKey | None = Field(
        default=None,
        description="Idempotency key: a retried submit with the same key returns the same job.",
    )
    array: str | None = Field(
        default=None,
        max_length=200,
        pattern=ARRAY_PATTERN,
        description="Make one task per index, like Slurm's --array: 0-9, 0-15:4, 1,3,5, with %K for "
        "at most K running at once (0-9%2). Each sees HAI_ARRAY_INDEX; the answer is the first task.",
    )


# --------------------------------------------------------------------------------------------
# Platform configuration
# --------------------------------------------------------------------------------------------


class NodeConfig(_Strict):
    name: str = Field(min_length=1, description="Node name (unique).")
    gpu_type: GpuType = Field(default="V100", description="GPU type of every GPU on the node.")
    gpus: int = Field(default=8, ge=0, le=64, description="Number of GPUs.")
    cpus: float = Field(default=32, gt=0, description="CPU cores.")
    memory_gb: float = Field(default=256, gt=0, description="Memory, GB.")
    virtual: bool = Field(
        default=True, description="Virtual GPUs: jobs see CUDA_VISIBLE_DEVICES but run on CPU."
    )


class ResourcePackage(_Strict):
    id: int = Field(ge=0, description="Package id, used by --resource-pkg.")
    name: str = Field(description="Human name, e.g. 8xV100.")
    gpu_type: GpuType = Field(description="GPU type.")
    gpus: int = Field(ge=0, description="GPUs per worker.")
    cpus: float = Field(gt=0, description="CPU cores per worker.")
    memory_gb: float = Field(gt=0, description="Memory per worker, GB.")


class GroupConfig(_Strict):
    name: str = Field(min_length=1, description="Resource group name.")
    quota_gpus: int | None = Field(
        default=None, ge=0, description="High-priority GPU quota of the group; None = unlimited."
    )
    admins: tuple[str, ...] = Field(default=(), description="Users who administer the group.")


ON_BEHALF_OF: Final = "X-Hai-On-Behalf-Of"
"""The request header naming the user a service identity (a user with `acts_for`) acts for."""


class UserConfig(_Strict):
    name: str = Field(min_length=1, description="User name.")
    group: str = Field(default="default", description="The user's resource group.")
    role: Role = Field(default="user", description="user, group_admin or platform_admin.")
    quota_gpus: int | None = Field(
        default=None, ge=0, description="Personal high-priority GPU quota; None = the group's."
    )
    token: str | None = Field(default=None, description="API token (Bearer).")
    token_env: str | None = Field(
        default=None,
        min_length=1,
        description="Used when `token` is absent: the environment variable of hai serve holding the "
        "token, so the file holds no secret; hai serve refuses to start while it is unset.",
    )
    acts_for: tuple[str, ...] = Field(
        default=(),
        description="Users this identity may act for with the X-Hai-On-Behalf-Of header: user names, "
        '"group:<name>" (every member of that group) or "*" (everyone); non-empty makes it a service '
        "identity (e.g. Airflow). Empty: it acts only as itself.",
    )


# --------------------------------------------------------------------------------------------
# API views (what the server returns and the client parses)
# --------------------------------------------------------------------------------------------


class _View(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class WorkerPlacementView(_View):
    node: str
    gpus: tuple[int, ...]


class JobShapeView(_View):
    """What anyone may know of any job: what it asks for and where it stands; the queue needs no more."""

    id: int
    mode: Mode
    state: JobState
    priority: PriorityClass
    max_schedule: int
    gpus: int = Field(description="Total GPUs (workers x GPUs per worker).")
    gpu_type: str | None
    workers: int = Field(description="Workers it asked for (1 unless distributed).")
    min_workers: int | None = Field(
        default=None,
        description="A resizable job's least workers: it may be shrunk down to these instead of suspended, "
        "and grows back to `workers` when GPUs free. Null: it never resizes.",
    )
    size: int = Field(
        description="Workers it runs at now (or resumes at): `workers` unless it was shrunk. `gpus` stays "
        "what it asked for."
    )
    submitted_at: datetime

    @model_validator(mode="before")
    @classmethod
    def _size_defaults_to_workers(cls, data: Any) -> Any:
        """A view without `size` (from a server before resizing existed) runs at all it asked for."""
        if isinstance(data, dict) and data.get("size") is None and "workers" in data:
            return {**data, "size": data["workers"]}
        return data

    @property
    def resized(self) -> bool:
        """It runs (or resumes) at fewer workers than it asked for."""
        return self.size != self.workers


class JobView(JobShapeView):
    """A job in full, as its owner, an admin of its group and platform admins see it."""

    visibility: Literal["full"] = Field(
        default="full", description="`full`: the caller may see this job's content (owner or admin)."
    )
    task_name: str
    user: str
    group: str
    spec: dict[str, Any] = Field(description="The submitted spec, as JSON.")
    started_at: datetime | None = Field(default=None, description="Start of the current run.")
    ended_at: datetime | None = None
    runtime_seconds: float = Field(default=0, description="Total seconds run over all instances.")
    preemptions: int = 0
    instances: int = 0
    latest_checkpoint: str | None = None
    latest_checkpoint_at: datetime | None = None
    placement: tuple[WorkerPlacementView, ...] = ()
    reason: str | None = Field(default=None, description="Why it waits / why it ended.")
    client_key: str | None = None
    model_id: int | None = None
    project_id: int | None = None
    submitted_via: str | None = Field(
        default=None,
        description="The service identity (e.g. airflow) that submitted it on `user`'s behalf, or "
        "`job N` when the credential of `user`'s job N did (`hai` inside a job); null when the user "
        "submitted it.",
    )
    requeued_from: int | None = Field(
        default=None,
        description="The ended job this one runs again (`hai requeue`); null for a job submitted anew.",
    )
    array_id: int | None = Field(default=None, description="The array it is a task of: its first task's id.")
    array_index: int | None = Field(default=None, description="Its index in the array (HAI_ARRAY_INDEX).")


class InstanceView(_View):
    id: int
    job_id: int
    started_at: datetime | None
    ended_at: datetime | None = None
    placement: tuple[WorkerPlacementView, ...] = ()
    exit_code: int | None = None
    end_reason: EndReason | None = None
    preempted_by: int | None = None
    resume: bool = False
    checkpoint: str | None = Field(default=None, description="Checkpoint it started from.")


class EventView(_View):
    id: int
    job_id: int
    at: datetime
    kind: str = Field(description="e.g. submitted, admitted, started, suspending, suspended...")
    from_state: JobState | None = None
    to_state: JobState | None = None
    reason: str
    actor: str = Field(description="controller, a user name, or a backend.")


ForecastSource = Literal["now", "limit", "history", "user", "group", "cluster"]
"""Where a forecast start comes from: at once, or the runtime estimate of the job whose end makes room
(its time limit, its own task's, its user's, its group's or the cluster's recent runtimes)."""


class ForecastView(_View):
    """A job's forecast: the planner run forward with every job's estimated runtime. Another user's job
    shows only `start_at`."""

    start_at: datetime | None = Field(
        default=None, description="Expected start of a queued job; None: not before `horizon`."
    )
    source: ForecastSource | None = Field(
        default=None, description="What the start (or a placed job's end) is estimated from."
    )
    end_at: datetime | None = Field(default=None, description="A placed job's expected end.")
    suspension_at: datetime | None = Field(
        default=None, description="A running low-priority job's expected suspension before its end."
    )
    horizon: datetime | None = Field(default=None, description="How far ahead the forecast looked.")
    at: datetime | None = Field(default=None, description="When the forecast was made.")


class JobDetailView(JobView):
    events: tuple[EventView, ...] = ()
    forecast: ForecastView | None = Field(default=None, description="The latest forecast, where one exists.")


class WeightTermView(_View):
    name: str
    value: float
    note: str = ""


OTHER_USERS_JOB: Final = "another user's job"
"""What the queue shows in place of the name and owner of a job the caller may not see."""


class OtherJobView(JobShapeView):
    """Another user's job as the queue shows it: what it asks for and where it stands, never what it runs.

    No name, owner, group, command, env, paths, storages or keys: a field missing here cannot leak.
    """

    visibility: Literal["other"] = Field(
        default="other", description="`other`: another user's job; only what the queue needs is shown."
    )
    owner: Literal["another user's job"] = Field(
        default=OTHER_USERS_JOB, description="Stands in for the task name and the user."
    )


QueueJobView = Annotated[JobView | OtherJobView, Field(discriminator="visibility")]
"""A queued job: in full when the caller may see it, else only as `OtherJobView`."""


class UsageView(_View):
    """One row of `GET /usage`: a user's or a group's use over [since, until)."""

    name: str = Field(description="The user or group.")
    by: Literal["user", "group"]
    since: datetime
    until: datetime
    jobs: int = Field(description="Jobs submitted in the window.")
    ended: dict[str, int] = Field(description="Jobs that ended in the window, by final state.")
    gpu_hours: float = Field(description="GPU-hours run in the window (GPUs x hours).")
    high_gpu_hours: float = Field(description="Of those, by high-priority jobs.")
    low_gpu_hours: float = Field(description="Of those, by low-priority jobs.")
    lost_gpu_hours: float = Field(
        description="GPU-hours of work lost to preemption or suspension (run past the latest checkpoint)."
    )
    waits: int = Field(description="Jobs that first started in the window.")
    wait_p50_seconds: float | None = Field(description="Their median wait from submit to first start.")
    wait_p95_seconds: float | None = Field(description="Their 95th percentile wait.")


class UsageSeriesView(_View):
    name: str = Field(description="The user or group.")
    gpu_hours: tuple[float, ...] = Field(description="GPU-hours per day of `days`.")


class UsageHistoryView(_View):
    """`GET /usage/history`: use over [since, until) by UTC day, and the queue hour by hour."""

    by: Literal["user", "group"]
    since: datetime
    until: datetime
    days: tuple[datetime, ...] = Field(description="The start of each UTC day the window touches.")
    series: tuple[UsageSeriesView, ...]
    cluster_gpus: int = Field(description="GPUs of the cluster's nodes now: 24 GPU-hours each per day.")
    waiting: tuple[int, ...] = Field(
        description="Tasks waiting for their first start, hour by hour: the last at `until`."
    )


class FileEntryView(_View):
    name: str
    kind: Literal["file", "dir", "link", "other"]
    size: int
    modified: float = Field(description="Modification time (POSIX seconds).")


class FilesView(FileEntryView):
    """A path below a task's model dir (`name`: the path), and a directory's entries."""

    entries: list[FileEntryView] | None = Field(default=None, description="A directory's entries, by name.")
    truncated: bool = Field(default=False, description="The directory holds more entries than listed.")


class LedgerProblemView(_View):
    job_id: int | None
    what: str


class LedgerView(_View):
    """What `GET /admin/check` read and found wrong (nothing, on a healthy store)."""

    jobs: int
    instances: int
    events: int
    problems: list[LedgerProblemView]


class RevisionView(_View):
    """Where the tasks a caller may list stand: a new revision means one of them changed, or one was
    submitted. Compare revisions for equality only."""

    revision: str


class QueueEntryView(_View):
    position: int
    job: QueueJobView
    weight: float
    terms: tuple[WeightTermView, ...] = ()
    reason: str
    waiting_behind: int | None = None
    preempted_by: int | None = None
    forecast: ForecastView | None = Field(
        default=None, description="The latest forecast of its start, where one exists."
    )


class QuotaUsageView(_View):
    user: str
    used_gpus: int
    quota_gpus: int | None = Field(
        default=None, description="The member's personal high-priority quota; None = only the group's."
    )


class QuotaView(_View):
    group: str
    group_quota_gpus: int | None
    group_used_gpus: int
    user: str | None = None
    user_quota_gpus: int | None = None
    user_used_gpus: int = 0
    users: tuple[QuotaUsageView, ...] = ()


NodeState = Literal["ready", "draining", "drained"]
"""`ready`: takes new jobs; `draining`: drained by an admin, jobs still run on it; `drained`: drained
and empty."""


class NodeTaskShape(_View):
    """What anyone may know of a job running on a node: its id, its state and what it uses there."""

    id: int
    state: JobState
    gpus: tuple[int, ...] = Field(default=(), description="The GPU indices it holds on this node.")
    cpus: float = 0
    memory_gb: float = 0


class NodeTaskView(NodeTaskShape):
    """A job on a node that the caller may see (owner or admin), named."""

    visibility: Literal["full"] = Field(default="full", description="`full`: the caller may see this job.")
    task_name: str
    user: str


class OtherNodeTaskView(NodeTaskShape):
    """Another user's job on a node: as `OtherJobView`, no name, owner or group."""

    visibility: Literal["other"] = Field(default="other", description="`other`: another user's job.")
    owner: Literal["another user's job"] = Field(
        default=OTHER_USERS_JOB, description="Stands in for the task name and the user."
    )


NodeTask = Annotated[NodeTaskView | OtherNodeTaskView, Field(discriminator="visibility")]
"""A job on a node: in full when the caller may see it, else only its id and use."""


class NodeView(_View):
    name: str
    gpu_type: str
    gpus: int
    cpus: float
    memory_gb: float
    virtual: bool
    free_gpus: tuple[int, ...] = Field(description="GPU indices no instance holds (reserved ones included).")
    holders: dict[int, int] = Field(default_factory=dict, description="GPU index -> job id.")
    reserved_for: dict[int, int] = Field(
        default_factory=dict,
        description="GPU index -> the waiting high-priority job it is kept for (the jobs suspended for "
        "it may still hold some).",
    )
    cpus_used: float = 0
    memory_gb_used: float = 0
    tasks: tuple[NodeTask, ...] = Field(default=(), description="The jobs running here, by id.")
    state: NodeState = "ready"
    drained_by: str | None = Field(default=None, description="The admin who drained it.")
    drained_at: datetime | None = None
    reason: str | None = Field(default=None, description="Why it was drained, as the admin said.")


class ResourcePackageView(ResourcePackage):
    model_config = ConfigDict(extra="ignore", frozen=True)
    startable_now: int = Field(default=0, description="How many such workers could start now.")
