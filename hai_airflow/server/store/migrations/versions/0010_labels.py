"""A job's labels as a selector matches them (`,key=value,` sorted), beside the spec they come from."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Specs stored before this revision could not carry labels (the spec refused unknown fields).
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("labels", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("labels")
