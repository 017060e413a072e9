"""The `hai serve` configuration file: TOML sections validated with the spec models."""

from __future__ import annotations

import getpass
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hai_airflow.backends.common.confine import template_problem
from hai_airflow.backends.common.gitcode import DEFAULT_SCHEMES
from hai_airflow.server.acting import entry_problem
from hai_airflow.spec import GroupConfig, NodeConfig, ResourcePackage, UserConfig

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
DEFAULT_CHECKPOINT_PATTERNS: tuple[str, ...] = ("*",)
DEFAULT_CHECKPOINT_DIRECTORIES: tuple[str, ...] = ("checkpoint-*", "global_step*")
DEFAULT_CHECKPOINT_IGNORE: tuple[str, ...] = (
    *("*.tmp", "*.temp", "*.partial", "*.part", "*.lock", ".*", "*~"),  # being written
    *("*.json", "*.jsonl", "*.log", "*.txt", "*.csv", "*.yaml", "*.yml", "events.out.tfevents.*"),
)
"""Files being written, and the text a run writes beside its checkpoints (metrics, logs, configs,
TensorBoard events): never a job's progress. A checkpoint directory (`directories`) counts whole,
its config.json included."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSection(_Section):
    backend: str = Field(
        default="local", min_length=1, description="Backend name: local, docker, kubernetes."
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; default SQLite at $HAI_HOME/hai.db (HAI_DATABASE_URL wins).",
    )
    token_key_file: str | None = Field(
        default=None,
        min_length=1,
        description="File (0600, hex) with the key API tokens are hashed under; created when missing. "
        "Default $HAI_HOME/token.key (HAI_TOKEN_KEY_FILE wins); servers sharing a database share it.",
    )
    policy: str = Field(default="seed", min_length=1, description="Scheduling policy name.")
    host: str = Field(default=DEFAULT_HOST, min_length=1, description="Address to listen on.")
    port: int = Field(default=DEFAULT_PORT, ge=1, le=65535, description="Port to listen on.")
    max_body_bytes: int = Field(
        default=1 << 20,
        ge=64 << 10,
        le=1 << 30,
        description="Largest request body accepted (bytes); larger ones get 413. Default 1 MiB.",
    )
    max_download_bytes: int = Field(
        default=16 << 30,
        ge=1,
        description="Largest file `hai cp` downloads from a task's model dir (bytes); larger ones get 413. "
        "Default 16 GiB.",
    )
    job_url: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s/]+(/\S*)?$",
        description="Address a job reaches this server at (HAI_SERVER in every job, for `hai` inside "
        "it) on the docker and kubernetes backends, e.g. http://hai-server:8765 or a Service's name; "
        "the local backend's jobs use the address the server listens on.",
    )
    metrics_token: str | None = Field(
        default=None,
        min_length=16,
        description="Bearer token that may read /metrics and nothing else (for Prometheus); "
        "without it only platform admins may.",
    )


class CheckpointsSection(_Section):
    patterns: tuple[str, ...] = Field(
        default=DEFAULT_CHECKPOINT_PATTERNS,
        min_length=1,
        description="Globs of the file names in a model dir that are a job's progress (its resume, "
        'events and lost work): by default any complete file; an admin may narrow it, e.g. ["*.pt"].',
    )
    ignore: tuple[str, ...] = Field(
        default=DEFAULT_CHECKPOINT_IGNORE,
        description="Globs of names that are never progress, nor searched below: files being written "
        "(temp names, dotfiles) and the text a run writes beside its checkpoints (metrics, logs, "
        "configs, TensorBoard events).",
    )
    directories: tuple[str, ...] = Field(
        default=DEFAULT_CHECKPOINT_DIRECTORIES,
        description="Globs of directory names that are one checkpoint as a whole (Hugging Face's "
        "checkpoint-500/, DeepSpeed's global_step500/); other directories are searched, 3 levels deep.",
    )


class PathsSection(_Section):
    allowed: tuple[str, ...] | None = Field(
        default=None,
        description="Roots that code paths, model dirs and data may lie under; {user} and {group} are "
        "the job owner's; unset = anywhere but system paths and $HAI_HOME.",
    )

    @field_validator("allowed")
    @classmethod
    def _roots_usable(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for template in v or ():
            problem = template_problem(template)
            if problem is not None:
                raise ValueError(f'{problem}; write absolute roots such as "/nas/{{user}}"')
        return v


class GitSection(_Section):
    allowed_hosts: tuple[str, ...] = Field(
        default=(),
        description="Hosts (host or host:port) jobs may clone git repositories from; a repository path "
        "on the server is always allowed within [paths] allowed.",
    )
    schemes: tuple[Literal["https", "ssh", "http", "git"], ...] = Field(
        default=DEFAULT_SCHEMES,
        min_length=1,
        description="Protocols of those clones: https and ssh; http or git:// only for an internal host "
        "you trust on its network.",
    )


class LimitsSection(_Section):
    """Budgets each user has, so one user cannot slow or starve the others; a request past one gets
    429 naming the limit."""

    execs_per_user: int = Field(
        default=4, ge=1, le=1024, description="Commands (`hai exec`) one user may have running at once."
    )
    cp_streams_per_user: int = Field(
        default=4, ge=1, le=1024, description="Downloads (`hai cp`) one user may have streaming at once."
    )
    pending_jobs_per_user: int = Field(
        default=10_000,
        ge=1,
        le=1_000_000,
        description="Jobs one user may have waiting (queued, suspended, held) at once; a submit past it "
        "(an array counts each task) gets 429.",
    )
    log_bytes_per_instance: int = Field(
        default=256 << 20,
        ge=1 << 20,
        le=1 << 40,
        description="Most bytes of output an instance's log keeps (its workers share it); what comes "
        "after is dropped behind one line saying so (docker: the engine keeps the newest). Default "
        "256 MiB.",
    )
    usage_window_days: int = Field(
        default=400,
        ge=1,
        le=3660,
        description="Longest window `hai usage` / `GET /usage/history` answers, in days.",
    )
    max_grace_seconds: int = Field(
        default=600,
        ge=0,
        le=3600,
        description="Longest grace a job's own `--grace` gets after a stop notice (a preemptor waits "
        "at most this long for its victim); larger values are cut to it.",
    )


class StorageConfig(_Section):
    """One `[storages.<id>]` table: where the project's data is and who may mount it."""

    path: str = Field(min_length=1, description="Host path (local, docker) or PVC name (kubernetes).")
    groups: tuple[str, ...] = Field(default=(), description="Groups whose members may mount it.")
    users: tuple[str, ...] = Field(default=(), description="Users who may mount it.")

    @model_validator(mode="before")
    @classmethod
    def _not_bare(cls, v: Any) -> Any:
        if isinstance(v, str):
            # A bare path would let every user mount the project's data.
            raise ValueError(
                f"a bare path ({v!r}) names no owners; write a table: "
                f'[storages.<id>] path = "{v}" groups = ["<group>"] (and/or users = ["<user>"])'
            )
        return v


