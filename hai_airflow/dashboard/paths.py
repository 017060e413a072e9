"""Where the dashboard lives inside Airflow; imported by task code, so it imports nothing heavy."""

from __future__ import annotations

URL_PREFIX = "/hai"
"""The plugin app's mount point in the Airflow API server."""


def job_url(job_id: int, airflow_base: str = "") -> str:
    """A job's dashboard page inside Airflow."""
    return f"{airflow_base.rstrip('/')}{URL_PREFIX}/jobs/{int(job_id)}"
