"""The one instance table every backend follows its instances in, and the logs of those that ended."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

import hai_airflow.backends as backends
from hai_airflow.backends.common.instances import InstanceTable

TABLE_BACKENDS = ["local", "docker", "kubernetes"]
"""The backends whose live instances and ended logs are an `InstanceTable`."""


@dataclass
class Inst:
    instance_id: int
    log_path: Path
    stopping: bool = False


def test_an_added_instance_is_live_until_forgotten_then_only_its_log_is_known(tmp_path: Path) -> None:
    table: InstanceTable[Inst] = InstanceTable()
    a, b = Inst(1, tmp_path / "1.log"), Inst(2, tmp_path / "2.log")
    table.add(a)
    table.add(b)
    assert table.live() == [a, b]
    assert table.get(1) is a and table.ended_log(1) is None
    table.forget(a)
    assert table.live() == [b]
    assert table.get(1) is None
    assert table.ended_log(1) == tmp_path / "1.log"
    assert table.ended_log(2) is None


def test_an_instance_found_gone_on_adoption_is_forgotten_without_being_live(tmp_path: Path) -> None:
    table: InstanceTable[Inst] = InstanceTable()
    table.forget(Inst(7, tmp_path / "7.log"))
    assert table.live() == [] and table.ended_log(7) == tmp_path / "7.log"


def test_with_a_bound_only_the_last_ended_logs_stay_known(tmp_path: Path) -> None:
    table: InstanceTable[Inst] = InstanceTable()
    insts = [Inst(i, tmp_path / f"{i}.log") for i in range(4)]
    running = Inst(9, tmp_path / "9.log")
    table.add(running)
    for inst in insts:
        table.add(inst)
        table.forget(inst, kept=2)
    assert [table.ended_log(i) for i in range(4)] == [None, None, tmp_path / "2.log", tmp_path / "3.log"]
    assert table.knows(9) and table.knows(3) and not table.knows(0)
    assert table.live() == [running]  # a live one is never forgotten by the bound
    table.add(insts[2])
    table.forget(insts[2], kept=2)  # ended again: now the latest, so 3 goes first
    table.forget(Inst(5, tmp_path / "5.log"), kept=2)
    assert table.ended_log(3) is None and table.ended_log(2) == tmp_path / "2.log"


def test_a_stop_marks_only_a_live_instance(tmp_path: Path) -> None:
    table: InstanceTable[Inst] = InstanceTable()
    a = Inst(1, tmp_path / "1.log")
    table.add(a)
    assert table.ask_stop(1) is a and a.stopping
    table.forget(a)
    assert table.ask_stop(1) is None
    assert table.ask_stop(99) is None


def test_the_table_shares_the_lock_it_is_given() -> None:
    table: InstanceTable[Inst] = InstanceTable()
    with table.lock:  # the backend's other state changes under the same, reentrant lock
        table.add(Inst(1, Path("x")))
        assert table.get(1) is not None


def _backend_source(name: str) -> ast.Module:
    module = backends.BACKENDS[name][0]
    path = Path(backends.__file__).parent / Path(*module.split(".")[2:]).with_suffix(".py")
    return ast.parse(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", TABLE_BACKENDS)
def test_the_backend_follows_its_instances_in_the_one_table(name: str) -> None:
    """A backend with its own instance dict, ended logs or forget step would diverge from the table's rule."""
    tree = _backend_source(name)
    own = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
    }
    assert not own & {"_instances", "_live", "_ended_logs", "_ended_order", "_forget", "_keep_ended"}
    built = [
        n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "InstanceTable"
    ]
    assert built, f"the {name} backend builds no InstanceTable"
