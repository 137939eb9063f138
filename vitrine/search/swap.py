"""Hot swap: a new index snapshot or model version, loaded beside the live one, checked on a
canary query set, then switched atomically (or refused, saying why).

A swap names what changes: another model (``model``/``adapter``/``pretrained``, e.g. another
shipped adapter), another index (``index_factory``), or a stored snapshot version (``snapshot``,
e.g. a previous version to roll back to, or a folder built elsewhere for this record store).

1. **Load beside the live version.** The candidate model is built and every artifact checked
   against its pinned SHA-256 (adapter weights pinned in their config, tower weights in the tower
   config, snapshot files in their manifest): a mismatch refuses the candidate with the file and
   both checksums named. Its vectors come from the snapshot (verified) or from the record store:
   vectors the candidate's model already made are reused; the others are re-embedded from the
   stored texts and photos (backbone features come from the feature cache).
2. **Canary.** ``canary_size`` catalogue products (a fixed, id-hashed sample) give text queries
   (their titles) and photo queries (their photos), plus any ``canary_queries`` file. Live and
   candidate answer each one; the checks:
   - ``complete``: the candidate indexes every live product (nothing lost);
   - ``finite``: every candidate vector is finite and unit-length;
   - ``overlap``: mean overlap@k of the candidate's and the live results;
   - ``agreement``: same model, the mean cosine of candidate and live embeddings (queries and
     products: 1.0 unless something is broken); a new model lives in another space, so the mean
     Spearman correlation of the two models' similarities from each query to the same probe
     products (results of both, plus the canary products);
   - ``recall``: known-item recall@k (a product's own title and photo find it) may not fall more
     than ``swap_max_recall_drop`` below the live one.
   Thresholds are in Settings (``swap_min_overlap``/``swap_min_agreement`` for the same model,
   ``swap_model_min_*`` for a new one).
3. **Switch** under the index state's exclusive lock, after applying the changes written since
   the candidate was built: every search runs wholly on the old version or wholly on the new one.
   The data dir remembers the model (``index/active_model.json``, so a restart serves it) and a
   snapshot of the new version is published. A failed check leaves the live version untouched.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from vitrine.encoders.encoder import MultimodalEncoder
from vitrine.errors import InvalidInput, ModelError, StorageError, SwapRefused
from vitrine.index.records import StoredRow
from vitrine.index.snapshots import Snapshot
from vitrine.index.vectors import VectorIndex, VectorIndexAPI
from vitrine.progress import progress_bar
from vitrine.search.artifacts import (
    ModelSpec,
    model_artifacts,
    verify_artifacts,
    write_active_model,
)
from vitrine.search.models import Product, product_text
from vitrine.search.state import INDEX_FIELDS, IndexState
from vitrine.settings import Settings

log = logging.getLogger(__name__)


class SwapRequest(BaseModel):
    """What to swap in. Unset fields keep the live value."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"adapter": "moe", "dry_run": True}, {"snapshot": "v000012"}]})

    model: str | None = Field(None, max_length=1000, description="Tower config name/folder")
    adapter: str | None = Field(None, max_length=1000, description="Adapter name or folder")
    pretrained: str | None = Field(None, max_length=4096, description="Local CLIP weights file")
    adapter_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$",
                                       description="Expected SHA-256 of the adapter's weights file")
    index_factory: str | None = Field(None, max_length=100, description="FAISS factory of the new index")
    snapshot: str | None = Field(None, max_length=4096,
                                 description="A snapshot version (v00000012) of this data dir, or a snapshot folder")
    dry_run: bool = Field(False, description="Build and check the candidate, but do not switch")


class Check(BaseModel):
    name: str
    passed: bool
    value: float | None = None
    threshold: float | None = None
    detail: str = ""


class SwapReport(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "accepted": True, "switched": True, "dry_run": False, "reason": "every canary check passed",
        "live": {"model_key": "effnet-minilm+mlp"}, "candidate": {"model_key": "effnet-minilm+moe"}}]})

    accepted: bool = Field(description="The candidate passed every check (and, unless dry_run, now serves)")
    switched: bool = False
    dry_run: bool = False
    reason: str
    live: dict[str, Any] = Field(default_factory=dict)
    candidate: dict[str, Any] = Field(default_factory=dict)
    checks: list[Check] = Field(default_factory=list)
    canary: dict[str, Any] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    took_ms: float = 0.0


