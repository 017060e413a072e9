"""The dashboard as `hai serve` mounts it at /ui: the viewer signs in with their own hai token."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from fastapi.responses import RedirectResponse

from hai_airflow.client import HaiClient
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


def _own_url(request: Request) -> str | None:
    """The address this request reached the server on, so the dashboard calls the API it is part of."""
    server = request.scope.get("server")
    if not server or server[1] is None:
        return None
    host, port = server
    host = f"[{host}]" if ":" in host else host
    return f"{request.url.scheme}://{host}:{port}"


def create_standalone_dashboard(server_url: str | None = None) -> FastAPI:
    """The dashboard for `hai serve`: `app.mount("/ui", create_standalone_dashboard())`.

    The viewer's hai token comes from `Authorization: Bearer`, or from `?token=` once, which is
    moved into an HttpOnly cookie and dropped from the address; the API then shows them what that
    token may see.

    :param server_url: the hai API; default: the address the request came in on (the same server).
    """

    def client_for(request: Request) -> HaiClient:
        token = _bearer(request) or request.cookies.get(COOKIE)
        if not token:
            raise SignInRequired("This dashboard shows what your hai API token may see.", TOKEN_FIX)
        return HaiClient(server=server_url or _own_url(request), token=token)

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
