"""What every backend does the same way with a launch, the handle it saved for one, and its exit."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from hai_airflow.backends.base import Exit, Handle, Launch
from hai_airflow.spec import DistributedJobSpec


def image_of(launch: Launch) -> str:
    """The image every worker runs: the worker image of a distributed job, else the job's image."""
    spec = launch.spec
    if isinstance(spec, DistributedJobSpec) and spec.worker_image:
        return spec.worker_image
    return spec.image


def handle_data(handle: Handle, backend: str) -> Mapping[str, Any]:
    """A saved handle's data, once it is known to be `backend`'s; ValueError names the other one."""
    data = handle.data
    if data.get("backend") != backend:
        raise ValueError(f"it belongs to the {data.get('backend')!r} backend")
    return data


Adopted = TypeVar("Adopted")


def read_handles(
    handles: list[Handle], backend: str, read: Callable[[Handle], Adopted]
) -> tuple[list[Adopted], list[Exit]]:
    """Each saved handle read back by `read`; one it cannot read ends its instance as lost, saying why."""
    adopted, lost = [], []
    for handle in handles:
        try:
            adopted.append(read(handle))
        except (KeyError, TypeError, ValueError) as e:
            reason = f"the {backend} backend cannot read the instance's handle ({e!r})"
            lost.append(Exit(handle.instance_id, None, reason, lost=True))
    return adopted, lost


def exit_words(code: int | None, oom: bool = False) -> str:
    """How an exit code reads in an instance's end reason."""
    if code is None:
        return "no exit code"
    if oom:
        return f"killed for exceeding its memory limit (exit code {code})"
    if code == 0:
        return "completed"
    if code > 128:
        return f"killed by signal {code - 128} (exit code {code})"
    return f"exit code {code}"
