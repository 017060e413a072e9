"""What a launch mounts: the job's chosen paths, checked against the path rule right before use."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hai_airflow.backends.common.base import Launch
from hai_airflow.backends.common.confine import PathRefused, PathRules, confine, storage_problem


def launch_rules(launch: Launch, protected: Sequence[str] = ()) -> PathRules:
    """The rules a backend applies at launch: the server's for the job, plus what the backend guards."""
    base = launch.paths or PathRules(allowed=None, home=None)
    return replace(base, protected=(*base.protected, *protected))


def job_paths(launch: Launch) -> list[tuple[str, str]]:
    """(path, field) of what the user chose that the job's containers see: code path and model dir."""
    wanted = [(launch.spec.code_path, "spec.code_path")] if launch.spec.code_src == "nas" else []
    # The server resolved the model dir (a relative one lies in the job's own directory).
    wanted.append((str(launch.job.model_dir), "spec.model_dir"))
    return wanted


@dataclass(frozen=True)
class Mount:
    """One host directory given to a job's container."""

    source: str
    """The host path with symlinks resolved at the moment of the check."""
    target: str
    """Where the job sees it: the path as the server wrote it into the job's environment."""


def launch_mounts(launch: Launch, protected: Sequence[str] = ()) -> list[Mount]:
    """Every host path an instance's containers mount, each checked against the rule now.

    Called by the backends right before they mount: a directory swapped for a symlink after
    submission is resolved here and refused. Raises `PathRefused` naming the first bad one.
    """
    rules = launch_rules(launch, protected)
    wanted = [(str(launch.work_dir), "work_dir"), *job_paths(launch)]
    mounts = {path: Mount(confine(path, rules, field), path) for path, field in wanted}
    for sid in launch.spec.project_storage:
        path = launch.storages.get(sid)
        if path is None:
            continue
        problem = storage_problem(path, rules)
        if problem is not None:
            fix = "Ask the platform admin to point [storages] at a data directory"
            raise PathRefused("spec.project_storage", path, f"project storage {sid}: {problem}", fix)
        mounts.setdefault(path, Mount(os.path.realpath(path), path))
    return list(mounts.values())