class ServerConfig(_Section):
    """The whole file; list sections are TOML arrays of tables (`[[nodes]]`, `[[users]]`...)."""

    server: ServerSection = Field(default_factory=ServerSection, description="[server]")
    backend: dict[str, Any] = Field(default_factory=dict, description="[backend] options for the backend.")
    nodes: tuple[NodeConfig, ...] = Field(
        default=(), description="[[nodes]]; empty = the backend's inventory."
    )
    resource_packages: tuple[ResourcePackage, ...] = Field(default=(), description="[[resource_packages]]")
    groups: tuple[GroupConfig, ...] = Field(default=(), description="[[groups]]")
    users: tuple[UserConfig, ...] = Field(default=(), description="[[users]]")
    storages: dict[int, StorageConfig] = Field(
        default_factory=dict, description="[storages.<id>] project storages and who may mount them."
    )
    paths: PathsSection = Field(default_factory=PathsSection, description="[paths]")
    checkpoints: CheckpointsSection = Field(default_factory=CheckpointsSection, description="[checkpoints]")
    git: GitSection = Field(default_factory=GitSection, description="[git] where jobs may clone code from")
    limits: LimitsSection = Field(default_factory=LimitsSection, description="[limits] budgets per user")

    @model_validator(mode="after")
    def _references_resolve(self) -> ServerConfig:
        _unique("nodes", "name", [n.name for n in self.nodes])
        _unique("resource_packages", "id", [p.id for p in self.resource_packages])
        _unique("groups", "name", [g.name for g in self.groups])
        _unique("users", "name", [u.name for u in self.users])
        _unique("users", "token", [u.token for u in self.users if u.token])
        groups = {g.name for g in self.groups}
        users = {u.name for u in self.users}
        for i, u in enumerate(self.users):
            if u.group not in groups:
                raise ValueError(
                    f"users[{i}].group: group {u.group!r} of user {u.name!r} is not defined; "
                    f"add a [[groups]] entry with name = {u.group!r}"
                )
        for i, u in enumerate(self.users):
            for entry in u.acts_for:
                problem = entry_problem(entry, users, groups)
                if problem is not None:
                    raise ValueError(f"users[{i}].acts_for: {problem}")
        for sid, storage in self.storages.items():
            for owner_group in storage.groups:
                if owner_group not in groups:
                    raise ValueError(
                        f"storages.{sid}.groups: group {owner_group!r} is not defined; add a [[groups]] entry"
                    )
            for owner in storage.users:
                if owner not in users:
                    raise ValueError(
                        f"storages.{sid}.users: {owner!r} is not a configured user; add a [[users]] entry"
                    )
        for i, g in enumerate(self.groups):
            for admin in g.admins:
                if admin not in users:
                    raise ValueError(
                        f"groups[{i}].admins: {admin!r} is not a configured user; add a [[users]] entry"
                    )
        return self


def _unique(section: str, key: str, values: Sequence[object]) -> None:
    seen: set[object] = set()
    for i, v in enumerate(values):
        if v in seen:
            raise ValueError(f"{section}[{i}].{key}: {v!r} appears twice; each {key} must be unique")
        seen.add(v)


