"""FastAPI service: search, products, photos, health, metrics, and the browser UI.

Every route lives under ``/v1``; the unversioned paths of before are kept as aliases (left out
of the OpenAPI schema, which documents ``/v1``).

:func:`create_app` assembles the API from APIRouter modules (vitrine/web/routes/), their
dependencies (vitrine/web/deps.py), the middleware and the error handlers. Models load in the
lifespan (never at import). Domain errors become HTTP errors here and only here, all in one JSON
shape: ``{"error": {"status", "code", "message", "detail"?}}`` (vitrine/web/errors.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from vitrine import __version__
from vitrine.search.engine import Engine
from vitrine.search.state import LoadedIndexes
from vitrine.settings import Settings
from vitrine.web.errors import install_handlers
from vitrine.web.guards import ContentTypeGuard, RequestTimeout
from vitrine.web.keys import ScopedKeys
from vitrine.web.lifecycle import lifespan_for
from vitrine.web.limits import RateLimit
from vitrine.web.metrics import Metrics
from vitrine.web.middleware import BodyLimit, ObserveRequests
from vitrine.web.routes import ROUTERS

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"
API_PREFIX = "/v1"


def create_app(settings: Settings | None = None, engine: Engine | None = None, *,
               freeze_gc: bool | None = None, loaded: LoadedIndexes | None = None) -> FastAPI:
    """The API. Give ``engine`` to serve an already open one (tests); otherwise the lifespan
    opens ``settings.data_dir`` and loads the models (serving ``loaded``, indexes opened before
    this process was forked, when given: vitrine/web/workers.py). ``freeze_gc`` (default: when the
    app opens its own engine) moves every object alive after warm-up out of the garbage collector's reach."""
    if settings is None:
        settings = engine.settings if engine is not None else Settings()
    metrics = Metrics()
    app = FastAPI(
        title="Vitrine",
        version=__version__,
        description="Multimodal semantic search for e-commerce: words, a photo, or both.",
        lifespan=lifespan_for(settings, engine, metrics, freeze_gc, loaded),
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.keys = keys = ScopedKeys(settings.storage.data_dir)
    app.add_middleware(RequestTimeout, limit_for=lambda path: settings.web.admin_timeout_s
                       if path.startswith(("/admin/", f"{API_PREFIX}/admin/")) else settings.web.request_timeout_s)
    json_paths = ("/search", "/compare", "/products/", "/admin/", "/events", "/experiments")
    app.add_middleware(ContentTypeGuard, json_prefixes=(*json_paths, *(API_PREFIX + p for p in json_paths)),
                       multipart_paths=("/search/image", f"{API_PREFIX}/search/image"))
    if settings.web.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.web.cors_origins, allow_methods=["*"],
                           allow_headers=["*"])
    app.add_middleware(RateLimit, settings=settings, keys=keys)
    app.add_middleware(ObserveRequests, metrics=metrics)
    app.add_middleware(BodyLimit, limit=settings.web.max_body_bytes)
    install_handlers(app)
    for router in ROUTERS:
        app.include_router(router, prefix=API_PREFIX)
        app.include_router(router, include_in_schema=False)  # the unversioned paths: aliases of /v1
    _mount_ui(app)
    return app


def _mount_ui(app: FastAPI) -> None:
    if not (STATIC / "index.html").is_file():
        return
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html")
