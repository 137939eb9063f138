"""Search: words, a photo, or both (JSON or multipart), and the catalogue's filter values."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Annotated

import anyio
from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import Response
from pydantic import ValidationError

from vitrine.errors import InvalidImage, InvalidInput, TooLarge
from vitrine.search.models import FacetField, FacetsResponse, Filters, SearchRequest, SearchResponse, SortOrder
from vitrine.web.deps import EngineDep, MetricsDep, SettingsDep, json_response
from vitrine.web.errors import errors_for
from vitrine.web.limits import client_of

router = APIRouter(tags=["search"])


async def _searching(request: Request, fn: Callable[..., SearchResponse], req: SearchRequest) -> SearchResponse:
    """``fn(req)`` in a worker thread; with ``search_concurrency`` set, at most that many at once
    in this process, the rest waiting in line (first come, first served) instead of all of them
    interleaving on the interpreter lock. Off by default: no clear gain measured at 3."""
    client = client_of(request.app.state.settings, request.client.host if request.client else None,
                       request.headers.get("user-agent"), request.headers.get("x-api-key"))
    return await anyio.to_thread.run_sync(functools.partial(fn, client=client), req,
                                          limiter=getattr(request.app.state, "search_slots", None))


@router.post("/search", response_model=SearchResponse, response_model_exclude_none=True,
             responses=errors_for(401, 403, 429))
async def search(req: SearchRequest, engine: EngineDep, metrics: MetricsDep, request: Request) -> Response:
    """Search by words (`text`), a photo (`image_b64`) or both, with filters."""
    res = await _searching(request, functools.partial(engine.search, log_search=True), req)
    metrics.observe_search(res, "image" if req.image_b64 else "text")
    return json_response(res)


@router.post("/search/image", response_model=SearchResponse, response_model_exclude_none=True,
             responses=errors_for(401, 403, 429))
async def search_image(
    engine: EngineDep,
    settings: SettingsDep,
    metrics: MetricsDep,
    request: Request,
    file: Annotated[UploadFile, File(description="The photo (JPEG, PNG, WEBP, GIF, BMP)")],
    text: Annotated[str | None, Form()] = None,
    k: Annotated[int, Form(ge=1, description="Results per page")] = 10,
    offset: Annotated[int, Form(ge=0, description="Results to skip")] = 0,
    sort: Annotated[SortOrder, Form(description="relevance, price_asc, price_desc or newest")] = "relevance",
    facets: Annotated[list[FacetField] | None, Form(description="Fields to count (repeatable)")] = None,
    highlight: Annotated[bool, Form()] = False,
    filters: Annotated[str | None, Form(description="Filters as a JSON object")] = None,
    explain: Annotated[bool, Form()] = False,
    user: Annotated[str | None, Form(description="Pseudonymous shopper token (experiments, events)")] = None,
    session: Annotated[str | None, Form(description="Shopping session id")] = None,
    new_search: Annotated[bool | None, Form(description="With a session: true starts over, false refines")] = None,
) -> Response:
    """Search with an uploaded photo (multipart), optionally with words and filters."""
    ctype = (file.content_type or "").split(";")[0].strip().lower()
    if ctype and not (ctype.startswith("image/") or ctype == "application/octet-stream"):
        raise InvalidImage(f"uploaded file has content type {ctype!r}; expected an image")
    data = await file.read(settings.encoders.max_image_bytes + 1)
    if len(data) > settings.encoders.max_image_bytes:
        raise TooLarge(f"photo over the limit of {settings.encoders.max_image_bytes:,} bytes")
    flt = None
    if filters:
        try:
            flt = Filters.model_validate(json.loads(filters))
        except (json.JSONDecodeError, ValidationError) as e:
            raise InvalidInput(f"filters must be a JSON object of known filter fields: {e}") from e
    try:
        req = SearchRequest(text=text, k=k, offset=offset, sort=sort, facets=facets or [], highlight=highlight,
                            filters=flt, explain=explain, user=user or None, session=session or None,
                            new_search=new_search)
    except ValidationError as e:
        raise InvalidInput(f"invalid search: {e}") from e
    res = await _searching(request, functools.partial(engine.search, image=data, log_search=True), req)
    metrics.observe_search(res, "image")
    return json_response(res)


@router.get("/facets", response_model=FacetsResponse, responses=errors_for())
def facets(
    engine: EngineDep,
    field: Annotated[list[str] | None, Query(description="category, gender, colour, brand (repeatable)")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> FacetsResponse:
    """Filter values with product counts over the whole catalogue, most common first."""
    return engine.facets(field, limit)
