"""A job's time limit, read by the controller every cycle, beside the spec it comes from."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Specs stored before this revision could not carry a limit (the spec refused unknown fields).
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("time_limit_seconds", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("time_limit_seconds")
