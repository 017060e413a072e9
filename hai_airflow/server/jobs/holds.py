"""Holds: a job kept off the GPUs until released, by its owner (`hai hold`) or an admin (`hai suspend`)."""

from __future__ import annotations

from hai_airflow.server.jobs.kept import KeptJob
from hai_airflow.server.store.tables import JobRow


def owners_hold(row: JobRow | KeptJob) -> bool:
    """A hold its owner placed, which the owner may release; any other hold is an admin's, which wins."""
    return row.held and row.held_by == row.user_name


def held_by(row: JobRow | KeptJob) -> str:
    """Who holds the job, in the words `hai task` and the queue show."""
    return f"held by {row.held_by}" if owners_hold(row) else f"suspended by admin {row.held_by}"


def hold_reason(row: JobRow | KeptJob) -> str:
    """Why a held job waits, and the command that releases it."""
    release = "release" if owners_hold(row) else "resume"
    return f"{held_by(row)}; `hai {release} {row.id}` releases it"
