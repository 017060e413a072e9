"""What users submit and what the API returns: pydantic models, strict, parsed once at the boundary."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

MAX_SCHEDULE_CHOICES: tuple[int, ...] = (0, 4, 6, 8, 24, 48)
"""Allowed `--max-schedule` values (hours of expected queueing); 0 = low priority."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A POSIX environment variable name; anything else cannot be exported to the job."""

Mode = Literal["cpu", "standalone", "distributed"]
CodeSource = Literal["nas", "git"]
Role = Literal["user", "group_admin", "platform_admin"]
JobState = Literal[
    "PENDING", "STARTING", "RUNNING", "SUSPENDING", "SUSPENDED", "SUCCEEDED", "FAILED", "CANCELLED"
]
TERMINAL_STATES: frozenset[str] = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
EndReason = Literal["completed", "failed", "preempted", "cancelled", "lost", "suspended"]
PriorityClass = Literal["high", "low"]


def canonical_gpu_type(name: str) -> str:
    """The one spelling of a GPU type everywhere (specs, nodes, packages, node labels): upper case."""
    return name.strip().upper()


GpuType = Annotated[str, AfterValidator(canonical_gpu_type), Field(min_length=1, max_length=63)]
"""A GPU type name as given (v100, V100); stored and compared as `canonical_gpu_type` makes it."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def priority_class(max_schedule: int) -> PriorityClass:
    """`max_schedule > 0` is high priority, `0` is low (the platform document's rule)."""
    return "high" if max_schedule > 0 else "low"


# --------------------------------------------------------------------------------------------
# Job specs (what `hai create`, `hai submit`, the web form and the operators send)
# --------------------------------------------------------------------------------------------


class _JobSpecBase(_Strict):
    task_name: str = Field(
        min_length=1, max_length=200, description="Task name; Chinese and English both work."
    )
    model_id: int | None = Field(default=None, ge=0, description="Model id from the model page.")
    project_id: int | None = Field(default=None, ge=0, description="Project id from My projects.")
    code_src: CodeSource = Field(default="nas", description="Where the code comes from: nas or git.")
    code_path: str = Field(
        min_length=1,
        description="NAS directory (the job starts cd'd there) or git repository URL/path.",
    )
    git_branch: str | None = Field(
        default=None, description="Git branch to check out; only with code_src=git."
    )
    model_dir: str | None = Field(
        default=None, description="Where the job saves checkpoints (HAI_MODEL_DIR)."
    )
    project_storage: tuple[int, ...] = Field(
        default=(), description="Project storage ids to mount, e.g. (10111, 10222)."
    )
    max_schedule: int = Field(
        default=0,
        description="Expected queueing time in hours, one of 0,4,6,8,24,48; 0 = low priority.",
    )
    image: str = Field(default="local", min_length=1, description="Docker image of the job.")
    shm: int | None = Field(default=None, gt=0, description="Shared memory in MB.")
    cmd: str = Field(min_length=1, description="Start command, usually `python3 xxx.py`.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables.")
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

    @field_validator("max_schedule")
    @classmethod
    def _max_schedule_choice(cls, v: int) -> int:
        if v not in MAX_SCHEDULE_CHOICES:
            choices = "|".join(str(c) for c in MAX_SCHEDULE_CHOICES)
            raise ValueError(f"max_schedule must be one of {choices} (hours; 0 = low priority)")
        return v

    @field_validator("project_storage", mode="before")
    @classmethod
    def _split_storage(cls, v: Any) -> Any:
        if isinstance(v, str):
            parts = [p.strip() for p in v.split(",") if p.strip()]
            try:
                return tuple(int(p) for p in parts)
            except ValueError:
                raise ValueError(
                    "project_storage must be comma-separated project ids, e.g. 10111,10222"
                ) from None
        return v

    @field_validator("task_name", "code_path", "cmd")
    @classmethod
    def _not_blank(cls, v: str, info: ValidationInfo) -> str:
        if not v.strip():
            raise ValueError(f"{info.field_name} must not be blank")
        return v

    @field_validator("project_storage")
    @classmethod
    def _storage_ids_non_negative(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(i < 0 for i in v):
            raise ValueError("project_storage ids must be >= 0, e.g. 10111,10222")
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not _ENV_NAME.fullmatch(k)]
        if bad:
            raise ValueError(
                f"env names must be letters, digits and _ and not start with a digit; got {bad[0]!r}"
            )
        return v

    @model_validator(mode="after")
    def _git_branch_only_with_git(self) -> _JobSpecBase:
        if self.git_branch and self.code_src != "git":
            raise ValueError("`git_branch` is only valid when `code_src` is git")
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
    resource_pkg: int = Field(description="Resource package id (see `hai res`).")
    gpu_type: GpuType | None = Field(
        default=None, description="GPU type (V100, A100, P100, T4...); default: the package's."
    )


class DistributedJobSpec(_JobSpecBase):
    """Multi-machine Horovod / torch.distributed training: workers x GPUs per worker."""

    mode: Literal["distributed"] = Field(default="distributed", description="Training mode.")
    workers: int = Field(ge=1, le=1024, description="Number of workers (usually whole machines).")
    worker_image: str | None = Field(
        default=None, description="Image of each worker; default: `image`."
    )
    worker_resource_pkg: int = Field(description="Resource package of one worker (see `hai res`).")
    gpu_type: GpuType | None = Field(
        default=None, description="GPU type; default: the worker package's."
    )


JobSpec = Annotated[CpuJobSpec | StandaloneJobSpec | DistributedJobSpec, Field(discriminator="mode")]


class SubmitRequest(_Strict):
    """Body of `POST /api/v1/jobs`."""

    spec: JobSpec = Field(description="The job to run.")
    client_key: str | None = Field(
        default=None,
        max_length=250,
        description="Idempotency key: a retried submit with the same key returns the same job.",
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
    workers: int
    submitted_at: datetime


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


class JobDetailView(JobView):
    events: tuple[EventView, ...] = ()


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


class QueueEntryView(_View):
    position: int
    job: QueueJobView
    weight: float
    terms: tuple[WeightTermView, ...] = ()
    reason: str
    waiting_behind: int | None = None
    preempted_by: int | None = None


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


class NodeView(_View):
    name: str
    gpu_type: str
    gpus: int
    cpus: float
    memory_gb: float
    virtual: bool
    free_gpus: tuple[int, ...]
    holders: dict[int, int] = Field(default_factory=dict, description="GPU index -> job id.")


class ResourcePackageView(ResourcePackage):
    model_config = ConfigDict(extra="ignore", frozen=True)
    startable_now: int = Field(default=0, description="How many such workers could start now.")


class ErrorView(_View):
    error: str
    field: str | None = None
    fix: str | None = None
