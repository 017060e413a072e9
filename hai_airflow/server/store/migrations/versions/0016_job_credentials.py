"""Job credentials: each instance's token for `hai` inside the job, kept as its keyed hash."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        batch.add_column(sa.Column("credential_hash", sa.String(64), nullable=True))
        batch.create_index("ix_instances_credential", ["credential_hash"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        batch.drop_index("ix_instances_credential")
        batch.drop_column("credential_hash")
