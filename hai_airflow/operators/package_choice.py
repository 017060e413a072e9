"""Which resource package a job takes, and its GPUs: asked when a task runs, or when its DAG is parsed."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from airflow.sdk.exceptions import AirflowFailException

from hai_airflow.hooks.hai import HaiHook
from hai_airflow.scheduling.packages import offered, smallest_package
from hai_airflow.spec import DistributedJobSpec, JobSpec, ResourcePackageView, StandaloneJobSpec

PACKAGES_TTL_S = 60.0
"""How long the packages asked while a DAG file is parsed are reused: files are parsed often."""
_packages_seen: dict[str, tuple[float, tuple[ResourcePackageView, ...] | None]] = {}


def find_package(packages: Iterable[ResourcePackageView], package_id: int, field: str) -> ResourcePackageView:
    for package in packages:
        if package.id == package_id:
            return package
    raise AirflowFailException(
        f"`{field}`: resource package {package_id} does not exist; `hai res` lists them"
    )


def choose_package(
    packages: Sequence[ResourcePackageView],
    package_id: int | str | None,
    gpus: int | str | None,
    gpu_type: str | None,
    field: str,
) -> int:
    """The package to submit with: the one named, else the one `hai submit` would pick for `gpus`
    (:func:`~hai_airflow.scheduling.packages.smallest_package`: at least that many, of `gpu_type`)."""
    if package_id not in (None, ""):
        package = find_package(packages, int(package_id), field)
        if gpus not in (None, "") and package.gpus < int(gpus):
            raise AirflowFailException(
                f"`{field}`: package {package.id} ({package.name}) has {package.gpus} GPUs, "
                f"fewer than {gpus}; give only one of the two, or make them agree"
            )
        return package.id
    if gpus in (None, ""):
        raise AirflowFailException(f"`{field}` or a GPU count is required; `hai res` lists the packages")
    chosen = smallest_package(packages, int(gpus), str(gpu_type) if gpu_type else None)
    if chosen is None:
        raise AirflowFailException(
            f"no resource package has {gpus} x {gpu_type or 'any GPU'} (offered: {offered(packages)}); "
            "pick the GPU count and type from `hai res`"
        )
    return chosen.id


def packages_when_parsed(conn_id: str, timeout: float = 2.0) -> tuple[ResourcePackageView, ...] | None:
    """The server's packages for sizing a task's pool slots as its DAG file is parsed; one short
    request a minute per connection; None when the server cannot be reached."""
    asked = _packages_seen.get(conn_id)
    if asked is not None and time.monotonic() - asked[0] < PACKAGES_TTL_S:
        return asked[1]
    hook = HaiHook(conn_id, timeout=timeout)
    packages: tuple[ResourcePackageView, ...] | None
    try:
        packages = tuple(hook.get_conn().resource_packages())
    # parsing must go on whatever the failure (no connection, server down, a refusal)
    except Exception:
        packages = None
    finally:
        hook.close()
    _packages_seen[conn_id] = (time.monotonic(), packages)
    return packages


def chosen_gpus(
    packages: Sequence[ResourcePackageView] | None,
    package_id: int | str | None,
    gpus: int | str | None,
    gpu_type: str | None,
) -> int | None:
    """GPUs of the package `choose_package` would take, from literal arguments only; without the
    server's packages, the GPUs asked for; None when templated or not choosable."""
    package_id = package_id if isinstance(package_id, int) else None
    gpus = gpus if isinstance(gpus, int) else None
    if packages is None or (package_id is None and gpus is None):
        return gpus
    if gpu_type is not None and "{{" in gpu_type:
        return gpus
    try:
        chosen = choose_package(packages, package_id, gpus, gpu_type, "package")
        return find_package(packages, chosen, "package").gpus
    except AirflowFailException:
        return None


def job_gpus(spec: JobSpec, packages: Sequence[ResourcePackageView]) -> int:
    """GPUs the job holds: the package's GPUs, times the workers of a distributed job."""
    if isinstance(spec, StandaloneJobSpec):
        return find_package(packages, spec.resource_pkg, "resource_pkg").gpus
    if isinstance(spec, DistributedJobSpec):
        return spec.workers * find_package(packages, spec.worker_resource_pkg, "worker_resource_pkg").gpus
    return 0
