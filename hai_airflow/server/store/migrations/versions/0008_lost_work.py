"""What each run lost to a preemption, as GPU-seconds, kept for accounting (`hai usage`)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Runs that ended before this revision lost what they lost; only the metric counted it.
    with op.batch_alter_table("instances") as batch:
        batch.add_column(sa.Column("lost_gpu_seconds", sa.Float, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("lost_gpu_seconds")