class ConfigError(Exception):
    """The config file cannot be used: which file, which field, what to do."""

    def __init__(self, path: Path | None, field: str | None, problem: str):
        self.path = path
        self.field = field
        self.problem = problem
        where = f" {path}" if path else ""
        at = f" at {field}" if field else ""
        super().__init__(f"bad config{where}{at}: {problem}. Fix the file and start `hai serve` again.")


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if part == "[key]":  # pydantic's marker for "the key itself was bad"
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse_config(text: str, path: Path | None = None, policies: Sequence[str] | None = None) -> ServerConfig:
    """Parse and validate TOML text; raise `ConfigError` naming the field."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, None, f"not valid TOML ({e})") from None
    try:
        config = ServerConfig.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        msg = str(err["msg"]).removeprefix("Value error, ")
        field = _loc(tuple(err["loc"])) or None
        if field is None and ": " in msg:
            # cross-field rules put the field first: "users[1].group: ..."
            field, msg = msg.split(": ", 1)
        raise ConfigError(path, field, msg) from None
    if policies is not None and config.server.policy not in policies:
        known = ", ".join(sorted(policies))
        raise ConfigError(path, "server.policy", f"unknown policy {config.server.policy!r} (known: {known})")
    return config


def load_config(path: Path, policies: Sequence[str] | None = None) -> ServerConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(path, None, f"cannot read it ({e.strerror})") from None
    return parse_config(text, path, policies)


def default_packages(gpu_types: Sequence[str]) -> list[ResourcePackage]:
    """The document's packages (457 = 8xV100), smaller V100 ones, a CPU one, and any detected GPU type."""
    packages = [
        ResourcePackage(id=100, name="CPU 8 cores", gpu_type="CPU", gpus=0, cpus=8, memory_gb=32),
        ResourcePackage(id=454, name="1xV100", gpu_type="V100", gpus=1, cpus=4, memory_gb=32),
        ResourcePackage(id=455, name="2xV100", gpu_type="V100", gpus=2, cpus=8, memory_gb=64),
        ResourcePackage(id=456, name="4xV100", gpu_type="V100", gpus=4, cpus=16, memory_gb=128),
        ResourcePackage(id=457, name="8xV100", gpu_type="V100", gpus=8, cpus=32, memory_gb=256),
    ]
    next_id = 460
    for gpu_type in dict.fromkeys(gpu_types):
        if gpu_type == "V100":
            continue
        for n in (1, 2, 4, 8):
            packages.append(
                ResourcePackage(
                    id=next_id,
                    name=f"{n}x{gpu_type}",
                    gpu_type=gpu_type,
                    gpus=n,
                    cpus=4 * n,
                    memory_gb=32 * n,
                )
            )
            next_id += 1
    return packages


def default_nodes(detected: Sequence[NodeConfig] | None) -> list[NodeConfig]:
    """Detected GPUs when there are any, else one node of 8 virtual V100s."""
    if detected:
        return list(detected)
    return [NodeConfig(name="local", gpu_type="V100", gpus=8, cpus=64, memory_gb=512, virtual=True)]


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _table(header: str, model: BaseModel) -> str:
    lines = [header]
    for key, value in model.model_dump(exclude_none=True).items():
        lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def default_config_text(
    detected: Sequence[NodeConfig] | None,
    os_user: str | None = None,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
) -> str:
    """The config `hai serve` writes on first start (the OS user administers everything), listening
    where that first start was told to."""
    user = os_user or getpass.getuser()
    nodes = default_nodes(detected)
    parts = [
        "# hai serve configuration, written on first start. Edit it and restart `hai serve`.\n",
        "[server]\n"
        'backend = "local"\n'
        'policy = "seed"\n'
        f'host = "{host}"\n'
        f"port = {port}\n"
        '# database_url = "postgresql+psycopg://user@host/db"  # default: SQLite at $HAI_HOME/hai.db\n',
        "[backend]\n",
    ]
    parts += [_table("[[nodes]]", n) for n in nodes]
    parts += [_table("[[resource_packages]]", p) for p in default_packages([n.gpu_type for n in nodes])]
    parts.append(_table("[[groups]]", GroupConfig(name="default", admins=(user,))))
    parts.append(_table("[[users]]", UserConfig(name=user, group="default", role="platform_admin")))
    parts.append(
        "[paths]\n"
        "# Where code paths, model dirs and data may lie; {user} and {group} are the job owner's.\n"
        "# Unset: anywhere but system paths, the Docker socket and other jobs' dirs in $HAI_HOME.\n"
        '# allowed = ["/nas/{user}", "/nas/groups/{group}"]\n'
    )
    parts.append(
        "# Project storages and who may mount them (platform admins may mount any):\n"
        '# [storages.10111]\n# path = "/data/projects/10111"\n# groups = ["default"]\n# users = []\n'
    )
    parts.append(_table("[checkpoints]", CheckpointsSection()))
    return "\n".join(parts)
