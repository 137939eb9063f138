"""FastAPI service: search, products, photos, health, metrics, and the browser UI.

Models load in the lifespan (never at import). Domain errors become HTTP errors here and
only here, all in one JSON shape: ``{"error": {"status", "code", "message", "detail"?}}``.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import hmac
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
from fastapi import Depends, FastAPI, File, Form, Header, Query, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vitrine import __version__
from vitrine.errors import (
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
from vitrine.index.vectors import set_search_threads
from vitrine.search.engine import Engine, ProductInput
from vitrine.search.models import FacetsResponse, Filters, Product, ProductOut, SearchRequest, SearchResponse
from vitrine.search.models import CompareRequest, CompareResponse, RecommendResponse
from vitrine.search.settings import Settings
from vitrine.search.swap import SwapReport, SwapRequest
from vitrine.web.guards import ContentTypeGuard, RequestTimeout
from vitrine.web.memory import limit_heap_growth
from vitrine.web.metrics import Metrics

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"


class ErrorDetail(BaseModel):
    status: int
    code: str = Field(description="not_found, invalid_input, invalid_image, too_large, unauthorized, "
                                  "unsupported_media_type, swap_refused, timeout, unavailable, internal, ...")
    message: str
    detail: Any = None


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer: ``{"error": {"status", "code", "message", "detail"?}}``."""

    error: ErrorDetail


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorBody, "description": "Refused: the one JSON error shape says why"},
    "5XX": {"model": ErrorBody, "description": "Failed or unavailable: the one JSON error shape"},
}


def error_body(status: int, code: str, message: str, detail: Any = None) -> dict[str, Any]:
    err: dict[str, Any] = {"status": status, "code": code, "message": message}
    if detail is not None:
        err["detail"] = detail
    return {"error": err}


def _status_for(e: VitrineError) -> tuple[int, str]:
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


class ObserveRequests:
    """Request count and latency per route (Prometheus), and the one JSON error shape for an
    unhandled error. Plain ASGI rather than ``@app.middleware("http")``: Starlette's
    BaseHTTPMiddleware streams every response through an extra task and queue, a measurable share
    of a search's CPU on a busy server."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status: int | None = None

        async def observed_send(msg: Message) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, observed_send)
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if status is not None:  # the answer had started: nothing to do but cut it short
                raise
            status = 500
            response = JSONResponse(error_body(500, "internal", "internal server error"), status_code=500)
            await response(scope, receive, send)
        route = scope.get("route")
        self.metrics.observe_request(scope.get("method", ""), getattr(route, "path", "unmatched"), status or 500,
                                     time.perf_counter() - t0)


class BodyLimit:
    """Refuses request bodies over ``limit`` bytes with 413, declared or streamed."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for k, v in scope.get("headers", []):
            if k == b"content-length":
                try:
                    declared = int(v)
                except ValueError:
                    declared = -1
                if declared > self.limit or declared < 0:
                    return await self._reject(send)
        seen = 0
        started = False

        async def limited() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise _BodyTooLarge
            return msg

        async def tracking_send(msg: Message) -> None:
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, limited, tracking_send)
        except _BodyTooLarge:
            if not started:
                await self._reject(send)

    async def _reject(self, send: Send) -> None:
        body = json.dumps(error_body(413, "too_large", f"request body over the limit of {self.limit:,} bytes"))
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body.encode()})


class _BodyTooLarge(Exception):
    pass


def _quiesce(eng: Engine) -> None:
    with eng._write_lock:  # waits for a snapshot (or write) in flight
        pass


def _json(model: SearchResponse) -> Response:
    """The engine's response model as JSON, as ``response_model_exclude_none`` would write it, but
    without FastAPI validating the already validated model again (a few ms per search)."""
    return Response(model.model_dump_json(exclude_none=True, by_alias=True), media_type="application/json")


async def get_engine(request: Request) -> Engine:
    # async: FastAPI runs a plain-def dependency in its thread pool, a hand-off per request
    return request.app.state.engine


EngineDep = Annotated[Engine, Depends(get_engine)]


