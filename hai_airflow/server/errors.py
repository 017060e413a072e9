"""API errors as the client expects them: JSON `{"error", "field", "fix"}` with a 4xx status."""

from __future__ import annotations

import difflib
import logging
import typing
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from hai_airflow.server.store.outage import STORE_UNAVAILABLE, Outage
from hai_airflow.vocabulary import FIELD_FLAGS

logger = logging.getLogger(__name__)
api_outage = Outage(logger, "API (answering 503)")
"""The API's log of store outages: one line when it starts, then every half minute, not one per request."""


class ApiError(Exception):
    """A refusal the caller can act on: what failed, which field, how to fix it."""

    def __init__(self, status: int, error: str, field: str | None = None, fix: str | None = None):
        super().__init__(error)
        self.status = status
        self.error = error
        self.field = field
        self.fix = fix


RETRY_AFTER_SECONDS = 5


class ServerStopping(Exception):
    """Raised inside a streamed answer when `hai serve` stops: the connection is cut rather than
    ended, so a follower knows the stream broke (and reconnects), not that the log ended."""


def not_found(what: str, ident: object, fix: str | None = None) -> ApiError:
    return ApiError(404, f"{what} {ident} not found", field=None, fix=fix)


_MODES = frozenset({"cpu", "standalone", "distributed"})


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    """("body", "spec", "standalone", "max_schedule") -> "spec.max_schedule".

    The location kind, the union tag and pydantic's "[key]" marker are noise to someone fixing a
    command line.
    """
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    out = ""
    for i, p in enumerate(parts):
        if (i > 0 and parts[i - 1] == "spec" and p in _MODES) or p == "[key]":
            continue
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += f".{p}" if out else str(p)
    return out


_FIXES = {
    "extra_forbidden": "Remove it (see the API docs at /docs for the fields)",
    "union_tag_invalid": "Use mode cpu, standalone or distributed",
    "union_tag_not_found": "Set spec.mode to cpu, standalone or distributed",
    "int_type": "Give a whole number",
    "int_parsing": "Give a whole number",
    "int_from_float": "Give a whole number",
    "float_type": "Give a number",
    "float_parsing": "Give a number",
    "bool_type": "Give true or false",
    "bool_parsing": "Give true or false",
    "string_type": "Give a JSON string",
    "string_unicode": "Send the text as UTF-8, without lone surrogate escapes such as \\ud800",
    "dict_type": "Give a JSON object",
    "model_type": "Give a JSON object",
    "model_attributes_type": "Give a JSON object",
    "tuple_type": "Give a JSON array",
    "list_type": "Give a JSON array",
}
"""Fixes by pydantic error type; rules of our own carry theirs (`spec.refusal`)."""

_BOUNDS = {
    "less_than_equal": ("le", "at most {}"),
    "less_than": ("lt", "less than {}"),
    "greater_than_equal": ("ge", "at least {}"),
    "greater_than": ("gt", "more than {}"),
    "string_too_long": ("max_length", "at most {} characters long"),
    "string_too_short": ("min_length", "at least {} characters long"),
    "too_long": ("max_length", "at most {} items"),
    "too_short": ("min_length", "at least {} items"),
}
"""Errors that name a limit: the fix states it."""


def _fix(kind: str, field: str, ctx: dict[str, Any]) -> str:
    """How to correct one field, in the caller's words."""
    if isinstance(ctx.get("fix"), str):
        return str(ctx["fix"])
    if kind == "missing":
        return f"Add {field}"
    if kind in _BOUNDS:
        key, text = _BOUNDS[kind]
        if key in ctx:
            return f"Make {field} " + text.format(ctx[key])
    if kind in ("literal_error", "enum") and "expected" in ctx:
        return f"Use one of {ctx['expected']}"
    return _FIXES.get(kind) or f"Correct {field} (see the API docs at /docs for what it accepts)"


def _required_fields(request: Request) -> list[str]:
    """The required fields of the route's JSON body model (`spec` for a submit)."""
    model = _body_model(request)
    return [name for name, f in model.model_fields.items() if f.is_required()] if model is not None else []


