"""The dashboard as `hai serve` mounts it at /ui: the viewer signs in with their own hai token."""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx
from fastapi import FastAPI, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from starlette.types import ASGIApp

from hai_airflow.client import AsyncHaiClient, HaiError
from hai_airflow.dashboard.app import COOKIE, Pages, SignInRequired, base_path, create_dashboard_app

TOKEN_FIX = (
    "Paste your API token below (hai serve wrote the admin's to $HAI_HOME/token), "
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

    The viewer's hai token comes from `Authorization: Bearer`, or from the sign-in form: a POST from
    this dashboard's own page, checked with the API, that sets an HttpOnly, SameSite=Strict cookie.
    The API then shows them what that token may see.

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
    pages = Pages()

    @app.post("/sign-in", response_model=None)
    async def sign_in(
        request: Request, token: str = Form(""), next: str = Form("")
    ) -> RedirectResponse | HTMLResponse:
        """Sign in by POST from this dashboard's own form, with a token the API accepts: a link or
        another site's form cannot sign a viewer in as someone else (login CSRF)."""
        if not _same_origin(request):
            return pages.error(
                request, 403, "Sign-in refused", "The sign-in did not come from this dashboard's page.",
                "Open the dashboard and sign in there", token_form=True,
            )  # fmt: skip
        token = token.strip()
        try:
            async with await _checked(request, token):
                pass
        except HaiError as e:
            return pages.error(request, 401, "Sign in to hai", e.message, TOKEN_FIX, token_form=True)
        base = base_path(request)
        response = RedirectResponse(_local(next, base) or f"{base}/", 303)
        response.set_cookie(
            COOKIE,
            token,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path=base or "/",
        )
        return response

    async def _checked(request: Request, token: str) -> AsyncHaiClient:
        """A client of the token once the API has accepted it (`whoami`); raises HaiError when not."""
        if not token:
            raise HaiError(401, "no API token was given", None, TOKEN_FIX)
        client = await client_for(_with_bearer(request, token))
        try:
            await client.whoami()
        except BaseException:
            await client.aclose()
            raise
        return client

    return app


def _with_bearer(request: Request, token: str) -> Request:
    headers = [(k, v) for k, v in request.scope["headers"] if k != b"authorization"]
    scope = {**request.scope, "headers": [*headers, (b"authorization", f"Bearer {token}".encode())]}
    return Request(scope)


def _same_origin(request: Request) -> bool:
    """Whether a form POST came from a page of this site (Fetch metadata, else the Origin header)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site in ("same-origin", "none")
    origin = request.headers.get("origin")
    return origin is None or urlsplit(origin).netloc == request.headers.get("host", "")


def _local(target: str, base: str) -> str | None:
    """`target` when it is a path of this dashboard (never another site's address), else None."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith(f"{base}/") or "\\" in target:
        return None
    return target
