"""Store rows turned into the API's view models."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from hai_airflow.server.snapshot import placement_from_json
from hai_airflow.server.tables import EventRow, InstanceRow, JobRow
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
        "spec": json.loads(row.spec),
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


def event_view(e: EventRow) -> EventView:
    return EventView(
        id=e.id,
        job_id=e.job_id,
        at=when(e.at),
        kind=e.kind,
        from_state=e.from_state,
        to_state=e.to_state,
        reason=e.reason,
        actor=e.actor,
    )


def job_detail(row: JobRow, current: InstanceRow | None, events: list[EventRow], now: float) -> JobDetailView:
    fields = job_fields(row, current, now)
    fields["events"] = tuple(event_view(e) for e in events)
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
