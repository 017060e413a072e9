"""Initial schema: groups, users, nodes, jobs, instances, events, reservations, controller lease."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "groups",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("quota_gpus", sa.Integer, nullable=True),
        sa.Column("config_quota", sa.String(40), nullable=True),
        sa.Column("admins", sa.Text, nullable=False),
    )
    op.create_table(
        "users",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("group_name", sa.String(200), sa.ForeignKey("groups.name"), nullable=False),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("token", sa.String(200), nullable=False, unique=True),
        sa.Column("quota_gpus", sa.Integer, nullable=True),
        sa.Column("config_quota", sa.String(40), nullable=True),
    )
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("gpu_type", sa.String(50), nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("cpus", sa.Float, nullable=False),
        sa.Column("memory_gb", sa.Float, nullable=False),
        sa.Column("virtual", sa.Boolean, nullable=False),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("task_name", sa.String(200), nullable=False),
        sa.Column("mode", sa.String(20), nullable=False),
        sa.Column("user_name", sa.String(200), nullable=False),
        sa.Column("group_name", sa.String(200), nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("max_schedule", sa.Integer, nullable=False),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("client_key", sa.String(250), nullable=True, unique=True),
        sa.Column("model_id", sa.Integer, nullable=True),
        sa.Column("project_id", sa.Integer, nullable=True),
        sa.Column("workers", sa.Integer, nullable=False),
        sa.Column("gpus_per_worker", sa.Integer, nullable=False),
        sa.Column("cpus_per_worker", sa.Float, nullable=False),
        sa.Column("memory_gb_per_worker", sa.Float, nullable=False),
        sa.Column("gpu_type", sa.String(50), nullable=True),
        sa.Column("elastic", sa.Boolean, nullable=False),
        sa.Column("submitted_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float, nullable=True),
        sa.Column("ended_at", sa.Float, nullable=True),
        sa.Column("suspended_at", sa.Float, nullable=True),
        sa.Column("suspended_seconds", sa.Float, nullable=False),
        sa.Column("runtime_seconds", sa.Float, nullable=False),
        sa.Column("preemptions", sa.Integer, nullable=False),
        sa.Column("instance_count", sa.Integer, nullable=False),
        sa.Column("current_instance_id", sa.Integer, nullable=True),
        sa.Column("held", sa.Boolean, nullable=False),
        sa.Column("held_by", sa.String(200), nullable=True),
        sa.Column("cancel_requested", sa.Boolean, nullable=False),
        sa.Column("cancel_by", sa.String(200), nullable=True),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("latest_checkpoint", sa.Text, nullable=True),
        sa.Column("latest_checkpoint_at", sa.Float, nullable=True),
    )
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_index("ix_jobs_user", "jobs", ["user_name"])
    op.create_table(
        "instances",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float, nullable=True),
        sa.Column("ended_at", sa.Float, nullable=True),
        sa.Column("placement", sa.Text, nullable=False),
        sa.Column("handle", sa.Text, nullable=True),
        sa.Column("pid", sa.Integer, nullable=True),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("end_reason", sa.String(20), nullable=True),
        sa.Column("preempted_by", sa.Integer, nullable=True),
        sa.Column("resume", sa.Boolean, nullable=False),
        sa.Column("checkpoint", sa.Text, nullable=True),
        sa.Column("log_path", sa.Text, nullable=False),
        sa.Column("work_dir", sa.Text, nullable=False),
        sa.Column("model_dir", sa.Text, nullable=False),
        sa.Column("stop_kind", sa.String(20), nullable=True),
        sa.Column("stop_requested_at", sa.Float, nullable=True),
        sa.Column("grace_seconds", sa.Integer, nullable=False),
        sa.Column("controller", sa.String(250), nullable=True),
    )
    op.create_index("ix_instances_job", "instances", ["job_id"])
    op.create_index("ix_instances_ended", "instances", ["ended_at"])
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("from_state", sa.String(20), nullable=True),
        sa.Column("to_state", sa.String(20), nullable=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("actor", sa.String(250), nullable=False),
    )
    op.create_index("ix_events_job", "events", ["job_id"])
    op.create_table(
        "reservations",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("node", sa.String(200), nullable=False),
        sa.Column("gpus", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    lease = op.create_table(
        "controller_lease",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("holder", sa.String(250), nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("acquired_at", sa.Float, nullable=False),
    )
    op.bulk_insert(lease, [{"id": 1, "holder": "", "expires_at": 0.0, "acquired_at": 0.0}])


def downgrade() -> None:
    for table in (
        "controller_lease",
        "reservations",
        "events",
        "instances",
        "jobs",
        "nodes",
        "users",
        "groups",
    ):
        op.drop_table(table)
