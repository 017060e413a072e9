"""An admin's drain of a node: no new placement there until undrained; a restart keeps it."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("drained", sa.Boolean, nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("drained_by", sa.String(200), nullable=True))
        batch.add_column(sa.Column("drained_at", sa.Float, nullable=True))
        batch.add_column(sa.Column("drain_reason", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("drain_reason")
        batch.drop_column("drained_at")
        batch.drop_column("drained_by")
        batch.drop_column("drained")
