"""Job arrays (`--array 0-9%2`): each task's array (its first task's id), index and limit."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("array_id", sa.Integer, nullable=True))
        batch.add_column(sa.Column("array_index", sa.Integer, nullable=True))
        batch.add_column(sa.Column("array_limit", sa.Integer, nullable=True))
        batch.create_index("ix_jobs_array", ["array_id"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_array")
        batch.drop_column("array_limit")
        batch.drop_column("array_index")
        batch.drop_column("array_id")
