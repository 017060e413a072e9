"""`hai nodes`: every node, its GPUs and tasks, and whether it takes new ones; `hai node drain|undrain`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from hai_airflow.cli.connection import ServerFlags, connect
from hai_airflow.cli.flags import with_flags
from hai_airflow.cli.output import Column, OutputFlags, emit, help_without_subcommand, say, when

if TYPE_CHECKING:
    from hai_airflow.spec import NodeView

STATE_STYLES = {"ready": "green", "draining": "yellow", "drained": "magenta"}
"""Colours of node states in tables on a terminal."""


def reserved(node: NodeView) -> int:
    """GPUs kept for a waiting high-priority task that no task holds any more."""
    return len(set(node.reserved_for) - set(node.holders))


def free(node: NodeView) -> int:
    """GPUs neither held nor reserved; on a drained node too (STATE says whether tasks may start)."""
    return node.gpus - len(node.holders) - reserved(node)


def task_ids(node: NodeView) -> str | None:
    """`12 (alice), 15 (another user's job)`: the tasks on the node, others' unnamed (as `hai queue`)."""
    from hai_airflow.spec import NodeTaskView

    shown = (f"{t.id} ({t.user if isinstance(t, NodeTaskView) else t.owner})" for t in node.tasks)
    return ", ".join(shown) or None


def drained(node: NodeView) -> str | None:
    """`by admin 2025-01-02 10:00:00: disk swap` for a drained node."""
    if node.state == "ready":
        return None
    text = f"by {node.drained_by} {when(node.drained_at)}"
    return f"{text}: {node.reason}" if node.reason else text


NODE_COLUMNS = (
    Column("NAME", lambda n: n.name),
    Column("GPU TYPE", lambda n: n.gpu_type if n.gpus else None),
    Column("GPUS", lambda n: n.gpus, "right"),
    Column("FREE", free, "right"),
    Column("USED", lambda n: len(n.holders), "right"),
    Column("RESERVED", reserved, "right"),
    Column("TASKS", lambda n: len(n.tasks), "right"),
    Column("STATE", lambda n: n.state, style=lambda n: STATE_STYLES.get(n.state)),
    Column("TASK IDS", task_ids, wide=True),
    Column("CPUS", lambda n: f"{n.cpus_used:g}/{n.cpus:g}", "right", wide=True),
    Column("MEMORY", lambda n: f"{n.memory_gb_used:g}/{n.memory_gb:g} GB", "right", wide=True),
    Column("DRAINED", drained, wide=True),
)


@with_flags()
def nodes(connection: ServerFlags = ServerFlags(), out: OutputFlags = OutputFlags()) -> None:
    """List the nodes: GPUs free, used and reserved, the tasks on each, and its state (ready, draining:
    drained with tasks still running, drained: drained and empty). -o wide adds the task ids, CPUs,
    memory and who drained it why."""
    with connect(connection) as client:
        found = client.nodes()
    emit(found, NODE_COLUMNS, out=out, empty="the server has no nodes", name=lambda n: n.name)


app = typer.Typer(
    help="Drain a node (no new tasks start or resume there; those running finish) or undrain it "
    "(platform admins). `hai nodes` lists them.",
    rich_markup_mode=None,
)


@app.callback(invoke_without_command=True)
def node(ctx: typer.Context) -> None:
    """Drain or undrain a node (platform admins)."""
    help_without_subcommand(ctx)


NameArgument = Annotated[str, typer.Argument(metavar="NAME", help="The node, as `hai nodes` names it.")]


@app.command()
@with_flags()
def drain(
    name: NameArgument,
    reason: Annotated[
        str | None, typer.Option("--reason", metavar="TEXT", help="Why, shown by `hai nodes -o wide`.")
    ] = None,
    connection: ServerFlags = ServerFlags(),
    out: OutputFlags = OutputFlags(),
) -> None:
    """Start no new task on the node (nor resume one there); the tasks running on it finish as they
    would. Draining a drained node changes nothing."""
    with connect(connection) as client:
        view = client.drain_node(name, reason)
    if out.format not in ("table", "wide"):
        emit(view, NODE_COLUMNS, out=out, name=lambda n: n.name)
    elif view.state == "draining":
        tasks = f"{len(view.tasks)} task{'s' * (len(view.tasks) != 1)}"
        say(f"node {name} is draining: no new tasks start there; {tasks} still running")
    else:
        say(f"node {name} is drained: no new tasks start there")


@app.command()
@with_flags()
def undrain(
    name: NameArgument, connection: ServerFlags = ServerFlags(), out: OutputFlags = OutputFlags()
) -> None:
    """Let new tasks start on the node again."""
    with connect(connection) as client:
        view = client.undrain_node(name)
    if out.format not in ("table", "wide"):
        emit(view, NODE_COLUMNS, out=out, name=lambda n: n.name)
    else:
        say(f"node {name} is ready: new tasks may start there")
