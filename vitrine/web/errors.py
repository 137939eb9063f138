"""The one JSON error shape, ``{"error": {"status", "code", "message", "detail"?}}``, and the
handlers that turn domain errors (vitrine/errors.py) and framework errors into it.

Every code a route can answer is listed in the OpenAPI (:data:`ERROR_RESPONSES`, or a route's
own subset from :func:`errors_for`), each with an example body.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from vitrine.errors import (
    InvalidBody,
    InvalidImage,
    InvalidInput,
    ModelError,
    NotFound,
    StorageError,
    SwapRefused,
    TooLarge,
    Unauthorized,
    VitrineError,
)

log = logging.getLogger(__name__)


class ErrorDetail(BaseModel):
    status: int
    code: str = Field(description="not_found, invalid_input, invalid_image, too_large, unauthorized, "
                                  "unsupported_media_type, method_not_allowed, swap_refused, timeout, "
                                  "unavailable, internal, forbidden, rate_limited")
    message: str
    detail: Any = None


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer: ``{"error": {"status", "code", "message", "detail"?}}``."""

    error: ErrorDetail


def error_body(status: int, code: str, message: str, detail: Any = None) -> dict[str, Any]:
    err: dict[str, Any] = {"status": status, "code": code, "message": message}
    if detail is not None:
        err["detail"] = detail
    return {"error": err}


# status -> (code, what it means, an example message): the OpenAPI's list of error answers
_ERRORS: dict[int, tuple[str, str, str]] = {
    401: ("unauthorized", "A write or admin action without a valid X-API-Key",
          "a valid X-API-Key header is required for writes and admin actions"),
    403: ("forbidden", "A scoped key used outside its routes", "scoped key 3f2a9c1d0b7e may only call events, "
                                                                 "not search"),
    404: ("not_found", "No such product, image or path", "product 'p-123' not found"),
    405: ("method_not_allowed", "The path does not take this method", "Method Not Allowed"),
    409: ("swap_refused", "A hot swap's candidate failed a check (the live version keeps serving)",
          "candidate refused: canary recall@10 0.41 < 0.50"),
    413: ("too_large", "A body, photo or image over a configured limit",
          "request body over the limit of 16,000,000 bytes"),
    415: ("unsupported_media_type", "A body in a content type the route does not take",
          "/v1/search takes application/json, not text/plain"),
    422: ("invalid_input", "A parameter or body that fails validation; the message names the field",
          "body.sort: Input should be 'relevance', 'price_asc', 'price_desc' or 'newest'"),
    429: ("rate_limited", "Too many requests from this client or key; the Retry-After header says when to retry",
          "too many search requests from this client or key: retry after 2 s"),
    500: ("internal", "An unexpected server error", "internal server error"),
    503: ("unavailable", "A model or the storage is unavailable; retry with backoff",
          "the record store is unavailable"),
    504: ("timeout", "The request ran past its time limit", "the request took longer than 30 s"),
}
ALWAYS = (405, 413, 415, 422, 500, 503, 504)


def errors_for(*statuses: int, ok: Any = None, ok_type: str = "application/json") -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for these error statuses (plus those any route can answer); ``ok``:
    an example of the success answer, for routes without a response model that carries one."""
    out: dict[int | str, dict[str, Any]] = {}
    if ok is not None:
        out[200] = {"content": {ok_type: {"example": ok}}}
    for st in sorted(set(statuses) | set(ALWAYS)):
        code, what, example = _ERRORS[st]
        out[st] = {"model": ErrorBody, "description": f"`{code}`: {what}",
                   "content": {"application/json": {"example": error_body(st, code, example)}}}
    return out


def status_for(e: VitrineError) -> tuple[int, str]:
    if isinstance(e, NotFound):
        return 404, "not_found"
    if isinstance(e, TooLarge):
        return 413, "too_large"
    if isinstance(e, InvalidImage):
        return 422, "invalid_image"
    if isinstance(e, InvalidInput):
        return 422, "invalid_input"
    if isinstance(e, Unauthorized):
        return 401, "unauthorized"
    if isinstance(e, SwapRefused):
        return 409, "swap_refused"
    if isinstance(e, (ModelError, StorageError)):
        return 503, "unavailable"
    return 500, "internal"


async def _domain(_: Request, e: VitrineError) -> JSONResponse:
    status, code = status_for(e)
    if status >= 500:
        log.error("%s: %s", code, e)
    report: Any = getattr(e, "report", None)  # a pydantic model where the error carries one
    detail = report.model_dump() if hasattr(report, "model_dump") else None
    if isinstance(e, InvalidBody):  # each field that does not fit the schema
        detail = e.detail
    headers = {"Retry-After": "1"} if status == 503 else None  # a store or model that is down: back soon
    return JSONResponse(error_body(status, code, str(e), detail), status_code=status, headers=headers)


async def _validation(request: Request, e: RequestValidationError) -> JSONResponse:
    return await _domain(request, InvalidBody([{"loc": list(err.get("loc", ())), "msg": err.get("msg")}
                                               for err in e.errors()]))


async def _http(_: Request, e: StarletteHTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized", 413: "too_large",
            415: "unsupported_media_type", 504: "timeout"}.get(e.status_code, "http_error")
    return JSONResponse(error_body(e.status_code, code, str(e.detail)), status_code=e.status_code,
                        headers=getattr(e, "headers", None))


def install_handlers(app: FastAPI) -> None:
    """Domain, validation and framework errors, all in the one JSON shape."""
    # FastAPI's decorator takes a handler of the exception it names (Starlette's add_exception_handler
    # types every handler as taking any Exception)
    app.exception_handler(VitrineError)(_domain)
    app.exception_handler(RequestValidationError)(_validation)
    app.exception_handler(StarletteHTTPException)(_http)