@dataclass
class Candidate:
    encoder: MultimodalEncoder
    model_key: str
    spec: ModelSpec
    factory: str
    vectors: dict[str, VectorIndexAPI]
    seq: int
    source: str
    artifacts: dict[str, Any] = field(default_factory=dict)
    reembedded: int = 0
    snapshot: str | None = None


# -- building the candidate ---------------------------------------------------------------------------------
def _build_encoder(s: Settings, spec: ModelSpec, adapter_sha256: str | None) -> MultimodalEncoder:
    from vitrine.encoders.adapters import load_adapter

    adapter_obj = load_adapter(spec.adapter, expected_sha256=adapter_sha256) if spec.adapter != "none" else None
    return MultimodalEncoder.create(
        spec.model, adapter_obj, pretrained=spec.pretrained, device=s.encoders.device, image_size=s.encoders.image_size,
        cache_path=s.storage.feature_cache_path, batch_size=s.encoders.encode_batch_size,
        max_image_bytes=s.encoders.max_image_bytes, max_image_pixels=s.encoders.max_image_pixels,
        batch_precision=s.encoders.batch_precision,
    )


def embed_rows(state: IndexState, encoder: MultimodalEncoder, rows: list[StoredRow], *,
               progress: bool = False) -> dict[int, dict[str, np.ndarray | None]]:
    """Vectors of stored products under ``encoder`` (texts from their documents, photos from the
    photo store; backbone features from the feature cache when it has them)."""
    out: dict[int, dict[str, np.ndarray | None]] = {}
    bar: Any = progress_bar(total=len(rows), desc="re-embed", unit="product", enabled=progress and bool(rows))  # tqdm or NoBar
    for s in range(0, len(rows), 2048):
        chunk = rows[s:s + 2048]
        texts = [product_text(Product.model_validate(r.doc)) for r in chunk]
        photos = [state.images.get(r.image_key) if r.image_key else None for r in chunk]
        tf = encoder.text_features(texts)
        imf = np.full((len(chunk), encoder.towers.image_dim), np.nan, dtype=np.float32)
        present = [(i, p) for i, p in enumerate(photos) if p is not None]
        with_img = [i for i, _ in present]
        if with_img:
            errors: dict[int, str] = {}
            imf[with_img] = encoder.shared_image_features([p for _, p in present], errors=errors)
            for j in errors:  # a stored photo that no longer decodes: the product keeps its words
                imf[with_img[j]] = np.nan
        emb = encoder.embed(imf, encoder.shared_text_features(texts, native=tf))
        has_img = np.logical_not(np.isnan(imf).any(axis=1))
        for i, r in enumerate(chunk):
            out[int(r.iid)] = {
                "fused": emb.fused[i],
                "image": emb.image[i] if has_img[i] and emb.image is not None else None,
                "text": emb.text[i] if emb.text is not None else None,
            }
        bar.update(len(chunk))
    bar.close()
    return out


def _apply(vectors: dict[str, VectorIndexAPI], vecs: dict[int, dict[str, np.ndarray | None]], dead: list[int]) -> None:
    for f in INDEX_FIELDS:
        if dead:
            vectors[f].delete(dead)
        have = [(i, vf) for i, v in vecs.items() if (vf := v.get(f)) is not None]
        for s in range(0, len(have), 20_000):
            part = have[s:s + 20_000]
            vectors[f].upsert([i for i, _ in part], np.stack([v for _, v in part]))
        missing = [i for i, v in vecs.items() if v.get(f) is None]
        if missing:
            vectors[f].delete(missing)


def catch_up(state: IndexState, cand: Candidate, *, progress: bool = False) -> int:
    """Bring the candidate's vectors up to the record store: rows changed since ``cand.seq``
    (their stored vectors when the candidate's model made them, else re-embedded)."""
    target = state.records.seq
    rows = list(state.records.iter_rows(since_seq=cand.seq, include_deleted=True))
    if not rows:
        cand.seq = max(cand.seq, target)
        return 0
    dead = [int(r.iid) for r in rows if r.deleted]
    live = [r for r in rows if not r.deleted]
    own = {int(r.iid): dict(r.vectors or {}) for r in live if r.model_key == cand.model_key}
    other = [r for r in live if r.model_key != cand.model_key]
    vecs = dict(own)
    if other:
        vecs.update(embed_rows(state, cand.encoder, other, progress=progress))
        cand.reembedded += len(other)
    _apply(cand.vectors, vecs, dead)
    cand.seq = max(cand.seq, target, max(int(r.seq or 0) for r in rows))
    return len(rows)


