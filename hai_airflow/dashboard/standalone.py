"""The dashboard as `hai serve` mounts it at /ui: the viewer signs in with their own hai token."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import RedirectResponse
from starlette.types import ASGIApp

from hai_airflow.client import AsyncHaiClient
from hai_airflow.dashboard.app import COOKIE, SignInRequired, base_path, create_dashboard_app

TOKEN_FIX = (
    "Open the page once with ?token=<your token> (hai serve wrote the admin's to $HAI_HOME/token), "
    "or send Authorization: Bearer <token>"
)


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def _origin(request: Request) -> str:
    """The address the viewer reached us on (through any proxy): how the pages name the server."""
    return f"{request.url.scheme}://{request.url.netloc}"


def create_standalone_dashboard(api: str | ASGIApp) -> FastAPI:
    """The dashboard for `hai serve`: `app.mount("/ui", create_standalone_dashboard(app))`.

    The viewer's hai token comes from `Authorization: Bearer`, or from `?token=` once, which is
    moved into an HttpOnly cookie and dropped from the address; the API then shows them what that
    token may see.

    :param api: the hai API app itself, called in-process (no socket, no TLS, whatever proxy is in
        front), or the URL of a hai server to call over HTTP.
    """

    async def client_for(request: Request) -> AsyncHaiClient:
        token = _bearer(request) or request.cookies.get(COOKIE)
        if not token:
            raise SignInRequired("This dashboard shows what your hai API token may see.", TOKEN_FIX)
        if isinstance(api, str):
            return AsyncHaiClient(server=api, token=token)
        # Errors come back as the API's own 500 response rather than as an exception in the page.
        transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
        return AsyncHaiClient(server=_origin(request), token=token, transport=transport)

    app = create_dashboard_app(client_for, token_form=True, refused_fix=TOKEN_FIX)

    @app.middleware("http")
    async def token_to_cookie(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        token = request.query_params.get("token")
        if request.method != "GET" or token is None:
            return await call_next(request)
        # The token leaves the address bar (and the browser history) at once.
        target = request.url.remove_query_params("token")
        response = RedirectResponse(target.path + (f"?{target.query}" if target.query else ""), 303)
        response.set_cookie(
            COOKIE,
            token.strip(),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path=base_path(request) or "/",
        )
        return response

    return app