def _body_model(request: Request) -> type[BaseModel] | None:
    """The model of the route's JSON body (`SubmitRequest` for a submit)."""
    body_field = getattr(request.scope.get("route"), "body_field", None)
    model = getattr(getattr(body_field, "field_info", None), "annotation", None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation holds (a union's members)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _tagged(model: type[BaseModel], tag: object) -> bool:
    """Whether `tag` is the model's union tag (its `mode: Literal["standalone"]`)."""
    return any(
        typing.get_origin(f.annotation) is Literal and tag in typing.get_args(f.annotation)
        for f in model.model_fields.values()
    )


def _fields_at(request: Request, path: tuple[Any, ...]) -> list[str]:
    """The fields of the object at `path` in the body (("spec", "standalone"): the spec of that mode),
    what an unknown key there could have meant; none where the path cannot be followed."""
    models = _models(_body_model(request))
    for part in path:
        if len(models) > 1:  # a union: the part is its tag
            models = [m for m in models if _tagged(m, part)]
            continue
        found = models[0].model_fields.get(str(part)) if len(models) == 1 else None
        if found is None:
            return []
        models = _models(found.annotation)
    return list(models[0].model_fields) if len(models) == 1 else []


def _near(name: str, known: list[str]) -> str | None:
    """The known field an unknown one most likely meant: the field a flag's name stands for
    (`time_limit` for `time_limit_seconds`), else the nearest spelling (`gpu_typ` for `gpu_type`)."""
    by_flag = {flag: field for field, flag in FIELD_FLAGS.items()}
    if by_flag.get(name) in known:
        return by_flag[name]
    return next(iter(difflib.get_close_matches(name, known, n=1)), None)


def _body_shape(names: list[str]) -> str:
    """The body in words, e.g. a JSON object with `spec`."""
    return "a JSON object" + (" with " + " and ".join(f"`{n}`" for n in names) if names else "")


def _body_example(names: list[str]) -> str:
    """A body to copy, e.g. {"spec": ...}."""
    return "{" + ", ".join(f'"{n}": ...' for n in names) + "}" if names else "{...}"


_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "true or false"}


def _whole_body_error(err: dict[str, Any], request: Request) -> ApiError:
    """The body as a whole is wrong: empty, `null`, not JSON, not an object, or not sent as JSON."""
    names = _required_fields(request)
    shape = _body_shape(names)
    fix = f"Send {_body_example(names)} with Content-Type: application/json (see /docs)"
    kind = str(err.get("type", ""))
    body = err.get("input")
    if kind == "json_invalid":
        detail = (err.get("ctx") or {}).get("error", "malformed")
        pos = err["loc"][1] if len(err.get("loc", ())) > 1 else None
        where = f" at character {pos}" if isinstance(pos, int) else ""
        return ApiError(422, f"the request body is not valid JSON ({detail}{where})", fix=fix)
    if kind == "missing":
        return ApiError(422, f"the request body is empty or null; it must be {shape}", fix=fix)
    if isinstance(body, bytes | bytearray):
        sent = request.headers.get("content-type") or "no content type"
        return ApiError(422, f"the request body must be JSON, not {sent}; it must be {shape}", fix=fix)
    what = _JSON_KINDS.get(type(body), "something else")
    return ApiError(422, f"the request body must be {shape}, not {what}", fix=fix)


def validation_error(exc: RequestValidationError, request: Request) -> ApiError:
    err = exc.errors()[0]
    loc = tuple(err.get("loc", ()))
    kind = str(err.get("type", ""))
    if loc[:1] == ("body",) and (len(loc) == 1 or kind == "json_invalid"):
        return _whole_body_error(err, request)
    field = _field(loc) or None
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if kind == "missing":
        error = f"{field} is required"
    elif kind == "extra_forbidden":
        error = f"{field} is not a known field"
    else:
        error = f"{field}: {msg}" if field else msg
    fix = _fix(kind, field or "the value", err.get("ctx") or {})
    if kind == "extra_forbidden" and field and (near := _near(str(loc[-1]), _fields_at(request, loc[1:-1]))):
        meant = field.rpartition(".")[0] + "." + near if "." in field else near
        fix = f"Did you mean {meant}? Rename {field} to {meant}"
    return ApiError(422, error, field=field, fix=fix)


def _printable(text: str | None) -> str | None:
    """Text that encodes as UTF-8: an echoed name may hold a lone surrogate from a `\\ud800` escape."""
    return None if text is None else text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_response(e: ApiError) -> JSONResponse:
    """The one JSON shape of every refusal."""
    content = {"error": _printable(e.error), "field": _printable(e.field), "fix": _printable(e.fix)}
    return JSONResponse(status_code=e.status, content=content)


_HTTP_FIXES = {
    400: "Send JSON with Content-Type: application/json (numbers of at most 4,300 digits); see /docs",
    404: "See /docs for the endpoints",
    405: "See /docs for the methods of this endpoint",
}


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc, request))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        fix = getattr(exc, "fix", None) or _HTTP_FIXES.get(exc.status_code)
        return error_response(ApiError(exc.status_code, str(exc.detail), fix=fix))

    for unavailable in STORE_UNAVAILABLE:

        @app.exception_handler(unavailable)
        async def _store_unavailable(_request: Request, exc: Exception) -> JSONResponse:
            # The store is down or unreachable for now (a restart, a network cut, a locked file): the
            # request did nothing it could keep, and the same request a little later may succeed.
            api_outage.failed(exc)
            answer = error_response(
                ApiError(
                    503,
                    "the server's database is unavailable for now",
                    fix=f"Retry in {RETRY_AFTER_SECONDS} s (hai and the Airflow operators retry by "
                    "themselves)",
                )
            )
            answer.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
            return answer

    @app.exception_handler(Exception)
    async def _crash(_request: Request, exc: Exception) -> JSONResponse:
        # The traceback goes to the server log; the caller gets a sentence, never a stack.
        return error_response(
            ApiError(500, f"internal error ({type(exc).__name__})", fix="See the hai serve log")
        )


class ErrorBody(BaseModel):
    """Every refusal: what failed, the field at fault (if one is), and how to fix it."""

    error: str = Field(description="What failed, in plain words.")
    field: str | None = Field(description="The field at fault, e.g. spec.cmd; null when no one field is.")
    fix: str | None = Field(description="How to fix it.")


def _documented(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _documented("The request body could not be read"),
    401: _documented("No token, or one the server does not know"),
    403: _documented("The caller may not do this"),
    404: _documented("No such job, instance, user or group (or not one the caller may see)"),
    409: _documented("Refused in the current state: over quota, already ended, not suspended..."),
    413: _documented("The request body is larger than `[server] max_body_bytes`"),
    422: _documented("The request is not valid: the field at fault and how to fix it"),
    503: _documented("The server's database is unavailable for now: retry after `Retry-After` seconds"),
}
"""The refusals every API operation may answer with, in its OpenAPI description."""


def json_refusals(openapi: dict[str, Any]) -> dict[str, Any]:
    """Document refusals as JSON on every operation, also where success is text (a log):
    FastAPI gives an operation's extra responses the media type of its success."""
    for operations in openapi.get("paths", {}).values():
        for operation in operations.values():
            for status, response in operation.get("responses", {}).items():
                content = response.get("content", {})
                if status[:1] in ("4", "5") and "application/json" not in content and content:
                    content["application/json"] = content.pop(next(iter(content)))
    return openapi