def build_candidate(state: IndexState, s: Settings, req: SwapRequest, *, progress: bool = False) -> Candidate:
    """The candidate ``req`` names, loaded beside ``state``'s live version and caught up with its
    record store (``s``: the settings its model and indexes are built with)."""
    live = state.model_spec
    snap: Snapshot | None = None
    if req.snapshot:
        snap = _find_snapshot(state, req.snapshot)
        m = snap.manifest or {}
        spec_d = m.get("model") or {}
        spec = ModelSpec(req.model or spec_d.get("model") or live.model, req.adapter or spec_d.get("adapter") or live.adapter,
                         req.pretrained or spec_d.get("pretrained") or live.pretrained)
        factory = str(m.get("factory") or s.index.index_factory)
        if req.index_factory and req.index_factory != factory:
            raise InvalidInput(f"snapshot {snap.name} holds a {factory} index; do not also ask for {req.index_factory}")
    else:
        spec = ModelSpec(req.model or live.model, req.adapter or live.adapter,
                         req.pretrained if req.pretrained is not None else live.pretrained)
        factory = req.index_factory or s.index.index_factory
    VectorIndex(8, factory)  # refuses an unsupported factory string up front (InvalidInput)
    same_model = spec == live and not req.adapter_sha256
    encoder = state.encoder if same_model else _build_encoder(s, spec, req.adapter_sha256)
    model_key = state.model_key if encoder is state.encoder else encoder.model_key
    artifacts = model_artifacts(spec, encoder, s.intent.intent_model if s.intent.intent else None)
    bad = verify_artifacts(artifacts)
    if bad:
        raise ModelError("artifact checksum mismatch: " + "; ".join(bad))
    seq0 = state.records.seq
    source = f"snapshot {snap.name}" if snap else ("model" if model_key != state.model_key else "index")
    cand = Candidate(encoder, model_key, spec, factory, {}, seq0, source, artifacts, snapshot=snap.name if snap else None)
    new = lambda: VectorIndex(encoder.dim, factory, nprobe=s.index.nprobe, ef_search=s.index.ef_search)  # noqa: E731
    if snap is not None:
        m = snap.manifest or {}
        if m.get("model_key") != model_key:
            raise ModelError(f"snapshot {snap.name} was built by model {m.get('model_key')}, but its model "
                             f"{spec.adapter} now gives {model_key}")
        store = (m.get("records") or {}).get("store_id")
        if store and store != state.store_id:
            raise StorageError(f"snapshot {snap.name} belongs to another record store")
        if int(m.get("seq", 0)) > state.records.seq:
            raise StorageError(f"snapshot {snap.name} is ahead of the record store")
        cand.vectors = {f: VectorIndex.load(snap.file(f"{f}.vidx"), snap.sha256(f"{f}.vidx"),
                                            mmap=s.index.mmap_indexes, auto=factory == "auto", nprobe=s.index.nprobe,
                                            ef_search=s.index.ef_search) for f in INDEX_FIELDS}
        cand.seq = int(m.get("seq", 0))
        catch_up(state, cand, progress=progress)
        return cand
    cand.vectors = {f: new() for f in INDEX_FIELDS}
    if model_key == state.model_key:  # same model, another index: copy the live vectors
        with state.lock.read():
            for f in INDEX_FIELDS:
                ids = state.vectors[f].ids()
                for st in range(0, len(ids), 20_000):
                    part = ids[st:st + 20_000]
                    cand.vectors[f].upsert(part, state.vectors[f].get(part))
            cand.seq = state.seq
        catch_up(state, cand, progress=progress)
        return cand
    rows = list(state.records.iter_rows(with_vectors=True))
    own = {int(r.iid): dict(r.vectors or {}) for r in rows if r.model_key == model_key}
    other = [r for r in rows if r.model_key != model_key]
    vecs = dict(own)
    if other:
        vecs.update(embed_rows(state, encoder, other, progress=progress))
        cand.reembedded = len(other)
    _apply(cand.vectors, vecs, [])
    catch_up(state, cand, progress=progress)
    return cand


