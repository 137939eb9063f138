"""Search-as-you-type suggestions, and what the browser UI needs to know about this catalogue."""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from vitrine.search.suggestions import MAX_K, MAX_PREFIX_CHARS, SuggestResponse
from vitrine.web.deps import EngineDep, SettingsDep
from vitrine.web.errors import errors_for

router = APIRouter(tags=["search"])
EXAMPLES = 6


@router.get("/suggest", response_model=SuggestResponse, responses=errors_for(401, 403, 429))
async def suggest(
    engine: EngineDep,
    q: Annotated[str, Query(max_length=MAX_PREFIX_CHARS, description="What the shopper typed so far (empty: "
                                                                     "representative phrases)")] = "",
    k: Annotated[int, Query(ge=1, le=MAX_K, description="Suggestions wanted")] = 8,
) -> SuggestResponse:
    """Completions of a search box's prefix: popular logged queries that got clicks, and the
    catalogue's titles, categories, brands and facet values; typo tolerant (one edit from 4
    letters, two from 8), Chinese prefixes too. Each says its `kind`; the best come first."""
    return engine.suggest(q, k)  # about 0.1 ms (indexes built at start-up): no thread hand-off


class UIConfig(BaseModel):
    events_key: str | None = Field(None, description="The events-only key the browser posts events with "
                                                     "(VITRINE_EVENTS_KEY; never the write key); null: no events")
    photos: bool = Field(description="Whether the catalogue has photos (false: a text-only page: no photo search, "
                                     "no photo boxes)")
    products: int
    examples: list[str] = Field(description="Example searches for the home page, from the logs and the catalogue")
    language: str = Field("en", description="The catalogue's language as its titles read: zh (at least half of "
                                           "them Chinese) or en; the page's text and examples follow it")


@router.get("/ui/config", response_model=UIConfig, responses=errors_for())
async def ui_config(engine: EngineDep, settings: SettingsDep) -> UIConfig:
    """What the browser UI needs: the events-only key, whether the catalogue has photos, the
    catalogue's language, and example searches made from this catalogue and its logged queries."""
    stats = await anyio.to_thread.run_sync(engine.stats)
    examples = await anyio.to_thread.run_sync(engine.suggest, "", EXAMPLES)
    language = await anyio.to_thread.run_sync(engine.suggestions.language)
    key = settings.web.events_key
    return UIConfig(events_key=key.get_secret_value() if key else None, photos=stats.get("with_photo", 0) > 0,
                    products=stats.get("products", 0), examples=[s.text for s in examples.suggestions],
                    language=language)
