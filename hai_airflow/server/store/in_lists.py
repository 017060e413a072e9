"""Rows named by id, in IN lists short enough for every database."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from hai_airflow.server.store.tables import InstanceRow, JobRow

CHUNK = 500
"""Ids per `... WHERE id IN (...)`, well below every database's parameter limit."""

Row = TypeVar("Row", JobRow, InstanceRow)


def chunks(ids: Iterable[int]) -> Iterator[list[int]]:
    """The ids in order, `CHUNK` at a time."""
    listed = list(ids)
    for at in range(0, len(listed), CHUNK):
        yield listed[at : at + CHUNK]


def rows(s: Session, table: type[Row], ids: Iterable[int]) -> dict[int, Row]:
    """These rows by id (the missing ones left out), one query per chunk instead of one `s.get` each."""
    found: dict[int, Row] = {}
    for part in chunks(ids):
        found.update((r.id, r) for r in s.scalars(select(table).where(table.id.in_(part))))
    return found