def create_app(settings: Settings | None = None, engine: Engine | None = None, *,
               freeze_gc: bool | None = None) -> FastAPI:
    """The API. Give ``engine`` to serve an already open one (tests); otherwise the lifespan
    opens ``settings.data_dir`` and loads the models. ``freeze_gc`` (default: when the app opens
    its own engine) moves every object alive after warm-up out of the garbage collector's reach."""
    if settings is None:
        settings = engine.settings if engine is not None else Settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own = engine is None
        if own and settings.tune_malloc:
            limit_heap_growth()
        eng = engine if engine is not None else await asyncio.to_thread(Engine.open, settings)
        app.state.engine = eng
        if own:  # after the models loaded their libraries: the limits apply to loaded ones
            set_search_threads(settings.search_threads or 1)
        await asyncio.to_thread(eng.warm_up)  # the query fast path, BM25 and vocabularies: built before traffic
        if own if freeze_gc is None else freeze_gc:
            # Millions of long-lived objects (graph, vocabularies, model modules): a full collection
            # walked them all, a 300 ms pause for every request in flight. Freeze them out of the
            # collector; garbage made while serving is collected as before.
            gc.collect()
            gc.freeze()
        metrics.bind_engine(eng)
        app.state.search_slots = anyio.CapacityLimiter(settings.search_concurrency) \
            if settings.search_concurrency else None
        log.info("serving %d products from %s", len(eng), settings.data_dir)
        snapshots = asyncio.create_task(_snapshot_loop(eng)) if settings.snapshot_interval_s > 0 else None
        follow_s = settings.follow_s or (0.5 if settings.store else 1.0 if settings.workers > 1 else 0.0)
        follower = asyncio.create_task(_follow_loop(eng, follow_s)) if follow_s > 0 else None
        try:
            yield
        finally:
            if follower is not None:
                follower.cancel()
            if snapshots is not None:
                snapshots.cancel()
                await asyncio.to_thread(_quiesce, eng)  # a snapshot in flight finishes first
            if own:
                await asyncio.to_thread(eng.close)

    async def _follow_loop(eng: Engine, every_s: float) -> None:
        """Other processes write this data dir too (sibling workers, an ingest worker): replay
        their changes every ``every_s`` (cheap when nothing changed)."""
        while True:
            await asyncio.sleep(every_s)
            try:
                n = await asyncio.to_thread(eng.refresh)
                if n:
                    log.info("picked up %d products changed by other processes", n)
            except (StorageError, OSError, VitrineError) as e:
                log.error("catching up with the data dir failed (%s); trying again in %gs", e, every_s)

    async def _snapshot_loop(eng: Engine) -> None:
        """Writes are durable in the record store when they return; this snapshots the indexes
        every ``snapshot_interval_s`` when they changed, so a restart replays few changes."""
        while True:
            await asyncio.sleep(settings.snapshot_interval_s)
            if not eng._dirty:
                continue
            try:
                await asyncio.to_thread(eng.save)
            except (StorageError, OSError) as e:
                log.error("index snapshot failed (%s); the record store still holds every change", e)

    app = FastAPI(
        title="Vitrine",
        version=__version__,
        description="Multimodal semantic search for e-commerce: words, a photo, or both.",
        lifespan=lifespan,
        responses=ERROR_RESPONSES,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.add_middleware(RequestTimeout, limit_for=lambda path: settings.admin_timeout_s
                       if path.startswith("/admin/") else settings.request_timeout_s)
    app.add_middleware(ContentTypeGuard, json_prefixes=("/search", "/compare", "/products/", "/admin/"),
                       multipart_paths=("/search/image",))

    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["*"],
                           allow_headers=["*"])

    app.add_middleware(ObserveRequests, metrics=metrics)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)

    # -- errors: one JSON shape ---------------------------------------------------------------
    @app.exception_handler(VitrineError)
    async def _domain(_: Request, e: VitrineError) -> JSONResponse:
        status, code = _status_for(e)
        if status >= 500:
            log.error("%s: %s", code, e)
        report = getattr(e, "report", None)
        detail = report.model_dump() if hasattr(report, "model_dump") else None
        return JSONResponse(error_body(status, code, str(e), detail), status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError) -> JSONResponse:
        detail = [{"loc": list(err.get("loc", ())), "msg": err.get("msg")} for err in e.errors()]
        msg = "; ".join(f"{'.'.join(str(x) for x in d['loc'])}: {d['msg']}" for d in detail[:5])
        return JSONResponse(error_body(422, "invalid_input", msg or "invalid request", detail), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized", 413: "too_large",
                415: "unsupported_media_type", 504: "timeout"}.get(e.status_code, "http_error")
        return JSONResponse(error_body(e.status_code, code, str(e.detail)), status_code=e.status_code,
                            headers=getattr(e, "headers", None))

    def require_key(x_api_key: Annotated[str | None, Header()] = None) -> None:
        expected = settings.api_key.get_secret_value() if settings.api_key else None
        if not expected:
            raise Unauthorized("writes are disabled: the server has no API key configured (VITRINE_API_KEY)")
        if not x_api_key or not hmac.compare_digest(x_api_key.encode(), expected.encode()):
            raise Unauthorized("a valid X-API-Key header is required for writes and admin actions")

    # -- search -----------------------------------------------------------------------------------
    async def _searching(request: Request, fn: Callable[..., SearchResponse], req: SearchRequest) -> SearchResponse:
        """``fn(req)`` in a worker thread; with ``search_concurrency`` set, at most that many at once
        in this process, the rest waiting in line (first come, first served) instead of all of them
        interleaving on the interpreter lock. Off by default: no clear gain measured at 3."""
        return await anyio.to_thread.run_sync(fn, req, limiter=getattr(request.app.state, "search_slots", None))

    @app.post("/search", response_model=SearchResponse, response_model_exclude_none=True, tags=["search"])
    async def search(req: SearchRequest, engine: EngineDep, request: Request) -> Response:
        """Search by words (`text`), a photo (`image_b64`) or both, with filters."""
        res = await _searching(request, engine.search, req)
        metrics.observe_search(res, "image" if req.image_b64 else "text")
        return _json(res)

    @app.post("/search/image", response_model=SearchResponse, response_model_exclude_none=True, tags=["search"])
    async def search_image(
        engine: EngineDep,
        request: Request,
        file: Annotated[UploadFile, File(description="The photo (JPEG, PNG, WEBP, GIF, BMP)")],
        text: Annotated[str | None, Form()] = None,
        k: Annotated[int, Form(ge=1)] = 10,
        filters: Annotated[str | None, Form(description="Filters as a JSON object")] = None,
        explain: Annotated[bool, Form()] = False,
    ) -> Response:
        """Search with an uploaded photo (multipart), optionally with words and filters."""
        ctype = (file.content_type or "").split(";")[0].strip().lower()
        if ctype and not (ctype.startswith("image/") or ctype == "application/octet-stream"):
            raise InvalidImage(f"uploaded file has content type {ctype!r}; expected an image")
        data = await file.read(settings.max_image_bytes + 1)
        if len(data) > settings.max_image_bytes:
            raise TooLarge(f"photo over the limit of {settings.max_image_bytes:,} bytes")
        flt = None
        if filters:
            try:
                flt = Filters.model_validate(json.loads(filters))
            except (json.JSONDecodeError, ValidationError) as e:
                raise InvalidInput(f"filters must be a JSON object of known filter fields: {e}") from e
        req = SearchRequest(text=text, k=k, filters=flt, explain=explain)
        res = await _searching(request, functools.partial(engine.search, image=data), req)
        metrics.observe_search(res, "image")
        return _json(res)

    # -- products ---------------------------------------------------------------------------------
    @app.get("/products/{pid}", response_model=ProductOut, response_model_exclude_none=True, tags=["products"])
    def get_product(pid: str, engine: EngineDep) -> ProductOut:
        return engine.get(pid)

    # -- knowledge-graph endpoints: recommend and compare ------------------------------------------
    @app.get("/recommend/{pid}", response_model=RecommendResponse, response_model_exclude_none=True,
             tags=["products"])
    def recommend(
        pid: str, engine: EngineDep,
        kind: Annotated[Literal["similar", "complementary"], Query(
            description="similar: same category, nearest, diversified; complementary: goes with it")] = "similar",
        k: Annotated[int, Query(ge=1, description="Number of results")] = 10,
    ) -> RecommendResponse:
        """Products similar to, or complementing, a product; each says which relation put it there."""
        return engine.recommend(pid, kind, k)

    @app.post("/compare", response_model=CompareResponse, response_model_exclude_none=False, tags=["products"])
    def compare(req: CompareRequest, engine: EngineDep) -> CompareResponse:
        """Compare 2-5 products by id, or the sides of a text like "nike vs puma running shoes"."""
        if req.ids is not None:
            return engine.compare(req.ids)
        return engine.compare_text(req.text or "")

    @app.get("/facets", response_model=FacetsResponse, tags=["search"])
    def facets(
        engine: EngineDep,
        field: Annotated[list[str] | None, Query(description="category, gender, colour, brand (repeatable)")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    ) -> FacetsResponse:
        """Filter values with product counts, most common first (the UI's filter chips)."""
        return engine.facets(field, limit)

    @app.put("/products/{pid}", tags=["products"], dependencies=[Depends(require_key)])
    def put_product(pid: str, product: Product, engine: EngineDep) -> dict[str, Any]:
        """Create or replace a product (needs X-API-Key). The photo comes as `image_b64`."""
        if product.id != pid:
            raise InvalidInput(f"body id {product.id!r} does not match the path id {pid!r}")
        if product.image and not product.image_b64:
            raise InvalidInput("send the photo as image_b64; the API does not fetch image paths or URLs")
        report = engine.upsert([ProductInput(product)])  # durable (SQLite) when it returns
        if report.failed:
            raise InvalidInput(report.failed[0].reason)
        if settings.snapshot_interval_s == 0:
            engine.save()
        return {"id": pid, "upserted": report.upserted, "unchanged": report.unchanged, "stale": report.stale}

    @app.delete("/products/{pid}", tags=["products"], dependencies=[Depends(require_key)])
    def delete_product(pid: str, engine: EngineDep) -> dict[str, Any]:
        if engine.delete([pid]) == 0:
            raise NotFound("product", pid)
        if settings.snapshot_interval_s == 0:
            engine.save()
        return {"id": pid, "deleted": True}

    @app.get("/images/{key}", tags=["products"], response_class=FileResponse)
    def image(key: str, engine: EngineDep) -> FileResponse:
        try:
            path = engine.image_path(key)
        except StorageError as e:
            raise NotFound("image", key) from e
        return FileResponse(path, headers={"Cache-Control": "public, max-age=31536000, immutable"})

    # -- operations -------------------------------------------------------------------------------
    @app.get("/health", tags=["ops"])
    def health(engine: EngineDep) -> dict[str, Any]:
        return {"status": "ok", "version": __version__, "pid": os.getpid(), **engine.stats(),
                "snapshot": engine.snapshot_version,
                "recovery": engine.recovery, "swaps": engine.swaps[-5:]}

    # -- admin actions (need the API key) ---------------------------------------------------------
    @app.post("/admin/swap", response_model=SwapReport, tags=["admin"], dependencies=[Depends(require_key)],
              responses={409: {"description": "the candidate was refused; the report says why"}})
    def admin_swap(req: SwapRequest, engine: EngineDep) -> SwapReport:
        """Hot swap: load a model version (`adapter`, `model`), index (`index_factory`) or stored
        snapshot (`snapshot`) beside the live one, check it on the canary queries, switch atomically.
        409 with the report when a check fails (the live version keeps serving)."""
        if settings.workers > 1:  # the other worker processes would keep the old model
            raise SwapRefused(f"hot swap switches one process; this API runs {settings.workers} workers. "
                              "Serve with --workers 1 to swap, or restart the workers on the new version.")
        try:
            report = engine.swap(req)
        except SwapRefused:
            metrics.swaps.labels("refused").inc()
            raise
        metrics.swaps.labels("switched" if report.switched else "dry_run").inc()
        return report

    @app.get("/admin/snapshots", tags=["admin"], dependencies=[Depends(require_key)])
    def admin_snapshots(engine: EngineDep) -> dict[str, Any]:
        """Stored snapshot versions (newest first), the one serving, and what start-up recovered."""
        return {"current": engine.snapshot_version, "versions": [v.summary() for v in engine.snapshots.versions()],
                "partial": [p.name for p in engine.snapshots.partials()], "recovery": engine.recovery}

    @app.post("/admin/snapshot", tags=["admin"], dependencies=[Depends(require_key)])
    def admin_snapshot(engine: EngineDep) -> dict[str, Any]:
        """Publish a snapshot version of the indexes now (when they changed since the last one)."""
        saved = engine.save()
        return {"saved": saved, "version": engine.snapshot_version}

    @app.get("/metrics", tags=["ops"], response_class=Response)
    def prometheus() -> Response:
        body, ctype = metrics.render()
        return Response(body, media_type=ctype)

    # -- UI -----------------------------------------------------------------------------------------
    if (STATIC / "index.html").is_file():
        app.mount("/static", StaticFiles(directory=STATIC), name="static")

        @app.get("/", include_in_schema=False)
        def index() -> FileResponse:
            return FileResponse(STATIC / "index.html")

    return app
