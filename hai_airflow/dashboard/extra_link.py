"""The "HAI job" extra link: from an Airflow task instance to its hai job's dashboard page."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from airflow.sdk import BaseOperatorLink

from hai_airflow.dashboard.paths import job_url

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

JOB_ID_XCOM_KEY = "hai_job_id"
"""The XCom key under which the hai operators push the id of the job they submitted."""


def _airflow_base_path() -> str:
    # The link is read in the browser of an Airflow page, so only the path prefix of [api] base_url matters.
    from airflow.configuration import conf

    return urlparse(conf.get("api", "base_url", fallback="") or "").path.rstrip("/")


class HaiJobLink(BaseOperatorLink):
    """Links a task to the dashboard page of the hai job it submitted (XCom ``hai_job_id``).

    Declare it on an operator with ``operator_extra_links = (HaiJobLink(),)``; Airflow stores the
    link when the task ends. An operator that defers can show it earlier with :meth:`persist`.
    """

    name = "HAI job"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        job_id = XCom.get_value(ti_key=ti_key, key=JOB_ID_XCOM_KEY)
        return self.url_for(job_id)

    @staticmethod
    def url_for(job_id: Any) -> str:
        """The job's page, or "" (no link) when no job was submitted."""
        if job_id is None or not str(job_id).isdigit():
            return ""
        return job_url(int(job_id), _airflow_base_path())

    @staticmethod
    def page_for(job_id: int) -> str:
        """The job's page as a whole address (``[api] base_url`` and the path), for a task log."""
        from airflow.configuration import conf

        return job_url(job_id, conf.get("api", "base_url", fallback="") or "")

    @classmethod
    def persist(cls, context: Any, job_id: int) -> None:
        """Push the link now (Airflow's own push waits for the task to end, e.g. after a deferral)."""
        context["ti"].xcom_push(key=cls().xcom_key, value=cls.url_for(job_id))
