"""Products: read, write (with the API key), their photos, recommendations and comparisons."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Query, Response
from fastapi.responses import FileResponse

from vitrine.errors import InvalidInput, NotFound, StorageError
from vitrine.merchandising import patch
from vitrine.search.writes import ProductInput
from vitrine.search.models import CompareRequest, CompareResponse, Product, ProductOut, RecommendResponse
from vitrine.merchandising.patch import PatchReport
from vitrine.web.deps import EngineDep, KeyRequired, SettingsDep
from vitrine.web.errors import errors_for

router = APIRouter(tags=["products"])


@router.get("/products/{pid}", response_model=ProductOut, response_model_exclude_none=True,
            responses=errors_for(404, 503))
def get_product(pid: str, engine: EngineDep, response: Response) -> ProductOut:
    """One product by id. While the shared store is down it comes from this replica's own copy,
    said by ``degraded: ["store"]`` and the headers ``X-Vitrine-Degraded: store`` and
    ``X-Vitrine-Stale-S`` (seconds). A product this copy lacks while the store is down is a 503
    with ``Retry-After`` (it may exist), never a 404."""
    out = engine.get(pid)
    down, stale = engine.store_status()
    if down or out.degraded:  # the store is down, or this one read fell back to the mirror
        response.headers["X-Vitrine-Degraded"] = "store"
        response.headers["X-Vitrine-Stale-S"] = f"{stale:.1f}"
    return out


@router.get("/recommend/{pid}", response_model=RecommendResponse, response_model_exclude_none=True,
            responses=errors_for(404))
def recommend(
    pid: str, engine: EngineDep,
    kind: Annotated[Literal["similar", "complementary"], Query(
        description="similar: same category, nearest, diversified; complementary: goes with it")] = "similar",
    k: Annotated[int, Query(ge=1, description="Number of results")] = 10,
) -> RecommendResponse:
    """Products similar to, or complementing, a product; each says which relation put it there."""
    return engine.recommend(pid, kind, k)


@router.post("/compare", response_model=CompareResponse, response_model_exclude_none=False,
             responses=errors_for(404))
def compare(req: CompareRequest, engine: EngineDep) -> CompareResponse:
    """Compare 2-5 products by id, or the sides of a text like "nike vs puma running shoes"."""
    if req.ids is not None:
        return engine.compare(req.ids)
    return engine.compare_text(req.text or "")


@router.put("/products/{pid}", dependencies=[KeyRequired], responses=errors_for(
    401, ok={"id": "15970", "upserted": 1, "unchanged": 0, "stale": 0}))
def put_product(pid: str, product: Product, engine: EngineDep, settings: SettingsDep) -> dict[str, Any]:
    """Create or replace a product (needs X-API-Key). The photo comes as `image_b64`."""
    if product.id != pid:
        raise InvalidInput(f"body id {product.id!r} does not match the path id {pid!r}")
    if product.image and not product.image_b64:
        raise InvalidInput("send the photo as image_b64; the API does not fetch image paths or URLs")
    report = engine.upsert([ProductInput(product)])  # durable (SQLite) when it returns
    if report.failed:
        raise InvalidInput(report.failed[0].reason)
    if settings.web.snapshot_interval_s == 0:
        engine.save()
    return {"id": pid, "upserted": report.upserted, "unchanged": report.unchanged, "stale": report.stale}


@router.patch("/products/{pid}", response_model=PatchReport, dependencies=[KeyRequired], responses=errors_for(
    401, 404))
def patch_product(pid: str, fields: Annotated[dict[str, Any], Body(openapi_examples={"stock": {
        "summary": "price and stock", "value": {"price": 1999.0, "in_stock": False, "quantity": 0}}})],
        engine: EngineDep, settings: SettingsDep) -> PatchReport:
    """Change some fields of a product (needs X-API-Key): price, stock (`in_stock`, `quantity`),
    attributes (merged; null removes one) or any record field. Nothing is encoded again unless
    the title, brand, category or photo changed (vitrine/merchandising/patch.py)."""
    report = patch.patch_product(engine.writes, pid, fields)
    if report.patched and settings.web.snapshot_interval_s == 0:
        engine.save()
    return report


@router.delete("/products/{pid}", dependencies=[KeyRequired], responses=errors_for(
    401, 404, ok={"id": "15970", "deleted": True}))
def delete_product(pid: str, engine: EngineDep, settings: SettingsDep) -> dict[str, Any]:
    """Delete a product (needs X-API-Key)."""
    if engine.delete([pid]) == 0:
        raise NotFound("product", pid)
    if settings.web.snapshot_interval_s == 0:
        engine.save()
    return {"id": pid, "deleted": True}


@router.get("/images/{key}", response_class=FileResponse, responses=errors_for(
    404, ok="(the photo's bytes)", ok_type="image/jpeg"))
def image(key: str, engine: EngineDep) -> FileResponse:
    """A product photo by its content key (immutable: cached for a year)."""
    try:
        path = engine.image_path(key)
    except StorageError as e:
        raise NotFound("image", key) from e
    return FileResponse(path, headers={"Cache-Control": "public, max-age=31536000, immutable"})
