"""A fixed platform state served as the REST API would, so page rendering is tested through HaiClient."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from hai_airflow.spec import (
    EventView,
    InstanceView,
    JobDetailView,
    NodeView,
    QueueEntryView,
    QuotaUsageView,
    QuotaView,
    WeightTermView,
    WorkerPlacementView,
)

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
TOKEN = "snap-token"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def job(
    job_id: int, user: str, group: str, state: str, gpus: int, max_schedule: int = 0, **kw: Any
) -> JobDetailView:
    fields: dict[str, Any] = {
        "id": job_id,
        "task_name": kw.pop("task_name", f"train-{job_id}"),
        "mode": "standalone",
        "user": user,
        "group": group,
        "state": state,
        "priority": "high" if max_schedule else "low",
        "max_schedule": max_schedule,
        "gpus": gpus,
        "gpu_type": kw.pop("gpu_type", "V100"),
        "workers": 1,
        "spec": kw.pop(
            "spec",
            {
                "mode": "standalone",
                "task_name": "t",
                "code_path": "/c",
                "cmd": "python3 t.py",
                "resource_pkg": 456,
            },
        ),
        "submitted_at": kw.pop("submitted_at", at(0)),
    }
    fields.update(kw)
    return JobDetailView.model_validate(fields)


def place(node: str, *gpus: int) -> tuple[WorkerPlacementView, ...]:
    return (WorkerPlacementView(node=node, gpus=gpus),)


def event(
    eid: int,
    job_id: int,
    seconds: float,
    kind: str,
    reason: str,
    frm: str | None = None,
    to: str | None = None,
) -> EventView:
    return EventView(
        id=eid,
        job_id=job_id,
        at=at(seconds),
        kind=kind,
        from_state=frm,
        to_state=to,
        reason=reason,
        actor="controller",
    )


@dataclass
class Snapshot:
    """Jobs 1 (low, preempted by 3, waiting), 2 (low, running), 3 (high preemptor), 4 (low, pending),
    5 (low, ran, was preempted by 9, resumed from a checkpoint), 6 (SUSPENDING, elastic)."""

    jobs: dict[int, JobDetailView] = field(default_factory=dict)
    instances: dict[int, list[InstanceView]] = field(default_factory=dict)
    queue: list[QueueEntryView] = field(default_factory=list)
    quotas: list[QuotaView] = field(default_factory=list)
    nodes: list[NodeView] = field(default_factory=list)
    logs: dict[int, str] = field(default_factory=dict)


def build() -> Snapshot:
    s = Snapshot()
    s.jobs = {
        1: job(
            1,
            "alice",
            "vision",
            "SUSPENDED",
            4,
            reason="preempted by job 3",
            preemptions=1,
            instances=1,
            task_name="<b>resnet</b>",
        ),
        2: job(
            2,
            "bob",
            "vision",
            "RUNNING",
            4,
            placement=place("gpu-a", 4, 5, 6, 7),
            runtime_seconds=300,
            submitted_at=at(10),
        ),
        3: job(
            3,
            "dave",
            "nlp",
            "RUNNING",
            4,
            4,
            placement=place("gpu-a", 0, 1, 2, 3),
            runtime_seconds=60,
            submitted_at=at(200),
        ),
        4: job(4, "alice", "vision", "PENDING", 2, submitted_at=at(230)),
        5: job(
            5,
            "carol",
            "vision",
            "RUNNING",
            1,
            gpu_type="T4",
            placement=place("gpu-b", 0),
            latest_checkpoint="/m/5/ckpt-51.pt",
            instances=2,
            preemptions=1,
            submitted_at=at(0),
            events=(
                event(1, 5, 0, "submitted", "submitted", None, "PENDING"),
                event(2, 5, 5, "started", "instance 51 started", "STARTING", "RUNNING"),
                event(3, 5, 30, "checkpoint", "latest checkpoint /m/5/ckpt-51.pt", "RUNNING", "RUNNING"),
                event(4, 5, 100, "suspending", "preempted by job 9", "RUNNING", "SUSPENDING"),
                event(5, 5, 102, "suspended", "instance 51: preempted by job 9", "SUSPENDING", "SUSPENDED"),
                event(
                    6, 5, 200, "started", "instance 52 resumed from /m/5/ckpt-51.pt", "STARTING", "RUNNING"
                ),
            ),
        ),
        6: job(
            6,
            "dave",
            "nlp",
            "SUSPENDING",
            2,
            gpu_type="T4",
            placement=place("gpu-b", 1, 2),
            spec={
                "mode": "standalone",
                "task_name": "t",
                "code_path": "/c",
                "cmd": "x",
                "resource_pkg": 1,
                "elastic": True,
                "grace_seconds": 90,
            },
            events=(event(7, 6, 240, "suspending", "preempted by job 7", "RUNNING", "SUSPENDING"),),
        ),
        7: job(7, "dave", "nlp", "PENDING", 2, 8, gpu_type="T4", submitted_at=at(239)),
    }
    s.instances = {
        1: [
            InstanceView(
                id=11,
                job_id=1,
                started_at=at(5),
                ended_at=at(205),
                placement=place("gpu-a", 0, 1, 2, 3),
                end_reason="preempted",
                preempted_by=3,
            )
        ],
        5: [
            InstanceView(
                id=51,
                job_id=5,
                started_at=at(5),
                ended_at=at(102),
                placement=place("gpu-b", 0),
                end_reason="preempted",
                preempted_by=9,
            ),
            InstanceView(
                id=52,
                job_id=5,
                started_at=at(200),
                placement=place("gpu-b", 0),
                resume=True,
                checkpoint="/m/5/ckpt-51.pt",
            ),
        ],
    }
    s.logs = {11: "step 0\nstep 1\n", 51: "step 0\n", 52: "resumed from /m/5/ckpt-51.pt\nstep 7\n"}
    terms = (
        WeightTermView(name="waiting", value=250, note="seconds since submission"),
        WeightTermView(name="lost to suspension", value=90, note="2 x 45 seconds spent suspended"),
    )
    s.queue = [
        QueueEntryView(
            position=1,
            job=s.jobs[7],
            weight=1e9 - 28_000,
            reason="waiting for job 6 to be suspended",
            waiting_behind=6,
            terms=(
                WeightTermView(name="priority class", value=1e9),
                WeightTermView(name="deadline", value=-28_000),
            ),
        ),
        QueueEntryView(
            position=2,
            job=s.jobs[1],
            weight=340,
            terms=terms,
            preempted_by=3,
            reason="needs 4 V100 GPUs; 0 free",
            waiting_behind=2,
        ),
        QueueEntryView(
            position=3, job=s.jobs[4], weight=20, reason="behind job 1 in the queue", waiting_behind=1
        ),
    ]
    s.quotas = [
        QuotaView(
            group="nlp",
            group_quota_gpus=16,
            group_used_gpus=6,
            users=(QuotaUsageView(user="dave", used_gpus=6),),
        ),
        QuotaView(
            group="vision",
            group_quota_gpus=8,
            group_used_gpus=0,
            users=(
                QuotaUsageView(user="alice", used_gpus=0, quota_gpus=8),
                QuotaUsageView(user="bob", used_gpus=0),
            ),
        ),
    ]
    s.nodes = [
        NodeView(
            name="gpu-a",
            gpu_type="V100",
            gpus=8,
            cpus=64,
            memory_gb=512,
            virtual=True,
            free_gpus=(),
            holders={0: 3, 1: 3, 2: 3, 3: 3, 4: 2, 5: 2, 6: 2, 7: 2},
        ),
        NodeView(
            name="gpu-b",
            gpu_type="T4",
            gpus=4,
            cpus=16,
            memory_gb=64,
            virtual=True,
            free_gpus=(3,),
            holders={0: 5, 1: 6, 2: 6},
            state="draining",
            drained_by="admin",
            drained_at=at(400),
            reason="fan <noise>",
        ),
    ]
    return s


def _json(body: Any) -> httpx.Response:
    return httpx.Response(
        200, content=json.dumps(body, default=str), headers={"content-type": "application/json"}
    )


def _dump(models: Any) -> Any:
    if isinstance(models, list):
        return [m.model_dump(mode="json") for m in models]
    return models.model_dump(mode="json")


def _listed(s: Snapshot, params: httpx.QueryParams) -> list[JobDetailView]:
    """The list endpoint's filters as the server applies them: state, user, newest first, paged."""
    states = set(params.get("state", "").split(",")) - {""}
    user, before = params.get("user"), int(params.get("before", 0)) or None
    found = [
        j
        for j in sorted(s.jobs.values(), key=lambda j: -j.id)
        if (not states or j.state in states) and user in (None, j.user) and (before is None or j.id < before)
    ]
    return found[: int(params.get("limit", 1000))]


