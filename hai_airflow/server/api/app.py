"""The FastAPI application: the API, /health, /metrics, the dashboard at /ui, the controller's lifetime."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

from fastapi import FastAPI

import hai_airflow
from hai_airflow.dashboard.standalone import create_standalone_dashboard
from hai_airflow.server.api.request_body import BodySizeLimit
from hai_airflow.server.api.routes import cli_download, ops, router
from hai_airflow.server.control.controller import Controller
from hai_airflow.server.errors import ERROR_RESPONSES, install_handlers, json_refusals
from hai_airflow.server.intake import submission
from hai_airflow.server.intake.group_commit import Intake
from hai_airflow.server.intake.submission import Submissions
from hai_airflow.server.process.context import ServerContext
from hai_airflow.server.process.metrics import RequestTimer


def create_app(ctx: ServerContext, controller: Controller | None = None) -> FastAPI:
    """The API over `ctx`; with a `controller`, its loop runs while the app is up. On PostgreSQL the
    app listens for other servers' commits on the store's channel while it is up."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        listener = ctx.store.listener(ctx.heard)
        if listener is not None:
            listener.start()
        if controller is not None:
            controller.start()
        try:
            yield
        finally:
            if controller is not None:
                controller.stop()
            submissions.stop()
            if listener is not None:
                listener.stop()

    app = FastAPI(
        title="hai",
        version=getattr(hai_airflow, "__version__", "0"),
        description="Managed GPU training platform: submit, queue, quota, preemption and resume. "
        "Every request carries `Authorization: Bearer <token>`; a service identity (a user with "
        "`acts_for`, e.g. Airflow) may add `X-Hai-On-Behalf-Of: <user>` to act as a user it covers.",
        lifespan=lifespan,
    )
    app.state.ctx = ctx
    submissions: Submissions = Intake(
        partial(submission.submit_all, ctx), "hai-submissions", workers=submission.submit_threads(ctx)
    )
    app.state.submissions = submissions
    install_handlers(app)
    app.add_middleware(RequestTimer, observe=ctx.metrics.observe_request)
    # Outermost of ours: an oversized body is refused before anything else reads it.
    app.add_middleware(BodySizeLimit, limit=ctx.config.server.max_body_bytes)
    app.include_router(router, responses=ERROR_RESPONSES)
    openapi = app.openapi
    app.openapi = lambda: json_refusals(openapi())  # type: ignore[method-assign]

    app.include_router(ops.router)
    app.include_router(cli_download.router)

    # In-process: the pages never wait on a socket to themselves, nor on worker threads the API needs.
    app.mount("/ui", create_standalone_dashboard(app))
    return app
