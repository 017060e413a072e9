"""Service identities: whom a user may act for, and which service submitted a job for its user."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing users act for nobody and existing jobs were submitted by their users themselves.
    op.add_column("users", sa.Column("acts_for", sa.Text, nullable=False, server_default="[]"))
    op.add_column("jobs", sa.Column("submitted_via", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("submitted_via")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("acts_for")
