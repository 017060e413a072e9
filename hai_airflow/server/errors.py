"""API errors as the client expects them: JSON `{"error", "field", "fix"}` with a 4xx status."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


class ApiError(Exception):
    """A refusal the caller can act on: what failed, which field, how to fix it."""

    def __init__(self, status: int, error: str, field: str | None = None, fix: str | None = None):
        super().__init__(error)
        self.status = status
        self.error = error
        self.field = field
        self.fix = fix


def not_found(what: str, ident: object, fix: str | None = None) -> ApiError:
    return ApiError(404, f"{what} {ident} not found", field=None, fix=fix)


_MODES = frozenset({"cpu", "standalone", "distributed"})


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    """("body", "spec", "standalone", "max_schedule") -> "spec.max_schedule".

    The location kind and the union tag are noise to someone fixing a command line.
    """
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    out = ""
    for i, p in enumerate(parts):
        if i > 0 and parts[i - 1] == "spec" and p in _MODES:
            continue
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += f".{p}" if out else str(p)
    return out


_FIXES = {
    "missing": "Add it",
    "extra_forbidden": "Remove it (see the API docs at /docs for the fields)",
    "union_tag_invalid": "Use mode cpu, standalone or distributed",
    "union_tag_not_found": "Set spec.mode to cpu, standalone or distributed",
}


def validation_error(exc: RequestValidationError) -> ApiError:
    err = exc.errors()[0]
    field = _field(tuple(err.get("loc", ()))) or None
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    kind = str(err.get("type", ""))
    if kind == "missing":
        error = f"{field} is required"
    elif kind == "extra_forbidden":
        error = f"{field} is not a known field"
    elif kind == "json_invalid":
        error = "the request body is not valid JSON"
    else:
        error = f"{field}: {msg}" if field else msg
    fix = _FIXES.get(kind) or (f"Correct {field}" if field else "Correct the request")
    return ApiError(422, error, field=field, fix=fix)


def install_handlers(app: FastAPI) -> None:
    def _json(e: ApiError) -> JSONResponse:
        return JSONResponse(status_code=e.status, content={"error": e.error, "field": e.field, "fix": e.fix})

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return _json(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return _json(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        fix = "See /docs for the endpoints" if exc.status_code in (404, 405) else None
        return _json(ApiError(exc.status_code, str(exc.detail), fix=fix))

    @app.exception_handler(Exception)
    async def _crash(_request: Request, exc: Exception) -> JSONResponse:
        # The traceback goes to the server log; the caller gets a sentence, never a stack.
        return _json(ApiError(500, f"internal error ({type(exc).__name__})", fix="See the hai serve log"))