def _find_snapshot(state: IndexState, ref: str) -> Snapshot:
    for snap in state.snapshots.versions():
        if snap.name == ref:
            if snap.manifest is None:
                raise StorageError(f"snapshot {ref}: {snap.error}")
            return snap
    p = Path(ref)
    if (p / "manifest.json").is_file():
        try:
            m = json.loads((p / "manifest.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise StorageError(f"snapshot {ref}: manifest unreadable: {e}") from e
        return Snapshot(int(m.get("version", 0) or 0), p, m)
    names = ", ".join(x.name for x in state.snapshots.versions()) or "none"
    raise InvalidInput(f"no snapshot {ref!r}; this data dir holds: {names}")


# -- the canary ------------------------------------------------------------------------------------------
@dataclass
class Canary:
    texts: list[str]
    text_iids: list[int | None]  # the product each text names (None for extra queries)
    photos: list[bytes]
    photo_iids: list[int]


def canary_set(state: IndexState, s: Settings) -> Canary:
    """A fixed sample of the catalogue (by hash of id): titles and photos as queries."""
    rows = sorted(state.records.iter_rows(with_vectors=False),
                  key=lambda r: hashlib.sha256(r.id.encode()).hexdigest())[: s.swap.canary_size]
    c = Canary([], [], [], [])
    for r in rows:
        title = (r.doc or {}).get("title")
        if title:
            c.texts.append(str(title))
            c.text_iids.append(int(r.iid))
        if r.image_key:
            data = state.images.get(r.image_key)
            if data:
                c.photos.append(data)
                c.photo_iids.append(int(r.iid))
    if s.swap.canary_queries:
        try:
            for line in Path(s.swap.canary_queries).read_text(encoding="utf-8").splitlines():
                if line.strip():
                    t = json.loads(line).get("text")
                    if t:
                        c.texts.append(str(t)[: s.search.max_text_chars])
                        c.text_iids.append(None)
        except (OSError, ValueError, AttributeError) as e:
            raise InvalidInput(f"canary_queries {s.swap.canary_queries}: {e}") from e
    return c


def _query_vecs(encoder: MultimodalEncoder, c: Canary) -> tuple[np.ndarray, np.ndarray]:
    tq = encoder.embed(None, encoder.shared_text_features(c.texts)).text if c.texts else None
    pq = encoder.embed(encoder.shared_image_features(c.photos), None).image if c.photos else None
    dim = encoder.dim
    return (tq if tq is not None else np.zeros((0, dim), np.float32),
            pq if pq is not None else np.zeros((0, dim), np.float32))


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 3:
        return 1.0
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float(np.sqrt((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / den) if den else 0.0


def run_canary(state: IndexState, s: Settings, cand: Candidate) -> tuple[list[Check], dict[str, Any]]:
    k = s.swap.canary_k
    c = canary_set(state, s)
    same = cand.model_key == state.model_key
    checks: list[Check] = []
    with state.lock.read():
        live_vecs = state.vectors
        live_t, live_p = _query_vecs(state.encoder, c)
        live_count = len(live_vecs["fused"])
        live_ids = set(live_vecs["fused"].ids().tolist())
        live_res = _results(live_vecs, live_t, live_p, k)
    cand_t, cand_p = _query_vecs(cand.encoder, c)
    cand_res = _results(cand.vectors, cand_t, cand_p, k)
    cand_ids = set(cand.vectors["fused"].ids().tolist())
    missing = live_ids - cand_ids
    checks.append(Check(name="complete", passed=not missing and len(cand_ids) >= live_count,
                        value=float(len(cand_ids)), threshold=float(live_count),
                        detail=f"candidate indexes {len(cand_ids)} products, live {live_count}"
                               + (f"; {len(missing)} live products missing" if missing else "")))
    # finite, unit-length vectors (a sample, and every query vector)
    sample = sorted(cand_ids)[:: max(1, len(cand_ids) // 2000)]
    v = cand.vectors["fused"].get(sample) if sample else np.zeros((0, 1), np.float32)
    qv = np.concatenate([cand_t, cand_p]) if len(cand_t) + len(cand_p) else np.zeros((0, 1), np.float32)
    allv = np.concatenate([v.reshape(-1, v.shape[-1]), qv.reshape(-1, v.shape[-1])]) if len(v) else qv
    finite = bool(np.isfinite(allv).all()) and (len(allv) == 0 or bool(np.allclose(np.linalg.norm(allv, axis=1), 1, atol=1e-3)))
    checks.append(Check(name="finite", passed=finite, detail="candidate vectors are finite and unit-length"
                        if finite else "candidate vectors contain NaN/inf or are not unit-length"))
    # overlap@k
    overlaps = [len(set(a) & set(b)) / max(1, min(k, len(a))) for a, b in zip(live_res["all"], cand_res["all"]) if a]
    ov = float(np.mean(overlaps)) if overlaps else 1.0
    min_ov = s.swap.swap_min_overlap if same else s.swap.swap_model_min_overlap
    checks.append(Check(name="overlap", passed=ov >= min_ov, value=round(ov, 4), threshold=min_ov,
                        detail=f"mean overlap@{k} of candidate and live results over {len(overlaps)} canary queries"))
    # agreement
    if same:
        cos = [float(x) for x in np.sum(live_t * cand_t, axis=1)] + [float(x) for x in np.sum(live_p * cand_p, axis=1)]
        pids = [i for i in c.text_iids if i is not None and i in cand_ids and i in live_ids]
        if pids:
            with state.lock.read():
                lv = state.vectors["fused"].get(pids)
            cos += [float(x) for x in np.sum(lv * cand.vectors["fused"].get(pids), axis=1)]
        ag = float(np.mean(cos)) if cos else 1.0
        min_ag = s.swap.swap_min_agreement
        detail = "mean cosine of candidate and live embeddings (canary queries and products)"
    else:
        rhos = []
        probes_all = {i for i in c.text_iids if i is not None} | set(c.photo_iids)
        with state.lock.read():
            for qi, (kind, row) in enumerate([("t", i) for i in range(len(cand_t))] + [("p", i) for i in range(len(cand_p))]):
                lq, cq = (live_t[row], cand_t[row]) if kind == "t" else (live_p[row], cand_p[row])
                field = "fused" if kind == "t" else "image"
                probes = sorted(({*live_res["all"][qi], *cand_res["all"][qi], *probes_all}) & live_ids & cand_ids
                                & set(state.vectors[field].ids().tolist()) & set(cand.vectors[field].ids().tolist()))
                if len(probes) < 3:
                    continue
                a = state.vectors[field].get(probes) @ lq
                b = cand.vectors[field].get(probes) @ cq
                rhos.append(_spearman(a, b))
        ag = float(np.mean(rhos)) if rhos else 1.0
        min_ag = s.swap.swap_model_min_agreement
        detail = "mean Spearman correlation of live and candidate similarities from each canary query to the probes"
    checks.append(Check(name="agreement", passed=ag >= min_ag, value=round(ag, 4), threshold=min_ag, detail=detail))
    # known-item recall@k
    lr, cr = _recall(live_res, c), _recall(cand_res, c)
    drop = lr - cr
    checks.append(Check(name="recall", passed=drop <= s.swap.swap_max_recall_drop, value=round(cr, 4),
                        threshold=round(lr - s.swap.swap_max_recall_drop, 4),
                        detail=f"known-item recall@{k} (title -> photo): candidate {cr:.3f}, live {lr:.3f}"))
    info = {"text_queries": len(c.texts), "photo_queries": len(c.photos), "k": k, "same_model": same,
            "live_recall": round(lr, 4), "candidate_recall": round(cr, 4)}
    return checks, info


def _results(vectors: dict[str, VectorIndexAPI], tq: np.ndarray, pq: np.ndarray, k: int) -> dict[str, list[list[int]]]:
    out: dict[str, list[list[int]]] = {"text": [], "photo": [], "text_photo": []}
    if len(tq):
        _, ids = vectors["fused"].search(tq, k)
        out["text"] = [[int(i) for i in row if i >= 0] for row in ids]
        _, ids = vectors["image"].search(tq, k)  # words -> photos: the cross-modal alignment itself
        out["text_photo"] = [[int(i) for i in row if i >= 0] for row in ids]
    if len(pq):
        _, ids = vectors["image"].search(pq, k)
        out["photo"] = [[int(i) for i in row if i >= 0] for row in ids]
    out["all"] = out["text"] + out["photo"]
    return out


def _recall(res: dict[str, list[list[int]]], c: Canary) -> float:
    """Known-item recall@k across modalities: a product's title finds its photo. (Same-modality
    self-retrieval proves little: any deterministic model finds a product by its own title.)"""
    photos = set(c.photo_iids)
    hits = [iid in r for iid, r in zip(c.text_iids, res["text_photo"]) if iid is not None and iid in photos]
    return float(np.mean(hits)) if hits else 1.0


# -- the swap -----------------------------------------------------------------------------------------------
_swap_lock = threading.Lock()


class HotSwap:
    """Hot swaps of one index state: ``swap`` builds, checks and (unless a dry run) installs a
    candidate; ``history`` keeps the last 20 tried by this process (newest last; /health).

    ``settings``: what the live version was built with (a switch records the new index factory
    there); ``save``: publishes a snapshot version of the state (the write path's)."""

    def __init__(self, state: IndexState, settings: Settings, save: Callable[[], bool]) -> None:
        self.state, self.settings, self.save = state, settings, save
        self.history: list[dict[str, Any]] = []

    def swap(self, req: SwapRequest, *, progress: bool = False) -> SwapReport:
        """Build, check and (unless ``dry_run``) switch to the candidate. Raises :class:`SwapRefused`
        (with the report) when the candidate cannot be built or fails a check; the live version then
        keeps serving, untouched."""
        t0 = time.perf_counter()
        state = self.state
        live = {"model_key": state.model_key, **state.model_spec.as_dict(),
                "index_factory": self.settings.index.index_factory,
                "products": len(state), "snapshot": state.snapshot_version}
        report = SwapReport(accepted=False, dry_run=req.dry_run, reason="", live=live)
        if not _swap_lock.acquire(blocking=False):
            report.reason = "another swap is running"
            raise SwapRefused(report.reason, report)
        try:
            try:
                cand = build_candidate(state, self.settings, req, progress=progress)
            except (ModelError, StorageError, InvalidInput, OSError, ValueError) as e:
                report.reason = f"candidate refused, still serving {state.model_key}: {e}"
                report.took_ms = round((time.perf_counter() - t0) * 1000, 1)
                log.error("hot swap: %s", report.reason)
                self.record(report)
                raise SwapRefused(report.reason, report) from e
            report.candidate = {"model_key": cand.model_key, **cand.spec.as_dict(), "index_factory": cand.factory,
                                "products": len(cand.vectors["fused"]), "source": cand.source,
                                "snapshot": cand.snapshot, "reembedded": cand.reembedded,
                                "artifacts": cand.artifacts}
            report.checks, report.canary = run_canary(state, self.settings, cand)
            failed = [ch for ch in report.checks if not ch.passed]
            if failed:
                report.reason = "rolled back, still serving the live version: " + "; ".join(
                    f"{ch.name} {ch.value} < {ch.threshold} ({ch.detail})" if ch.value is not None
                    else f"{ch.name}: {ch.detail}" for ch in failed)
                report.took_ms = round((time.perf_counter() - t0) * 1000, 1)
                log.error("hot swap refused: %s", report.reason)
                self.record(report)
                raise SwapRefused(report.reason, report)
            report.accepted = True
            if req.dry_run:
                report.reason = "all checks passed (dry run: not switched)"
            else:
                report.warnings += self.install(cand)
                report.switched = True
                report.reason = "all checks passed; switched"
                report.candidate["products"] = len(state)
            report.took_ms = round((time.perf_counter() - t0) * 1000, 1)
            log.info("hot swap: %s (%s -> %s, %.1fs)", report.reason, live["model_key"], cand.model_key,
                     report.took_ms / 1000)
            self.record(report)
            return report
        finally:
            _swap_lock.release()

    def install(self, cand: Candidate) -> list[str]:
        """Switch to a checked candidate: catch it up with the latest writes, then swap models and
        indexes in one exclusive step; remember the model in the data dir and snapshot it."""
        warnings: list[str] = []
        state = self.state
        with state.write_lock:
            catch_up(state, cand)
            write_active_model(state.data_dir / "index", cand.spec, model_key=cand.model_key,
                               index_factory=cand.factory, source=cand.source)
            with state.lock.write():
                state.swap_in(cand.vectors, cand.encoder, cand.spec, cand.model_key, cand.seq)
                self.settings.index.index_factory = cand.factory
        try:
            self.save()
        except (StorageError, OSError) as e:  # the switch stands; the records still hold every change
            warnings.append(f"switched, but the snapshot of the new version failed: {e}")
            log.error("%s", warnings[-1])
        return warnings

    def record(self, report: SwapReport) -> None:
        self.history.append({"at": time.time(), "accepted": report.accepted, "switched": report.switched,
                             "reason": report.reason, "model_key": report.candidate.get("model_key")})
        del self.history[:-20]
