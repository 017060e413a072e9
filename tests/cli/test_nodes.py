"""`hai nodes` and `hai node drain|undrain` against a real `hai serve` with two nodes: the listing in
each format and to each user, and a drain from its start to its undrain."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.conftest import Hai, json_out
from tests.cli.test_live import as_user, created_id, wait_for
from tests.support.live_server import TEST_CONFIG, LiveServer, start_server

NODE2 = """
[[nodes]]
name = "node2"
gpu_type = "V100"
gpus = 8
cpus = 64
memory_gb = 512
"""

UNTIL_RELEASED = """\
import pathlib, time
while not pathlib.Path("released").exists():
    time.sleep(0.05)
"""

FULL = "needs 8xV100 on one node; largest free block is 0"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    """node1 and node2, 8 V100s each; the users of `TEST_CONFIG`."""
    with start_server(tmp_path / "hai", TEST_CONFIG + NODE2) as live:
        yield live


@pytest.fixture
def code(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "until_released.py").write_text(UNTIL_RELEASED, encoding="utf-8")
    return code


def create(hai: Hai, server: LiveServer, user: str, name: str, code: Path, cmd: str) -> int:
    result = hai(
        "create", f"--task-name={name}", "--resource-pkg=457", f"--code-path={code}", f"--cmd={cmd}",
        env=as_user(server, user),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return created_id(result.stdout)


def reason_of(hai: Hai, server: LiveServer, task: int) -> str | None:
    """Why the task waits, as `hai task -o json` says (the admin sees every task)."""
    reason: str | None = json_out(hai("task", str(task), "--json", env=as_user(server, "admin")))["reason"]
    return reason


def until_reason(hai: Hai, server: LiveServer, task: int, wanted: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (seen := reason_of(hai, server, task)) != wanted:
        assert time.monotonic() < deadline, f"task {task} waits because {seen!r}, not {wanted!r}"
        time.sleep(0.1)


def rows(stdout: str) -> dict[str, list[str]]:
    """A plain (piped) listing by its first column, each row split on runs of two spaces or more."""
    lines = stdout.splitlines()
    return {line.split()[0]: [c.strip() for c in line.split("  ") if c.strip()] for line in lines}


def test_nodes_listing_drain_and_undrain(hai: Hai, server: LiveServer, code: Path) -> None:
    admin, alice, bob, dave = (as_user(server, u) for u in ("admin", "alice", "bob", "dave"))

    listing = hai("nodes", env=dave)
    assert listing.exit_code == 0, listing.output
    table = rows(listing.stdout)
    assert table["NAME"] == ["NAME", "GPU TYPE", "GPUS", "FREE", "USED", "RESERVED", "TASKS", "STATE"]
    for name in ("node1", "node2"):
        assert table[name] == [name, "V100", "8", "8", "0", "0", "0", "ready"]
    assert hai("nodes", "-o", "name", env=dave).stdout == "node1\nnode2\n"
    assert hai("nodes", "-o", "csv", env=dave).stdout.splitlines() == [
        "NAME,GPU TYPE,GPUS,FREE,USED,RESERVED,TASKS,STATE,TASK IDS,CPUS,MEMORY,DRAINED",
        "node1,V100,8,8,0,0,0,ready,,0/64,0/512 GB,",
        "node2,V100,8,8,0,0,0,ready,,0/64,0/512 GB,",
    ]

    filler = create(hai, server, "alice", "filler", code, "sleep 300")
    finisher = create(hai, server, "alice", "finisher", code, "python3 until_released.py")
    wait_for(server, filler, {"RUNNING"})
    wait_for(server, finisher, {"RUNNING"})
    on = {n["tasks"][0]["id"]: n["name"] for n in json_out(hai("nodes", "-o", "json", env=alice))}
    node = on[finisher]

    # Everyone sees every node; others' tasks count, by id, but are not named.
    for env, shown in ((alice, "alice"), (bob, "another user's job"), (dave, "another user's job")):
        seen = {n["name"]: n for n in json_out(hai("nodes", "--json", env=env))}
        (task,) = seen[node]["tasks"]
        assert (task["id"], task.get("user", task.get("owner"))) == (finisher, shown)
        wide = rows(hai("nodes", "-o", "wide", env=env).stdout)
        assert wide[node][2:] == ["8", "0", "8", "0", "1", "ready", f"{finisher} ({shown})", "32/64",
                                  "256/512 GB", "-"]  # fmt: skip
        assert ("finisher" in hai("nodes", "-o", "yaml", env=env).stdout) == (shown == "alice")

    # Only a platform admin drains; an unknown node is named.
    for env in (alice, as_user(server, "carol")):
        refused = hai("node", "drain", node, "--reason", "mine", env=env)
        assert refused.exit_code == 1 and refused.stdout == ""
        assert refused.stderr == "Error: only a platform admin can drain nodes. Ask the platform admin.\n"
    unknown = hai("node", "drain", "nowhere", env=admin)
    assert unknown.exit_code == 1
    assert unknown.stderr == "Error: node nowhere not found. See the nodes with `hai nodes`.\n"

    drained = hai("node", "drain", node, "--reason", "disk swap", env=admin)
    assert drained.exit_code == 0, drained.output
    assert drained.stdout == f"node {node} is draining: no new tasks start there; 1 task still running\n"
    assert rows(hai("nodes", env=dave).stdout)[node][-1] == "draining"

    # A task that fits only on the drained node waits; the drained node's own task ends as it would.
    waiter = create(hai, server, "dave", "waiter", code, "sleep 300")
    until_reason(hai, server, waiter, FULL)
    (code / "released").touch()
    ended = hai("wait", str(finisher), env=alice)
    assert ended.exit_code == 0 and "SUCCEEDED" in ended.stdout, ended.output
    until_reason(hai, server, waiter, f"{FULL}; node {node} has room but is drained")
    assert json_out(hai("task", str(waiter), "--json", env=dave))["state"] == "PENDING"
    wide = rows(hai("nodes", "-o", "wide", env=dave).stdout)[node]
    assert wide[7] == "drained" and wide[-1].startswith("by admin ") and wide[-1].endswith(": disk swap")
    again = hai("node", "drain", node, env=admin)
    assert again.stdout == f"node {node} is drained: no new tasks start there\n"

    # Undrained, the waiting task starts there.
    undrained = hai("node", "undrain", node, "-o", "json", env=admin)
    assert undrained.exit_code == 0 and json_out(undrained)["state"] == "ready"
    running = wait_for(server, waiter, {"RUNNING"})
    assert [w.node for w in running.placement] == [node]


def test_node_alone_prints_help_and_drain_needs_a_name(hai: Hai, server: LiveServer) -> None:
    admin = as_user(server, "admin")
    alone = hai("node", env=admin)
    assert alone.exit_code == 0 and "drain" in alone.stdout and "undrain" in alone.stdout
    missing = hai("node", "drain", env=admin)
    assert missing.exit_code == 2 and missing.stderr.startswith("Error: ")
