"""The dashboard's FastAPI app: one implementation, mounted by `hai serve` (/ui) and by Airflow (/hai)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from hai_airflow.client import AsyncHaiClient, HaiError, HaiUnreachable
from hai_airflow.dashboard import data, svg
from hai_airflow.dashboard import formatting as fmt
from hai_airflow.dashboard.formatting import clock
from hai_airflow.spec import JobState

ClientFor = Callable[[Request], Awaitable[AsyncHaiClient]]
"""Builds the client a request is served with; raises `SignInRequired` when it has no credentials.

Asynchronous, so a page waiting on the API holds no worker thread: the API it calls (in the same
process under `hai serve`) needs those threads to answer, and many open pages must never starve it."""

TEMPLATES = Path(__file__).parent / "templates"
COOKIE = "hai_ui_token"
"""Where `hai serve`'s mounting keeps the viewer's hai token; dropped when hai refuses it."""


class SignInRequired(Exception):
    """The request carries no credentials the mounting accepts."""

    def __init__(self, message: str, fix: str):
        super().__init__(message)
        self.message = message
        self.fix = fix


def base_path(request: Request) -> str:
    """Where the dashboard is mounted (`/ui`, `/hai`, or behind a proxy prefix): links start here."""
    return str(request.scope.get("root_path", "")).rstrip("/")


async def _client(request: Request) -> AsyncIterator[AsyncHaiClient]:
    """One client per request, closed when the response is done."""
    client_for: ClientFor = request.app.state.client_for
    client = await client_for(request)
    try:
        yield client
    finally:
        await client.aclose()


Client = Annotated[AsyncHaiClient, Depends(_client)]


class Pages:
    """Renders templates with what every page needs: its mount point, the server and the time."""

    def __init__(self) -> None:
        self.env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]))

    def render(
        self, request: Request, template: str, page: str, server: str = "", status: int = 200, **values: Any
    ) -> HTMLResponse:
        html = self.env.get_template(template).render(
            page=page,
            base=base_path(request),
            server=server or "the hai server",
            now_text=clock(datetime.now(UTC)),
            fmt=fmt,
            svg=svg,
            **values,
        )
        return HTMLResponse(html, status_code=status)

    def error(
        self,
        request: Request,
        status: int,
        heading: str,
        message: str,
        fix: str | None = None,
        token_form: bool = False,
        server: str = "",
    ) -> HTMLResponse:
        return self.render(
            request,
            "error.html",
            heading,
            server,
            status,
            heading=heading,
            message=message,
            fix=fix,
            token_form=token_form,
            back=request.url.path + (f"?{request.url.query}" if request.url.query else ""),
        )


def create_dashboard_app(
    client_for: ClientFor,
    *,
    dependencies: Sequence[Any] = (),
    token_form: bool = False,
    refused_fix: str = "Check the credentials the dashboard uses for hai",
) -> FastAPI:
    """The Queue, Quota, Nodes, Usage, Tasks and Job pages over the REST API.

    :param client_for: builds the `AsyncHaiClient` for a request (its token decides what the viewer may see).
    :param dependencies: FastAPI dependencies every page needs first (Airflow's authentication).
    :param token_form: offer a form to paste a hai token when the credentials are missing or refused.
    :param refused_fix: what to do when the hai server refuses the credentials.
    """
    pages = Pages()
    app = FastAPI(
        title="hai dashboard", docs_url=None, redoc_url=None, openapi_url=None, dependencies=[*dependencies]
    )
    app.state.client_for = client_for

    _error_pages(app, pages, token_form, refused_fix)

    @app.get("/", include_in_schema=False)
    async def home(request: Request) -> RedirectResponse:
        return RedirectResponse(f"{base_path(request)}/queue", status_code=303)

    _cluster_pages(app, pages)

    @app.get("/jobs", response_class=HTMLResponse)
    async def jobs(
        request: Request, id: str = "", state: str = "", user: str = "", labels: str = "", before: str = ""
    ) -> Response:
        """The task the search box names, or the task list (filters: state, user, labels; a page at a
        time). A bad id is answered before any sign-in is asked for."""
        return await _task_list(pages, request, id, data.JobsFilter(state, user, labels=labels), before)

    @app.get("/jobs/{job_id}", response_class=HTMLResponse)
    async def job(
        request: Request, job_id: int, c: Client, instance: Annotated[int | None, Query()] = None
    ) -> HTMLResponse:
        page = await data.job_page(c, job_id, instance, datetime.now(UTC))
        return pages.render(request, "job.html", f"Job {job_id}", c.connection.server, data=page)

    @app.get("/jobs/{job_id}/log", response_class=PlainTextResponse)
    async def log(job_id: int, instance: int, c: Client) -> PlainTextResponse:
        """The log tail the Job page follows; `X-Hai-Instance-Ended` tells it when to stop."""
        inst = await c.instance(instance)
        if inst.job_id != job_id:
            raise HaiError(404, f"instance {instance} does not belong to job {job_id}")
        text = await c.log(instance, tail=data.LOG_TAIL_LINES)
        headers = {
            "X-Hai-Instance-Ended": "1" if inst.ended_at is not None else "0",
            "Cache-Control": "no-store",
        }
        return PlainTextResponse(text, headers=headers)

    return app


def _cluster_pages(app: FastAPI, pages: Pages) -> None:
    """The pages about the cluster as a whole: Queue, Quota, Nodes and Usage."""

    @app.get("/queue", response_class=HTMLResponse)
    async def queue(request: Request, c: Client) -> HTMLResponse:
        page = await data.queue_page(c)
        return pages.render(request, "queue.html", "Queue", c.connection.server, data=page)

    @app.get("/quota", response_class=HTMLResponse)
    async def quota(request: Request, c: Client) -> HTMLResponse:
        page = await data.quota_page(c)
        return pages.render(request, "quota.html", "Quota", c.connection.server, data=page)

    @app.get("/nodes", response_class=HTMLResponse)
    async def nodes(request: Request, c: Client) -> HTMLResponse:
        page = await data.nodes_page(c)
        return pages.render(request, "nodes.html", "Nodes", c.connection.server, data=page)

    @app.get("/usage", response_class=HTMLResponse)
    async def usage(request: Request, c: Client) -> HTMLResponse:
        page = await data.usage_page(c, datetime.now(UTC))
        return pages.render(request, "usage.html", "Usage", c.connection.server, data=page)


def _error_pages(app: FastAPI, pages: Pages, token_form: bool, refused_fix: str) -> None:
    """A page, not JSON, for a viewer who must sign in, a hai server that cannot be reached, or a
    refusal; a refused token's cookie is dropped."""

    @app.exception_handler(SignInRequired)
    async def sign_in(request: Request, exc: SignInRequired) -> Response:
        return pages.error(request, 401, "Sign in to hai", exc.message, exc.fix, token_form=token_form)

    @app.exception_handler(HaiError)
    async def hai_error(request: Request, exc: HaiError) -> Response:
        if isinstance(exc, HaiUnreachable):
            return pages.error(request, 502, "hai server unreachable", exc.error, exc.fix)
        if exc.status == 401:
            response = pages.error(
                request,
                401,
                "Sign in to hai",
                f"The hai server refused: {exc.error}.",
                refused_fix,
                token_form=token_form,
            )
            response.delete_cookie(COOKIE, path=base_path(request) or "/")
            return response
        if exc.status == 404:
            return pages.error(request, 404, "Not found", exc.message)
        return pages.error(
            request, 502 if exc.status >= 500 else exc.status, "hai refused the request", exc.message
        )


def _job_number(typed: str) -> int | None:
    """The job id someone typed ("42", "#42"), or None."""
    number = typed.strip().lstrip("#")
    # isdigit() alone admits '²', which int() refuses; int() also refuses over 4,300 digits.
    if not (number.isascii() and number.isdigit() and len(number) <= 18):
        return None
    return int(number)


async def _task_list(pages: Pages, request: Request, typed: str, f: data.JobsFilter, before: str) -> Response:
    number = _job_number(typed or before)
    if (typed or before) and number is None:
        what = repr(typed) if typed else f"before={before!r}"
        return pages.error(request, 400, "Which job?", f"{what} is not a job id.", "Type a number such as 42")
    if typed:
        return RedirectResponse(f"{base_path(request)}/jobs/{number}", status_code=303)
    f = data.JobsFilter(f.state.strip().upper(), f.user.strip(), number, f.labels.strip())
    async with asynccontextmanager(_client)(request) as c:
        page = await data.jobs_page(c, f)
    older = urlencode({"state": f.state, "user": f.user, "labels": f.labels, "before": page.older})
    values: dict[str, Any] = {"states": list(JobState), "older_query": older}
    return pages.render(request, "jobs.html", "Tasks", c.connection.server, data=page, **values)
