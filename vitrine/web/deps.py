"""FastAPI dependencies of the routes: the engine, the settings, the metrics, the side-work thread, the jobs that store events and build analytics, the API key."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi.responses import Response
from pydantic import BaseModel

from vitrine.errors import Unauthorized
from vitrine.search.engine import Engine
from vitrine.settings import Settings
from vitrine.web.metrics import Metrics
from vitrine.web.sideproc import FeedbackJobs
from vitrine.web.sidework import SideWork


# async: FastAPI runs a plain-def dependency in its thread pool, a hand-off per request
async def get_engine(request: Request) -> Engine:
    return request.app.state.engine


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


async def get_side_work(request: Request) -> SideWork:
    return request.app.state.side_work


async def get_feedback_jobs(request: Request) -> FeedbackJobs:
    return request.app.state.feedback_jobs


EngineDep = Annotated[Engine, Depends(get_engine)]
SideWorkDep = Annotated[SideWork, Depends(get_side_work)]
FeedbackJobsDep = Annotated[FeedbackJobs, Depends(get_feedback_jobs)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]


async def require_key(settings: SettingsDep, x_api_key: Annotated[str | None, Header()] = None) -> None:
    """Writes and admin actions: the configured key in ``X-API-Key`` (401 otherwise)."""
    expected = settings.web.api_key.get_secret_value() if settings.web.api_key else None
    if not expected:
        raise Unauthorized("writes are disabled: the server has no API key configured (VITRINE_API_KEY)")
    if not x_api_key or not hmac.compare_digest(x_api_key.encode(), expected.encode()):
        raise Unauthorized("a valid X-API-Key header is required for writes and admin actions")


KeyRequired = Depends(require_key)


def json_response(model: BaseModel) -> Response:
    """An already validated response model as JSON, as ``response_model_exclude_none`` would write
    it, without FastAPI validating it again (a few ms per search)."""
    return Response(model.model_dump_json(exclude_none=True, by_alias=True), media_type="application/json")
