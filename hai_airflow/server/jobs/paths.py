"""The server's side of path confinement and storage ownership: config in, `ApiError` out."""

from __future__ import annotations

import os
from pathlib import Path

from hai_airflow.backends.common.confine import (
    PathRefused,
    PathRules,
    allowed_roots,
    confine,
    relative_problem,
)
from hai_airflow.backends.common.gitcode import is_remote, repository_problem
from hai_airflow.server.config import ServerConfig, StorageConfig
from hai_airflow.server.errors import ApiError
from hai_airflow.server.jobs.auth import Caller
from hai_airflow.spec import CpuJobSpec, DistributedJobSpec, StandaloneJobSpec

AnySpec = CpuJobSpec | StandaloneJobSpec | DistributedJobSpec
MOUNTING_BACKENDS = frozenset({"docker", "kubernetes"})
"""Backends that mount a job's paths into a container: the whole tree below a path becomes visible."""


def rules_for(
    config: ServerConfig, home: Path, user: str, group: str, own_dir: Path | None = None
) -> PathRules:
    """The path rules of one job owner (and, at launch, of the job's own directory)."""
    return PathRules(
        allowed=allowed_roots(config.paths.allowed, user, group),
        home=str(home),
        own_dir=str(own_dir) if own_dir is not None else None,
    )


def local_code_path(spec: AnySpec) -> str | None:
    """The directory on the server the job's code comes from; None for a git repository elsewhere."""
    if spec.code_src == "git" and is_remote(spec.code_path):
        return None
    # A repository on the server obeys the same roots as a NAS code path.
    return str(Path(spec.code_path).expanduser())


def spec_path_problem(config: ServerConfig, rules: PathRules, spec: AnySpec) -> PathRefused | None:
    """The first user-given path of `spec` that the rules refuse, or None."""
    whole_code_tree = config.server.backend in MOUNTING_BACKENDS
    if spec.code_src == "git":
        git = config.git
        if (bad := repository_problem(spec.code_path, git.allowed_hosts, git.schemes)) is not None:
            return PathRefused("spec.code_path", spec.code_path, *bad)
    try:
        if (code := local_code_path(spec)) is not None:
            confine(code, rules, "spec.code_path", whole_code_tree)
        if spec.model_dir:
            model_dir = str(Path(spec.model_dir).expanduser())
            if model_dir.startswith("/"):
                confine(model_dir, rules, "spec.model_dir")
            elif (problem := relative_problem(model_dir)) is not None:
                fix = "Give a path inside the job's directory without '..', or an absolute one you own"
                return PathRefused("spec.model_dir", spec.model_dir, problem, fix)
    except PathRefused as refused:
        return refused
    return None


def check_spec_paths(config: ServerConfig, home: Path, caller: Caller, spec: AnySpec) -> None:
    """Refuse (422 naming the field) a code path or model dir the caller may not use."""
    refused = spec_path_problem(config, rules_for(config, home, caller.name, caller.group), spec)
    if refused is not None:
        raise ApiError(
            422, f"{refused.path} cannot be used: {refused.reason}", field=refused.field, fix=refused.fix
        )


def may_mount(storage: StorageConfig, user: str, group: str, platform_admin: bool) -> bool:
    """Platform admins mount any storage; others only those naming them or their group."""
    return platform_admin or user in storage.users or group in storage.groups


def storage_refusal(
    config: ServerConfig, user: str, group: str, platform_admin: bool, spec: AnySpec
) -> str | None:
    """Why the job's owner may not mount one of its project storages, or None."""
    for sid in spec.project_storage:
        storage = config.storages.get(sid)
        if storage is None or may_mount(storage, user, group, platform_admin):
            continue
        owners = [*(f"group {g}" for g in storage.groups), *(f"user {u}" for u in storage.users)]
        return (
            f"project storage {sid} may be mounted only by {', '.join(owners) or 'platform admins'}; "
            f"{user} (group {group}) is not among them"
        )
    return None


def check_storage_owners(config: ServerConfig, caller: Caller, spec: AnySpec) -> None:
    """Refuse (403) a project storage the caller may not mount; an unknown id is answered the same way,
    naming only the caller's own storages, so nobody learns which ids exist or whose they are."""
    if caller.is_platform_admin:
        unknown = [sid for sid in spec.project_storage if sid not in config.storages]
        if unknown:
            known = ", ".join(str(s) for s in sorted(config.storages)) or "none configured"
            raise ApiError(
                422,
                f"unknown project storage {unknown[0]}",
                field="spec.project_storage",
                fix=f"Use a configured project storage id (known: {known}) or add it to the config",
            )
        return
    for sid in spec.project_storage:
        storage = config.storages.get(sid)
        if storage is None or not may_mount(storage, caller.name, caller.group, False):
            mine = [
                s
                for s, st in sorted(config.storages.items())
                if may_mount(st, caller.name, caller.group, False)
            ]
            raise ApiError(
                403,
                f"project storage {sid} is not one you may mount",
                field="spec.project_storage",
                fix=f"Use one of yours ({', '.join(map(str, mine)) or 'none'}), or ask the platform admin "
                "to add you or your group to it",
            )


def launch_storage_problem(config: ServerConfig, user: str, group: str, spec: AnySpec) -> str | None:
    """Why a queued job may no longer mount its storages: the config changed since it was submitted."""
    admin = any(u.name == user and u.role == "platform_admin" for u in config.users)
    return storage_refusal(config, user, group, admin, spec)


def launch_problem(config: ServerConfig, rules: PathRules, spec: AnySpec, model_dir: Path) -> str | None:
    """Why an instance may not start with its paths as they are now (a symlink may have been swapped in)."""
    refused = spec_path_problem(config, rules, spec)
    if refused is None:
        try:
            confine(str(model_dir), rules, "spec.model_dir")
        except PathRefused as e:
            refused = e
    if refused is None:
        return None
    return f"{refused.field} {refused.path} cannot be used: {refused.reason}"


def watch_root(
    config: ServerConfig, home: Path, user: str, group: str, job_id: int, model_dir: str
) -> str | None:
    """Where the checkpoint watcher walks down to a model dir from (never another job's dir, never
    `/` itself): the job's own dir or the allowed root holding it, `/` without `[paths] allowed`;
    None when it may not be scanned."""
    own = home / "jobs" / str(job_id)
    rules = rules_for(config, home, user, group, own)
    try:
        confine(model_dir, rules, "spec.model_dir")
    except PathRefused:
        return None
    written = os.path.normpath(model_dir)
    for root in (str(own), *(rules.allowed or ())):
        if written == root or written.startswith(root.rstrip("/") + "/"):
            return root
    return "/" if rules.allowed is None else None
