"""`hai airflow ...`: keep Airflow in step with the platform (today: the quota pools)."""

from __future__ import annotations

from typing import Annotated

import typer

from hai_airflow.cli.connection import ServerFlags, connect
from hai_airflow.cli.flags import with_flags
from hai_airflow.cli.output import Column, OutputFlags, emit, fail, help_without_subcommand

app = typer.Typer(
    name="airflow",
    help="Airflow integration: mirror group quotas into Airflow pools.",
    invoke_without_command=True,
)


@app.callback()
def airflow_group(ctx: typer.Context) -> None:
    """Airflow integration: mirror group quotas into Airflow pools."""
    help_without_subcommand(ctx)


POOL_COLUMNS = (
    Column("POOL", lambda c: c.pool),
    Column("GROUP", lambda c: c.group),
    Column("SLOTS", lambda c: "unlimited" if c.slots == -1 else c.slots, justify="right"),
    Column("ACTION", lambda c: c.action),
)


@app.command("sync-pools")
@with_flags()
def sync_pools_command(
    conn_id: Annotated[
        str | None,
        typer.Option(
            "--conn-id",
            help="Read the quotas through this Airflow connection (type hai) instead of --server.",
            show_default=False,
        ),
    ] = None,
    keep_stale: Annotated[
        bool, typer.Option("--keep-stale", help="Keep hai_<group> pools of groups that no longer exist.")
    ] = False,
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """Create or update the Airflow pool hai_<group> of every resource group: slots = its GPU quota.

    High-priority hai tasks take as many slots of their group's pool as they hold GPUs, so
    Airflow queues them the way the platform's quota would. Run it where Airflow's metadata
    database is configured (AIRFLOW_HOME); the Airflow services also run it when they start.
    """
    try:
        from hai_airflow.airflow_plugin.pools import apply_pools
        from hai_airflow.hooks.hai import HaiHook
    except ImportError as e:
        fail(f"Airflow is not installed here ({e}). Install it with: pip install 'hai-airflow[airflow]'", 1)
    if conn_id:
        hook = HaiHook(conn_id)
        try:
            quotas = hook.get_conn().quotas()
        except Exception as e:
            fail(
                f"cannot read quotas via Airflow connection {conn_id!r} ({e}). Fix that connection",
                1,
            )
        finally:
            hook.close()
    else:
        with connect(connection) as client:
            quotas = client.quotas()
    try:
        changes = apply_pools(quotas, delete_stale=not keep_stale)
    except Exception as e:
        fail(
            f"could not write the Airflow pools ({type(e).__name__}: {e}). Run it where Airflow's metadata "
            "database is configured (AIRFLOW_HOME) and `airflow db migrate` has run",
            1,
        )
    emit(
        changes,
        POOL_COLUMNS,
        out=out,
        title="Airflow pools",
        empty="no resource groups to mirror",
        name=lambda c: c.pool,
    )
