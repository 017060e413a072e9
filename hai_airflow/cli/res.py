"""`hai res`: the resource packages a job can ask for, and how many of each could start now."""

from __future__ import annotations

from hai_airflow.cli.columns import PACKAGE_COLUMNS
from hai_airflow.cli.connection import ServerFlags, connect
from hai_airflow.cli.flags import with_flags
from hai_airflow.cli.output import OutputFlags, emit

__all__ = ["PACKAGE_COLUMNS"]


@with_flags()
def res(connection: ServerFlags = ServerFlags(), out: OutputFlags = OutputFlags()) -> None:
    """List the resource packages (列出资源套餐); use an ID with --resource-pkg."""
    with connect(connection) as client:
        packages = client.resource_packages()
    emit(packages, PACKAGE_COLUMNS, out=out, empty="the server offers no resource packages")
