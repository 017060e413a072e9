"""What every backend reads the same way from a launch, or from the handle it saved for one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hai_airflow.backends.base import Handle, Launch
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
