"""The dashboard inside Airflow: a plugin app at /hai behind Airflow's own sign-in, showing each
signed-in Airflow user their own hai view, and its nav entry."""

from __future__ import annotations

from typing import Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import Depends, FastAPI, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from hai_airflow.client import AsyncHaiClient, Connection, HaiError
from hai_airflow.dashboard.app import create_dashboard_app
from hai_airflow.dashboard.paths import URL_PREFIX
from hai_airflow.hooks.hai import DEFAULT_CONN_ID, HaiHook
from hai_airflow.hooks.retry import is_transient

VIEW_NAME = "GPU training"
"""The nav entry's name, and the custom-view resource an auth manager grants access to."""


def requires_dashboard_access(request: Request, user: GetUserDep) -> None:
    """Airflow's authentication (JWT cookie or Bearer), then its authorization for this custom view.

    The signed-in user is kept on the request: the pages show hai as that person sees it.
    """
    if not get_auth_manager().is_authorized_custom_view(method="GET", resource_name=VIEW_NAME, user=user):
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"not allowed to view {VIEW_NAME}")
    request.state.airflow_user = user.get_name()


def hai_connection(hai_conn_id: str, airflow_user: str) -> tuple[Connection, str | None]:
    """The hai server and token of the Airflow connection, and whom it acts for to show `airflow_user`
    their own view (the lookup may read Airflow's database).

    :raises HTTPException: 403 when hai will not let the connection act for that user.
    """
    hook = HaiHook(hai_conn_id=hai_conn_id)
    try:
        acting = hook.act_for(airflow_user)
        return hook.get_conn().connection, acting.on_behalf_of
    except HaiError as e:
        if is_transient(e):
            raise
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, f"hai will not show {airflow_user} their view: {e.message}"
        ) from None
    finally:
        hook.close()


def _wants_html(request: Request) -> bool:
    return "text/html" in request.headers.get("accept", "")


def create_airflow_dashboard(hai_conn_id: str = DEFAULT_CONN_ID) -> FastAPI:
    """The dashboard app as an Airflow plugin serves it; it reaches hai through `hai_conn_id`."""

    async def client_for(request: Request) -> AsyncHaiClient:
        # Only the connection lookup takes a worker thread; the page's calls to hai are asynchronous.
        airflow_user = getattr(request.state, "airflow_user", None)
        if not airflow_user:
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "sign in to Airflow to see your hai jobs")
        conn, on_behalf_of = await run_in_threadpool(hai_connection, hai_conn_id, airflow_user)
        return AsyncHaiClient(
            server=conn.server, token=conn.token, region=conn.region, on_behalf_of=on_behalf_of
        )

    app = create_dashboard_app(
        client_for,
        dependencies=[Depends(requires_dashboard_access)],
        refused_fix=f"Set the password (API token) of the Airflow connection {hai_conn_id!r} to a hai token",
    )

    @app.exception_handler(StarletteHTTPException)
    def signed_out(request: Request, exc: StarletteHTTPException) -> Response:
        # A browser without a session goes to Airflow's login page and comes back; API callers get the status.
        if exc.status_code == status.HTTP_401_UNAUTHORIZED and _wants_html(request):
            login = get_auth_manager().get_url_login(next_url=str(request.url))
            return RedirectResponse(login, status_code=status.HTTP_303_SEE_OTHER)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    return app


def fastapi_apps() -> list[dict[str, Any]]:
    """`AirflowPlugin.fastapi_apps`: the dashboard at /hai."""
    return [{"app": create_airflow_dashboard(), "url_prefix": URL_PREFIX, "name": "hai dashboard"}]


def external_views() -> list[dict[str, Any]]:
    """`AirflowPlugin.external_views`: "GPU training" in Airflow's nav, the dashboard in an iframe."""
    return [
        {
            "name": VIEW_NAME,
            "href": f"{URL_PREFIX}/queue",
            "destination": "nav",
            "url_route": "hai",
            "nav_top_level": True,
        }
    ]
