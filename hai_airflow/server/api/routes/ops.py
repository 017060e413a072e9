"""What operators and probes read outside the API: /health (no auth) and /metrics (Prometheus)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hai_airflow.server.process.context import ServerContext
from hai_airflow.server.process.metrics import require_scraper
from hai_airflow.server.store import clock, lease

router = APIRouter()


@router.get("/health")
def health(request: Request) -> dict[str, Any]:
    """No auth: is the server up, and which controller holds the lease."""
    c: ServerContext = request.app.state.ctx
    now = clock.now()
    with c.store.read() as s:
        held = lease.current(s, now)
    holder = held.holder if held is not None else None
    return {
        "status": "ok",
        "database": c.store.dialect,
        "lease_holder": holder,
        "lease_expires_in": round(held.expires_at - now, 3) if held is not None else None,
        "this_server": c.holder_id,
        "controller_active": holder is not None and holder == c.holder_id,
    }


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    """Prometheus, with `[server] metrics_token` or a platform admin's token (`require_scraper`)."""
    c: ServerContext = request.app.state.ctx
    require_scraper(request, c.config.server.metrics_token)
    return Response(generate_latest(c.metrics.registry), media_type=CONTENT_TYPE_LATEST)
