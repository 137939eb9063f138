"""A/B experiments on ranking (vitrine/experiments/runner.py): start, read, widen, stop. Key needed."""

from __future__ import annotations

import functools

import anyio
from fastapi import APIRouter
from fastapi.responses import JSONResponse

from vitrine.experiments.models import Experiment, ExperimentCreate, ExperimentReport, SplitChange
from vitrine.web.deps import EngineDep, KeyRequired, SideWorkDep
from vitrine.web.errors import errors_for

router = APIRouter(tags=["experiments"], dependencies=[KeyRequired])


@router.post("/experiments", status_code=201, response_model=Experiment, responses=errors_for(401))
async def start_experiment(body: ExperimentCreate, engine: EngineDep) -> JSONResponse:
    """Start an experiment: variants (ranking configurations; the first is the control) and the
    percent of users each gets. Searches with a `user` (else a `session`) are assigned by a hash
    of it, sticky; every worker and replica follows within a second. One runs at a time."""
    exp = await anyio.to_thread.run_sync(engine.experiments.start, body)
    return JSONResponse(exp.model_dump(mode="json"), status_code=201)


@router.get("/experiments", response_model=list[Experiment], responses=errors_for(401))
async def list_experiments(engine: EngineDep) -> list[Experiment]:
    """Every experiment, running and stopped."""
    return await anyio.to_thread.run_sync(functools.partial(engine.experiments.all, fresh=True))


@router.get("/experiments/{name}", response_model=ExperimentReport, responses=errors_for(401, 404))
async def experiment_status(name: str, engine: EngineDep, side: SideWorkDep) -> ExperimentReport:
    """Per variant: searches, users, CTR, add-to-cart rate, conversion, mean reciprocal click rank,
    each with a 95% interval (delta method over users), the comparisons with the control and the
    verdict; for an interleaved experiment, the team-draft wins and their sign test."""
    return await side.run(engine.experiments.status, name)  # a scan of the log (vitrine/web/sidework.py)


async def _split(name: str, body: SplitChange, engine: EngineDep) -> Experiment:
    return await anyio.to_thread.run_sync(engine.experiments.set_split, name, body.split)


@router.patch("/experiments/{name}/split", response_model=Experiment, responses=errors_for(401, 404))
async def patch_split(name: str, body: SplitChange, engine: EngineDep) -> Experiment:
    """Change the split of a running experiment (staged rollout: 95/5, then 90/10, 50/50).
    Widening the last variant only moves users into it."""
    return await _split(name, body, engine)


@router.post("/experiments/{name}/split", response_model=Experiment, responses=errors_for(401, 404))
async def post_split(name: str, body: SplitChange, engine: EngineDep) -> Experiment:
    """The same as `PATCH /v1/experiments/{name}/split`."""
    return await _split(name, body, engine)


@router.post("/experiments/{name}/stop", response_model=Experiment, responses=errors_for(401, 404))
async def stop_experiment(name: str, engine: EngineDep) -> Experiment:
    """Stop it: searches rank as configured again (its log and report stay)."""
    return await anyio.to_thread.run_sync(engine.experiments.stop, name)
