"""Resizable distributed jobs: their least workers, the size they run at after a resize, and the
GPUs each run holds (a resized job's runs differ in size)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("min_workers", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("size", sa.Integer(), nullable=True))
    with op.batch_alter_table("instances") as batch:
        batch.add_column(sa.Column("gpus", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("gpus")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("size")
        batch.drop_column("min_workers")
