"""Kept logs, and the notice of a stop: written the same way by every backend."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from hai_airflow.backends.common.base import Handle
from hai_airflow.backends.common.instances import InstanceTable
from hai_airflow.backends.common.live_logs import ServedLogs, WorkerLog
from hai_airflow.backends.common.log_files import UnreadableLog, keep_log
from hai_airflow.backends.common.notice import give_notice
from tests.backends.test_instances import Inst


class Served(ServedLogs):
    """A backend that serves its workers' logs, its instances in the one table."""

    name = "served"

    def __init__(self, home: Path) -> None:
        self.home = home
        self._table: InstanceTable[Inst] = InstanceTable()

    def worker_logs(self, handle: Handle) -> list[WorkerLog]:
        return [WorkerLog("worker", lambda follow, tail: [b"2026-01-01T00:00:00Z live line\n"])]

    def running_handle(self, instance_id: int) -> Handle | None:
        return Handle(instance_id, {}) if self._table.get(instance_id) is not None else None


def test_an_ended_instance_s_log_is_read_from_where_it_was_kept(tmp_path: Path) -> None:
    backend = Served(tmp_path)
    inst = Inst(3, tmp_path / "logs" / "3.log")
    backend._table.add(inst)
    assert "live line" in backend.read_log(3)
    keep_log(3, inst.log_path, b"kept line\n", tmp_path)
    backend._table.forget(inst)
    assert backend.read_log(3) == "kept line\n"
    assert list(backend.follow_log(3)) == ["kept line\n"]
    with pytest.raises(KeyError, match="not known to the served backend"):
        backend.read_log(4)


def test_a_kept_log_is_private_and_an_unreadable_source_keeps_its_note(tmp_path: Path) -> None:
    path = tmp_path / "work" / "1.log"
    keep_log(1, path, [b"a\n", b"b\n"], tmp_path)
    assert path.read_bytes() == b"a\nb\n" and path.stat().st_mode & 0o777 == 0o600

    def broken() -> Iterator[bytes]:
        yield b"half a line"
        raise UnreadableLog("[hai] the logs could not be read\n")

    keep_log(1, path, broken(), tmp_path)
    assert path.read_text() == "[hai] the logs could not be read\n"


def test_a_log_or_notice_that_cannot_be_written_is_a_warning_not_a_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "file").write_text("")
    with caplog.at_level(logging.WARNING):
        keep_log(5, tmp_path / "file" / "5.log", b"x", tmp_path)
        give_notice(tmp_path / "file" / "notice.json", 5, 30, tmp_path)
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("cannot keep the log of instance 5") for m in said)
    assert any(m.startswith("cannot write the notice of instance 5") for m in said)


def test_a_notice_names_its_instance_and_grace(tmp_path: Path) -> None:
    path = tmp_path / "work" / "notice.json"
    give_notice(path, 8, 30, tmp_path)
    assert '"instance_id": 8' in path.read_text() and '"grace_seconds": 30' in path.read_text()
