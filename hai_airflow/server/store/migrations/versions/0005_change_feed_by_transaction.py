"""The change feed in (transaction, id) order: PostgreSQL writers need no lock to keep it."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("changes") as batch:
        batch.add_column(sa.Column("txn", sa.BigInteger, nullable=False, server_default="0"))
        batch.create_index("ix_changes_txn_id", ["txn", "id"])


def downgrade() -> None:
    with op.batch_alter_table("changes") as batch:
        batch.drop_index("ix_changes_txn_id")
        batch.drop_column("txn")
