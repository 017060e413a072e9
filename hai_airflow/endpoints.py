"""The REST API as the clients call it: one `Call` per endpoint (method, path, arguments, and how the
answer is read), shared by the blocking `HaiClient` and the asyncio `AsyncHaiClient`, so a route or
its parameters are written once whatever the HTTP stack."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from pydantic import TypeAdapter

from hai_airflow import api_routes
from hai_airflow.api_routes import API, JSON, LONG_POLL_SLACK, TEXT, Request
from hai_airflow.spec import (
    FilesView,
    InstanceView,
    JobDetailView,
    JobSpec,
    JobView,
    LedgerView,
    NodeView,
    QueueEntryView,
    QuotaView,
    ResourcePackageView,
    RevisionView,
    SubmitRequest,
    UsageHistoryView,
    UsageView,
)

__all__ = ["API", "JSON", "LONG_POLL_SLACK", "TEXT"]
BYTES = "application/octet-stream"
NDJSON = "application/x-ndjson"
"""What hai answers with: JSON, plain text for a log, bytes for a file, JSON lines for `hai exec`."""

T = TypeVar("T")

_JOBS = TypeAdapter(list[JobView])
_INSTANCES = TypeAdapter(list[InstanceView])
_QUEUE = TypeAdapter(list[QueueEntryView])
_QUOTAS = TypeAdapter(list[QuotaView])
_NODES = TypeAdapter(list[NodeView])
_PACKAGES = TypeAdapter(list[ResourcePackageView])
_USAGE = TypeAdapter(list[UsageView])


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request and how its answer is read (`read` gets the JSON, or the text for TEXT)."""

    method: str
    path: str
    read: Callable[[Any], T]
    params: dict[str, Any] | None = None
    body: Any = None
    timeout: float | None = None
    expect: str = JSON

    def answer(self, resp: Any) -> T:
        """What the successful response (either HTTP stack's) says, read as this call reads it."""
        return self.read(resp.json() if self.expect == JSON else resp.text)

    def options(self) -> dict[str, Any]:
        """The HTTP stack's keyword arguments: only those this call sets."""
        out: dict[str, Any] = {}
        if self.params is not None:
            out["params"] = self.params
        if self.body is not None:
            out["json"] = self.body
        if self.timeout is not None:
            out["timeout"] = self.timeout
        return out


def _reading(request: Request, read: Callable[[Any], T]) -> Call[T]:
    """The call that sends `request` and reads its answer with `read`."""
    return Call(
        request.method, request.path, read, request.params, request.body, request.timeout, request.expect
    )


def _as_dict(data: Any) -> dict[str, Any]:
    return dict(data)


def _text(data: Any) -> str:
    return str(data)


def health() -> Call[dict[str, Any]]:
    return Call("GET", "/health", _as_dict)


def whoami() -> Call[dict[str, Any]]:
    return Call("GET", f"{API}/whoami", _as_dict)


def resource_packages() -> Call[list[ResourcePackageView]]:
    return _reading(api_routes.resource_packages(), _PACKAGES.validate_python)


def submit(spec: JobSpec, client_key: str | None = None, array: str | None = None) -> Call[JobView]:
    """The job made; with `array` (`0-9%2`), the first task of the array made."""
    request = SubmitRequest(spec=spec, client_key=client_key, array=array)
    body = request.model_dump(mode="json", exclude={"array"} if array is None else set())
    return _reading(api_routes.submit(body), JobView.model_validate)


def check_high_priority(gpus: int) -> Call[dict[str, Any]]:
    """Would `gpus` more high-priority GPUs fit the caller's quota now? {allowed, reason}."""
    return Call("GET", f"{API}/quota/check", _as_dict, params={"gpus": gpus})


def jobs(
    user: str | None = None,
    state: str | None = None,
    group: str | None = None,
    all: bool = False,
    limit: int | None = None,
    before: int | None = None,
    selector: str | None = None,
    array: int | None = None,
) -> Call[list[JobView]]:
    """Newest first; `before` (the last id of a page) gives the page after it; `selector` matches labels."""
    request = api_routes.jobs(user, state, group, all, limit, before, selector, array)
    return _reading(request, _JOBS.validate_python)


def job(job_id: int) -> Call[JobDetailView]:
    return _reading(api_routes.job(job_id), JobDetailView.model_validate)


def job_by_key(client_key: str) -> Call[JobView | None]:
    def first(data: Any) -> JobView | None:
        found = _JOBS.validate_python(data)
        return found[0] if found else None

    return Call("GET", f"{API}/jobs", first, params={"client_key": client_key, "all": True})


def instances(job_id: int) -> Call[list[InstanceView]]:
    return _reading(api_routes.instances(job_id), _INSTANCES.validate_python)


def instance(instance_id: int) -> Call[InstanceView]:
    return _reading(api_routes.instance(instance_id), InstanceView.model_validate)


def wait(job_id: int, since_state: str | None = None, timeout: float = 30) -> Call[JobView]:
    """Long-poll: returns once the job's state differs from `since_state`, or at `timeout`."""
    return _reading(api_routes.wait(job_id, since_state, timeout), JobView.model_validate)


