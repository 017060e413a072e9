"""Alembic environment: runs on the connection the server hands over (see `Store.migrate`)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from hai_airflow.server.store.tables import Base

config = context.config


def _run(connection: Connection) -> None:
    # render_as_batch lets later revisions ALTER tables on SQLite too.
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    # Command-line use (`alembic -x url=...`): open our own connection.
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    with create_engine(str(url)).begin() as conn:
        _run(conn)
