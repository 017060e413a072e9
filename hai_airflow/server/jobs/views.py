"""Store rows turned into the API's view models."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from hai_airflow.server.jobs.snapshot import placement_from_json
from hai_airflow.server.store.tables import EventRow, InstanceRow, JobRow
from hai_airflow.spec import (
    EventView,
    InstanceView,
    JobDetailView,
    JobView,
    OtherJobView,
    WorkerPlacementView,
    priority_class,
)


def when(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, tz=UTC)


def _placement(text: str | None) -> tuple[WorkerPlacementView, ...]:
    return tuple(WorkerPlacementView(node=w.node, gpus=w.gpus) for w in placement_from_json(text))


SECRET_NAME = re.compile("TOKEN|SECRET|PASSWORD|KEY", re.IGNORECASE)
"""An `env` name that names a secret: its value is never shown, to anyone, in any view of the job."""
MASK = "<masked>"
"""What a view shows instead of a secret `env` value (the job itself gets the real one)."""


def masked_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as every view shows it: the values of `env` keys that name a secret masked."""
    env = spec.get("env")
    if not env:
        return spec
    shown = {k: MASK if SECRET_NAME.search(k) else v for k, v in env.items()}
    return {**spec, "env": shown}


MASKED_IN_TEXT = 3
"""The shortest secret value masked inside an event's text too; a shorter one ('1', 'no') would
mask every such character of the text, and is no secret anyway."""


def _secrets(spec: dict[str, Any]) -> list[str]:
    """A spec's secret `env` values to mask in text, longest first (one inside another masked whole)."""
    env = spec.get("env") or {}
    found = {v for k, v in env.items() if len(v) >= MASKED_IN_TEXT and SECRET_NAME.search(k)}
    return sorted(found, key=len, reverse=True)


def masked_text(text: str, secrets: list[str]) -> str:
    """`text` (an event's reason) with each secret value in it masked."""
    for secret in secrets:
        text = text.replace(secret, MASK)
    return text


def job_fields(row: JobRow, current: InstanceRow | None, now: float) -> dict[str, object]:
    runtime = row.seconds_run(current, now)
    return {
        "id": row.id,
        "task_name": row.task_name,
        "mode": row.mode,
        "user": row.user_name,
        "group": row.group_name,
        "state": row.state,
        "priority": priority_class(row.max_schedule),
        "max_schedule": row.max_schedule,
        "gpus": row.workers * row.gpus_per_worker,
        "gpu_type": row.gpu_type,
        "workers": row.workers,
        "min_workers": row.min_workers,
        "size": row.current_workers,
        "spec": masked_spec(json.loads(row.spec)),
        "submitted_at": when(row.submitted_at),
        "started_at": when(row.started_at),
        "ended_at": when(row.ended_at),
        "runtime_seconds": round(runtime, 3),
        "preemptions": row.preemptions,
        "instances": row.instance_count,
        "latest_checkpoint": row.latest_checkpoint,
        "latest_checkpoint_at": when(row.latest_checkpoint_at),
        "placement": _placement(current.placement) if current is not None else (),
        "reason": row.reason,
        "client_key": row.client_key,
        "submitted_via": row.submitted_via,
        "requeued_from": row.requeued_from,
        "array_id": row.array_id,
        "array_index": row.array_index,
        "model_id": row.model_id,
        "project_id": row.project_id,
    }


def job_view(row: JobRow, current: InstanceRow | None, now: float) -> JobView:
    return JobView.model_validate(job_fields(row, current, now))


def other_job_view(row: JobRow) -> OtherJobView:
    """Another user's job: only what the queue needs, field by field, so nothing else can slip in."""
    return OtherJobView(
        id=row.id,
        mode=row.mode,
        state=row.state,
        priority=priority_class(row.max_schedule),
        max_schedule=row.max_schedule,
        gpus=row.workers * row.gpus_per_worker,
        gpu_type=row.gpu_type,
        workers=row.workers,
        min_workers=row.min_workers,
        size=row.current_workers,
        submitted_at=when(row.submitted_at),
    )


def event_view(e: EventRow, secrets: list[str] | None = None) -> EventView:
    """An event as shown; with the job's `secrets`, none of them appears in its reason."""
    return EventView(
        id=e.id,
        job_id=e.job_id,
        at=when(e.at),
        kind=e.kind,
        from_state=e.from_state,
        to_state=e.to_state,
        reason=masked_text(e.reason, secrets or []),
        actor=e.actor,
    )


def job_detail(row: JobRow, current: InstanceRow | None, events: list[EventRow], now: float) -> JobDetailView:
    fields = job_fields(row, current, now)
    secrets = _secrets(json.loads(row.spec))
    fields["events"] = tuple(event_view(e, secrets) for e in events)
    return JobDetailView.model_validate(fields)


def instance_view(i: InstanceRow) -> InstanceView:
    return InstanceView(
        id=i.id,
        job_id=i.job_id,
        started_at=when(i.started_at),
        ended_at=when(i.ended_at),
        placement=_placement(i.placement),
        exit_code=i.exit_code,
        end_reason=i.end_reason,
        preempted_by=i.preempted_by,
        resume=i.resume,
        checkpoint=i.checkpoint,
    )
