"""Requeued jobs: the ended job each one runs again, at most one requeue per job."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("requeued_from", sa.Integer, nullable=True))
        batch.create_unique_constraint("uq_jobs_requeued_from", ["requeued_from"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint("uq_jobs_requeued_from", type_="unique")
        batch.drop_column("requeued_from")
