"""The REST API under `/api/v1`: the paths, parameters and bodies `hai_airflow.client` uses."""

from __future__ import annotations

from fastapi import APIRouter

from hai_airflow.server.api.routes import accounting, admin, cluster, execs, feed, files, instances, jobs

router = APIRouter(prefix="/api/v1")
router.include_router(cluster.router)
router.include_router(accounting.router)
router.include_router(feed.router)  # before jobs: /jobs/revision is no job id
router.include_router(jobs.router)
router.include_router(instances.router)
router.include_router(execs.router)
router.include_router(files.router)
router.include_router(admin.router)
