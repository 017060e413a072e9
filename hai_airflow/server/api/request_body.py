"""What the API reads at its edge: a bounded request body, and JSON bodies validated without coercion."""

from __future__ import annotations

import inspect
import json
from typing import Any, TypeVar

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hai_airflow.server.errors import ApiError, error_response

M = TypeVar("M", bound=BaseModel)


def body_too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        f"the request body is larger than {limit:,} bytes",
        fix="Send less: put large commands and values in files under the code path",
    )


class _BodyTooLarge(StarletteHTTPException):
    """Raised from inside the body read, where FastAPI passes HTTP exceptions on to the handlers."""

    def __init__(self, limit: int):
        refusal = body_too_large(limit)
        super().__init__(refusal.status, refusal.error)
        self.fix = refusal.fix


class BodySizeLimit:
    """Refuses a request body over `limit` bytes with 413 before it is held in memory: at once when
    Content-Length says so, else as soon as the streamed (chunked) body passes the limit."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await error_response(body_too_large(self.limit))(scope, receive, send)
            return
        received = 0

        async def bounded() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise _BodyTooLarge(self.limit)
            return message

        await self.app(scope, bounded, send)


def _schema_number(text: str) -> float | int:
    """A JSON number as JSON Schema reads it: 30.0 is an integer (strict pydantic would refuse it)."""
    number = float(text)
    return int(number) if number.is_integer() else number


def strict_body(model: type[M]) -> Any:
    """A dependency giving the route's body as `model`, validated as JSON in strict mode.

    FastAPI validates the body first, as Python objects in lax mode (documenting it in OpenAPI and
    wording whole-body errors); this second pass refuses what lax mode would coerce against the
    schema: `true` or "4" for a number, 1 or "yes" for a boolean, "10111,10222" for an array.
    """

    async def parse(request: Request, body: Any) -> M:
        text = json.dumps(json.loads(await request.body(), parse_float=_schema_number), ensure_ascii=False)
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError(
                422,
                "the request body holds text that is not Unicode (a lone surrogate escape such as \\ud800)",
                fix="Send the text as UTF-8",
            ) from None
        try:
            return model.model_validate_json(data, strict=True)
        except ValidationError as error:
            raise RequestValidationError(
                [{**e, "loc": ("body", *e["loc"])} for e in error.errors(include_url=False)]
            ) from None

    # FastAPI reads the body parameter's type from the signature: make it `model`, not Any.
    parse.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request),
            inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=model),
        ],
        return_annotation=model,
    )
    return Depends(parse)