def transport(s: Snapshot, caller: str = "alice") -> httpx.MockTransport:
    """Answers the client's GETs from the snapshot; a wrong token gets the server's 401 body."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return httpx.Response(401, json={"error": "unknown API token", "field": "Authorization"})
        parts = request.url.path.removeprefix("/api/v1/").split("/")
        params = request.url.params
        if parts == ["queue"]:
            return _json(_dump(s.queue))
        if parts == ["quotas"]:
            return _json(_dump(s.quotas))
        if parts == ["quota"]:
            return _json(
                _dump(
                    QuotaView(
                        group="vision", group_quota_gpus=8, group_used_gpus=0, user=caller, user_quota_gpus=8
                    )
                )
            )
        if parts == ["nodes"]:
            return _json(_dump(s.nodes))
        if parts == ["jobs"]:
            return _json([j.model_dump(mode="json", exclude={"events"}) for j in _listed(s, params)])
        if parts[0] == "jobs" and parts[1].isdigit():
            j = s.jobs.get(int(parts[1]))
            if j is None:
                return httpx.Response(404, json={"error": f"task {parts[1]} not found"})
            if len(parts) == 3 and parts[2] == "instances":
                return _json(_dump(s.instances.get(j.id, [])))
            return _json(_dump(j))
        if parts[0] == "instances":
            inst = next((i for li in s.instances.values() for i in li if i.id == int(parts[1])), None)
            if inst is None:
                return httpx.Response(404, json={"error": f"instance {parts[1]} not found"})
            if len(parts) == 3 and parts[2] == "log":
                return httpx.Response(200, text=s.logs.get(inst.id, ""))
            return _json(_dump(inst))
        return httpx.Response(404, json={"error": f"no route {request.url.path}"})

    return httpx.MockTransport(handle)
