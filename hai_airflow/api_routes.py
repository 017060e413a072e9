"""The REST API's requests as plain data: each endpoint's method, path, query and body. `endpoints`
adds how each answer is read into the spec's views; the downloadable `hai` sends these as they are.
Standard library only, Python 3.8+."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

API = "/api/v1"
JSON = "application/json"
TEXT = "text/plain"
LONG_POLL_SLACK = 15.0
"""A long-poll's request waits this much longer than the server holds it."""


@dataclass(frozen=True)
class Request:
    """One request: what the HTTP stack sends, and the media type a success answers with."""

    method: str
    path: str
    params: dict[str, Any] | None = None
    body: Any = None
    timeout: float | None = None
    expect: str = JSON


def resource_packages() -> Request:
    return Request("GET", f"{API}/resource-packages")


def submit(body: dict[str, Any]) -> Request:
    """`body`: {spec, client_key, array} as `spec.SubmitRequest` reads it."""
    return Request("POST", f"{API}/jobs", body=body)


def jobs(
    user: str | None = None,
    state: str | None = None,
    group: str | None = None,
    all: bool = False,
    limit: int | None = None,
    before: int | None = None,
    selector: str | None = None,
    array: int | None = None,
) -> Request:
    """Newest first; `before` (the last id of a page) gives the page after it; `selector` matches labels."""
    params: dict[str, Any] = {"all": all}
    given = {"user": user, "state": state, "group": group, "limit": limit, "before": before}
    given.update(selector=selector, array=array)
    params.update({k: v for k, v in given.items() if v is not None})
    return Request("GET", f"{API}/jobs", params=params)


def job(job_id: int) -> Request:
    return Request("GET", f"{API}/jobs/{job_id}")


def instances(job_id: int) -> Request:
    return Request("GET", f"{API}/jobs/{job_id}/instances")


def instance(instance_id: int) -> Request:
    return Request("GET", f"{API}/instances/{instance_id}")


def wait(job_id: int, since_state: str | None = None, timeout: float = 30) -> Request:
    """Long-poll: answers once the job's state differs from `since_state`, or at `timeout`."""
    params: dict[str, Any] = {"timeout": timeout}
    if since_state:
        params["since_state"] = since_state
    return Request("GET", f"{API}/jobs/{job_id}/wait", params, timeout=timeout + LONG_POLL_SLACK)


def log_path(instance_id: int) -> str:
    return f"{API}/instances/{instance_id}/log"


def log(instance_id: int, tail: int = 0) -> Request:
    return Request("GET", log_path(instance_id), params={"tail": tail}, expect=TEXT)


def cancel(job_id: int) -> Request:
    return Request("POST", f"{API}/jobs/{job_id}/cancel")


def follow_log(instance_id: int, tail: int = 0) -> Request:
    """The log as it grows, streamed until the instance ends."""
    return Request("GET", log_path(instance_id), params={"tail": tail, "follow": True}, expect=TEXT)