def jobs_revision(after: str | None = None, timeout: float = 0) -> Call[str]:
    """Long-poll: the revision of your task list once it differs from `after`, or at `timeout`."""
    params: dict[str, Any] = {"timeout": timeout}
    if after is not None:
        params["after"] = after
    return Call(
        "GET",
        f"{API}/jobs/revision",
        lambda data: RevisionView.model_validate(data).revision,
        params,
        timeout=timeout + LONG_POLL_SLACK,
    )


def _usage_params(
    since: datetime | None, until: datetime | None, by: str, user: str | None, group: str | None
) -> dict[str, Any]:
    given = {"since": since, "until": until, "user": user, "group": group}
    return {"by": by} | {k: v.isoformat() if isinstance(v, datetime) else v for k, v in given.items() if v}


def usage(
    since: datetime | None = None,
    until: datetime | None = None,
    by: str = "user",
    user: str | None = None,
    group: str | None = None,
) -> Call[list[UsageView]]:
    """GPU-hours, losses and waits over [since, until) per user or group (`hai usage`)."""
    return Call("GET", f"{API}/usage", _USAGE.validate_python, _usage_params(since, until, by, user, group))


def usage_history(
    since: datetime | None = None,
    until: datetime | None = None,
    by: str = "user",
    user: str | None = None,
    group: str | None = None,
) -> Call[UsageHistoryView]:
    """Use over [since, until) by UTC day per user or group, and the queue hour by hour."""
    params = _usage_params(since, until, by, user, group)
    return Call("GET", f"{API}/usage/history", UsageHistoryView.model_validate, params)


def check_store() -> Call[LedgerView]:
    """The ledger run on the server's store (platform admins)."""
    return Call("GET", f"{API}/admin/check", LedgerView.model_validate, timeout=600)


def files(job_id: int, path: str = "") -> Call[FilesView]:
    """What `path` below the task's model dir is, and a directory's entries."""
    return Call("GET", f"{API}/jobs/{job_id}/files", FilesView.model_validate, {"path": path})


def file_content_path(job_id: int) -> str:
    return f"{API}/jobs/{job_id}/files/content"


def exec_path(job_id: int) -> str:
    return f"{API}/jobs/{job_id}/exec"


log_path = api_routes.log_path


def log(instance_id: int, tail: int = 0) -> Call[str]:
    return _reading(api_routes.log(instance_id, tail), _text)


def cancel(job_id: int) -> Call[JobView]:
    return _reading(api_routes.cancel(job_id), JobView.model_validate)


def promote(job_id: int, max_schedule: int) -> Call[JobView]:
    body = {"max_schedule": max_schedule}
    return Call("POST", f"{API}/jobs/{job_id}/promote", JobView.model_validate, body=body)


def suspend(job_id: int) -> Call[JobView]:
    return Call("POST", f"{API}/jobs/{job_id}/suspend", JobView.model_validate)


def resume(job_id: int) -> Call[JobView]:
    return Call("POST", f"{API}/jobs/{job_id}/resume", JobView.model_validate)


def requeue(job_id: int, fresh: bool = False) -> Call[JobView]:
    """Run an ended job again as a new job (its answer), from its checkpoint unless `fresh`."""
    body = {"fresh": fresh}
    return Call("POST", f"{API}/jobs/{job_id}/requeue", JobView.model_validate, body=body)


def hold(job_id: int) -> Call[JobView]:
    return Call("POST", f"{API}/jobs/{job_id}/hold", JobView.model_validate)


def release(job_id: int) -> Call[JobView]:
    return Call("POST", f"{API}/jobs/{job_id}/release", JobView.model_validate)


def queue() -> Call[list[QueueEntryView]]:
    return Call("GET", f"{API}/queue", _QUEUE.validate_python)


def quota() -> Call[QuotaView]:
    """The caller's and their group's quota and usage."""
    return Call("GET", f"{API}/quota", QuotaView.model_validate)


def quotas() -> Call[list[QuotaView]]:
    """Every group the caller may see."""
    return Call("GET", f"{API}/quotas", _QUOTAS.validate_python)


def set_user_quota(user: str, gpus: int | None) -> Call[QuotaView]:
    return Call("PUT", f"{API}/quotas/users/{user}", QuotaView.model_validate, body={"gpus": gpus})


def set_group_quota(group: str, gpus: int | None) -> Call[QuotaView]:
    return Call("PUT", f"{API}/quotas/groups/{group}", QuotaView.model_validate, body={"gpus": gpus})


def nodes() -> Call[list[NodeView]]:
    return Call("GET", f"{API}/nodes", _NODES.validate_python)


def drain_node(name: str, reason: str | None = None) -> Call[NodeView]:
    """No new placement on the node until `undrain_node` (platform admins)."""
    body = {"reason": reason}
    return Call("POST", f"{API}/nodes/{quote(name, safe='')}/drain", NodeView.model_validate, body=body)


def undrain_node(name: str) -> Call[NodeView]:
    return Call("POST", f"{API}/nodes/{quote(name, safe='')}/undrain", NodeView.model_validate)
