"""What the job flags mean as spec fields, and which resource package `hai submit` takes: the rules
both the full `hai` and the downloadable one apply before sending a job. Standard library only,
Python 3.8+; a refusal is a ValueError whose text names the flag and the fix."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hai_airflow import labels as label_rules
from hai_airflow.vocabulary import FIELD_FLAGS

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from hai_airflow.spec import ResourcePackageView


def parse_env(pairs: Sequence[str] | Mapping[str, Any] | None) -> dict[str, Any]:
    """`--env KEY=VALUE` flags as a mapping; a job file's mapping as it is (the spec checks it)."""
    if isinstance(pairs, Mapping):
        return dict(pairs)
    env: dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--env {pair!r} is not KEY=VALUE. Write it like --env LR=0.1")
        env[key] = value
    return env


def parse_labels(pairs: Sequence[str] | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`--label KEY=VALUE` flags as labels (None: none given); a job file's mapping as it is (the spec
    checks it)."""
    if isinstance(pairs, Mapping):
        return dict(pairs)
    if not pairs:
        return None
    try:
        return label_rules.parse_pairs(list(pairs))
    except ValueError as error:
        raise ValueError(f"--label: {error}. Write it like --label team=vision") from None


def job_fields(values: Mapping[str, Any]) -> dict[str, Any]:
    """The job flags (`flagtable.JOB_FLAGS`, by their dest) as spec fields; None = not given, so the
    spec's default applies."""
    given = {f: values[f] for f in ("model_id", "project_id", "code_src", "git_branch", "model_dir")}
    given.update({f: values[f] for f in ("project_storage", "max_schedule", "shm", "after", "after_any")})
    given.update(
        env=parse_env(values["env"]),
        time_limit_seconds=values["time_limit"],
        labels=parse_labels(values["label"]),
    )
    return given


def gpu_job_fields(values: Mapping[str, Any]) -> dict[str, Any]:
    """`--processes`, `--elastic`, `--grace` as spec fields (None = not given, so the spec's default
    for the mode applies: without --elastic, a task with --min-workers is elastic, any other is not)."""
    elastic = values["elastic"] or None
    return {"processes": values["processes"], "elastic": elastic, "grace_seconds": values["grace"]}


def join_command(words: Sequence[str]) -> str:
    """One quoted string stays as written; several words are joined as the shell would read them."""
    if len(words) == 1:
        return words[0]
    return " ".join(shlex.quote(word) for word in words)


def image_fields(mode: str, image: str | None, worker_image: str | None) -> dict[str, Any]:
    """--image and --worker-image as spec fields: a distributed task's workers run --worker-image, else
    --image; a CPU or standalone task has one worker, so there --worker-image is its --image."""
    if mode == "distributed":
        return {"image": image or worker_image, "worker_image": worker_image}
    if image and worker_image and image != worker_image:
        raise ValueError(
            f"--image {image} and --worker-image {worker_image} name two images for a {mode} task, which "
            "runs one. Give only one of them"
        )
    return {"image": image or worker_image}


def absolute_code_path(data: dict[str, Any]) -> dict[str, Any]:
    """A relative NAS code path means the directory as seen from here, as `cd` would read it.

    The server accepts only absolute paths; a git URL is not a path and stays as written.
    """
    path = data.get("code_path")
    if data.get("code_src", "nas") != "nas" or not isinstance(path, str) or not path or os.path.isabs(path):
        return data
    return {**data, "code_path": os.path.abspath(os.path.expanduser(path))}


def create_fields(values: Mapping[str, Any]) -> dict[str, Any]:
    """`hai create`'s flags as spec fields, for its --mode."""
    mode = values["mode"]
    fields: dict[str, Any] = {f: values[f] for f in ("task_name", "code_path", "cmd", "gpu_type")}
    fields.update(image_fields(mode, values["image"], values["worker_image"]))
    fields.update(job_fields(values))
    fields.update(gpu_job_fields(values))
    # Passed in every mode: a CPU task takes them, and another mode's spec refuses them by flag.
    fields.update(cpus=values.get("cpus"), memory_gb=values.get("memory"))
    worker_pkg = values["worker_resource_pkg"]
    fields.update(workers=values["workers"], min_workers=values["min_workers"])
    if mode == "distributed":
        fields["worker_resource_pkg"] = worker_pkg if worker_pkg is not None else values["resource_pkg"]
    else:
        # Passed through so the spec itself refuses worker flags on a standalone job, naming the flag.
        fields.update(resource_pkg=values["resource_pkg"], worker_resource_pkg=worker_pkg)
    return fields


