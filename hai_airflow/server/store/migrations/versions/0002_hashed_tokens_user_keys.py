"""Tokens kept only as keyed hashes; client_key unique per user, not across users; a settings table."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from hai_airflow.server.store.tokens import key_check, token_hash

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_NAMES = {"uq": "uq_%(table_name)s_%(column_0_name)s"}
"""Names SQLite's unnamed unique constraints get when batch mode reflects them, so they can be dropped."""


def _token_key() -> bytes:
    key = context.config.attributes.get("token_key")
    if key is None:
        raise RuntimeError("converting stored tokens needs the server key: upgrade by starting hai serve")
    return bytes(key)


def _unique_on(table: str, column: str) -> str:
    """The name of the single-column unique constraint 0001 created without a name."""
    for uc in sa.inspect(op.get_bind()).get_unique_constraints(table):
        if uc["column_names"] == [column] and uc.get("name"):
            return str(uc["name"])
    return f"uq_{table}_{column}"


def upgrade() -> None:
    settings = op.create_table(
        "store_settings",
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        # Pages freed by the table copies below are zeroed, so no plaintext token stays in the file.
        op.execute("PRAGMA secure_delete = ON")
    tokens = list(bind.execute(sa.text("SELECT name, token FROM users")))
    with op.batch_alter_table("users", naming_convention=_NAMES) as batch:
        batch.add_column(sa.Column("token_hash", sa.String(64), nullable=True))
    if tokens:
        key = _token_key()
        for name, token in tokens:
            bind.execute(
                sa.text("UPDATE users SET token_hash = :h WHERE name = :n"),
                {"h": token_hash(key, token), "n": name},
            )
        op.bulk_insert(settings, [{"name": "token_key_check", "value": key_check(key)}])
    users_token = _unique_on("users", "token")
    with op.batch_alter_table("users", naming_convention=_NAMES) as batch:
        batch.drop_constraint(users_token, type_="unique")
        batch.drop_column("token")
        batch.alter_column("token_hash", existing_type=sa.String(64), nullable=False)
        batch.create_unique_constraint("uq_users_token_hash", ["token_hash"])
    jobs_key = _unique_on("jobs", "client_key")
    with op.batch_alter_table("jobs", naming_convention=_NAMES) as batch:
        batch.drop_constraint(jobs_key, type_="unique")
        batch.create_unique_constraint("uq_jobs_user_client_key", ["user_name", "client_key"])


def downgrade() -> None:
    raise NotImplementedError("tokens cannot be recovered from their hashes; restore a backup instead")