def short_form_fields(mode: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """`hai submit standalone|cpu`'s flags as spec fields, the resource package left to `package_for`."""
    fields = {"task_name": values["task_name"], "code_path": values["code_path"]}
    fields["cmd"] = join_command(values["command"])
    fields.update(job_fields(values))
    if mode == "cpu":
        fields.update(image=values["image"], cpus=values["cpus"], memory_gb=values["memory"])
        return fields
    fields.update(gpu_job_fields(values))
    fields.update(image_fields(mode, values["image"], values.get("worker_image")))
    return fields


def flag_for(field: str, flags: Mapping[str, str]) -> str:
    """The flag a user types for a spec field (`flags`: those not spelled `--field-name`)."""
    return flags.get(field, "--" + field.replace("_", "-"))


def in_flags(message: str, flags: Mapping[str, str]) -> str:
    """The server's refusal of a spec (`spec.task_name is required`) naming flags instead of fields."""
    return re.sub(r"\bspec\.([a-z_]+)", lambda m: flag_for(m[1], flags), message)


def submit_refusal(message: str, field: str, bad_input: bool, flags: Mapping[str, str], command: str) -> str:
    """The server's refusal of a submit as both CLIs word it: spec fields named as the command's flags,
    the field named where the words do not, and a refusal of the input pointing at the command's help."""
    text = in_flags(message, flags)
    named = in_flags(field, flags)
    if named and named not in text:
        text = f"{text} (field {named})"
    return f"{text.rstrip('.')}. See `hai {command} --help`" if bad_input else text


SUBMIT_FLAG_NAMES = {
    "resource_pkg": "--gpus",
    "worker_resource_pkg": "--gpus",
    "cmd": "CMD",
    "grace_seconds": "--grace",
    "time_limit_seconds": "--time-limit",
    "memory_gb": "--memory",
}
"""The flag `hai submit` takes for a spec field that is not `--field-name`."""
CREATE_FLAG_NAMES = {field: "--" + key.replace("_", "-") for field, key in FIELD_FLAGS.items()}
"""The same for `hai create`: `vocabulary.FIELD_FLAGS` as flags (the job-file keys, spelled as flags)."""


@dataclass(frozen=True)
class GpuAsk:
    """What the flags ask for: --gpus GPUs (per worker when distributed) of --gpu-type, --exact or not."""

    gpus: int
    gpu_type: str | None
    exact: bool
    per_worker: bool = False


def _sizes(packages: Sequence[ResourcePackageView], gpu_type: str | None) -> list[int]:
    """The GPU counts of the packages of `gpu_type` (any type when None), smallest first."""
    from hai_airflow.scheduling.packages import smallest_package

    # A package holds `gpu_type` exactly when it is the smallest fit among itself alone.
    return sorted({p.gpus for p in packages if p.gpus and smallest_package([p], p.gpus, gpu_type) is p})


def package_for(
    packages: Sequence[ResourcePackageView], ask: GpuAsk
) -> tuple[ResourcePackageView, str | None]:
    """The smallest package of at least --gpus GPUs of --gpu-type, and a note naming it when it holds
    more than asked (None when it fits exactly); ValueError when none fits, or none exactly with --exact."""
    # The scheduler's package rule; importing it costs the planner, so only a submit pays.
    from hai_airflow.scheduling.packages import offered, smallest_package

    if ask.gpus < 1:
        raise ValueError("--gpus must be 1 or more. For a task without GPUs use `hai submit cpu`")
    package = smallest_package(packages, ask.gpus, ask.gpu_type)
    if package is None:
        raise ValueError(
            f"no resource package has {ask.gpus} {ask.gpu_type or ''} GPUs".replace("  ", " ")
            + f" (offered: {offered(packages)}). Pick --gpus and --gpu-type from `hai res`"
        )
    if package.gpus == ask.gpus:
        return package, None
    if ask.exact:
        *most, last = [str(n) for n in _sizes(packages, ask.gpu_type)]
        sizes = f"{', '.join(most)} or {last}" if most else last
        raise ValueError(
            f"--gpus {ask.gpus} --exact: no {package.gpu_type} resource package has exactly {ask.gpus} "
            f"GPUs. Give --gpus {sizes}, or leave out --exact to get the smallest that fits "
            f"({package.gpus} GPUs)"
        )
    asked = f"{ask.gpus} GPUs per worker" if ask.per_worker else f"{ask.gpus} GPUs"
    fits = f"(asked for {asked}; the smallest package that fits)"
    return package, f"package {package.id}: {package.gpus}×{package.gpu_type} {fits}"
